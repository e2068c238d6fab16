"""Every JetStream API verb (and the server-level subjects) each role of `quotasched auth
generate` could try, against a real nats-server started with the generated configuration:
exactly the allowed set gets an answer, everything else is refused by the server.

A probe is a request with a reply subject in the role's own inbox.  The server answers a
forbidden publish or subscription with a "Permissions Violation" naming the subject and drops
it; an allowed one reaches JetStream (or nobody) and gets a reply: an API answer, often an
error about the empty body, or a "no responders" status.  Bodies are `{}` (or a pull request
that does not wait) so an allowed verb changes nothing; the admin, allowed everything, tries
its verbs on streams that do not exist.
"""

from __future__ import annotations

import asyncio
import json

import nats
import pytest

from quotasched.events.subjects import COMMANDS_STREAM, FACTS_STREAM
from quotasched.services.nats.credentials import connect_options
from quotasched.services.config.auth import CONSUMER_SLOTS, read_credentials
from quotasched.services.nats.embedded import EmbeddedServer
from tests.integration.helpers import eventually
from tests.reliability.test_permissions import generated  # noqa: F401 (the generated config)

pytestmark = pytest.mark.nats

STREAMS = (COMMANDS_STREAM, FACTS_STREAM, "KV_QM_LEASES", "OBJ_QM_SNAPSHOTS")
TEAM = "pipeline-q-qs1"
OWN_FILTER = "qm.fact.q.qs1.*"
NO_WAIT = b'{"batch": 1, "no_wait": true}'

STREAM_VERBS = ("STREAM.CREATE", "STREAM.UPDATE", "STREAM.DELETE", "STREAM.PURGE",
                "STREAM.MSG.DELETE", "STREAM.MSG.GET", "STREAM.INFO", "STREAM.SNAPSHOT",
                "STREAM.RESTORE", "STREAM.LEADER.STEPDOWN", "STREAM.PEER.REMOVE", "DIRECT.GET",
                "CONSUMER.CREATE", "CONSUMER.LIST", "CONSUMER.NAMES")  # fmt: skip
CONSUMER_VERBS = ("CONSUMER.DURABLE.CREATE", "CONSUMER.INFO", "CONSUMER.DELETE",
                  "CONSUMER.MSG.NEXT", "CONSUMER.PAUSE", "CONSUMER.UNPIN",
                  "CONSUMER.LEADER.STEPDOWN")  # fmt: skip
GLOBAL = ("$JS.API.INFO", "$JS.API.STREAM.NAMES", "$JS.API.STREAM.LIST",
          "$JS.API.META.LEADER.STEPDOWN", "$JS.API.SERVER.REMOVE", "$JS.API.ACCOUNT.PURGE.$G",
          "$JS.API.STREAM.CREATE.OTHER", "$JS.API.STREAM.CREATE.KV_MINE",
          "$JS.API.STREAM.CREATE.OBJ_MINE", "$SYS.REQ.SERVER.PING", "$SYS.REQ.ACCOUNT.$G.CONNZ",
          "$KV.QM_LEASES.main", "$O.QM_SNAPSHOTS.M.probe", "$KV.MINE.key")  # fmt: skip
SUBSCRIPTIONS = ("$SYS.>", "qm.fact.>", "qm.cmd.>", "$JS.EVENT.>", "$JS.API.>",
                 "_INBOX_executor.>", "$KV.QM_LEASES.>", "qm.in.>")  # fmt: skip


def probes(role: str) -> list[str]:
    """Every subject `role` tries (the consumers: the executor's, the scheduler's, one of
    this team's own slots, and one past the slots); acks first (see try_everything)."""
    subjects = [f"$JS.ACK.{FACTS_STREAM}.executor-simulated.1.1.1.1.0",
                f"$JS.ACK.{FACTS_STREAM}.{TEAM}-0.1.1.1.1.0",
                f"$JS.ACK.{COMMANDS_STREAM}.scheduler-main.1.1.1.1.0", *GLOBAL]
    for stream in STREAMS:
        subjects += [f"$JS.API.{verb}.{stream}" for verb in STREAM_VERBS]
    subjects.append(f"$JS.API.DIRECT.GET.KV_QM_LEASES.$KV.QM_LEASES.main")
    consumers = [(FACTS_STREAM, "executor-simulated"), (COMMANDS_STREAM, "scheduler-main"),
                 (FACTS_STREAM, f"{TEAM}-0"), (FACTS_STREAM, f"{TEAM}-{CONSUMER_SLOTS}")]
    for stream, name in consumers:
        subjects += [f"$JS.API.{verb}.{stream}.{name}" for verb in CONSUMER_VERBS]
        subjects += [f"$JS.API.CONSUMER.CREATE.{stream}.{name}",
                     f"$JS.API.CONSUMER.CREATE.{stream}.{name}.{OWN_FILTER}",
                     f"$JS.API.CONSUMER.CREATE.{stream}.{name}.qm.fact.>"]
    return sorted(subjects, key=lambda subject: not silent(subject))  # stable: silent first


def silent(subject: str) -> bool:
    """Probes that get no answer even when allowed (acks; system-account verbs on a server
    without one; a pull from a consumer that does not exist; a direct get with an empty
    body): only a refusal says anything, and the server sends it before it reads the
    next probe, so these go first and the others' answers come after their refusals."""
    return (subject.startswith(("$JS.ACK.", "$SYS.")) or ".MSG.NEXT." in subject
            or subject.startswith("$JS.API.DIRECT.GET.")
            or subject.removeprefix("$JS.API.").startswith(("META.", "SERVER.", "ACCOUNT.")))


def js(*verbs: str) -> set[str]:
    return {f"$JS.API.{verb}" for verb in verbs}


def started() -> set[str]:
    return js("INFO", *(f"STREAM.INFO.{stream}" for stream in STREAMS))


def log_reader(stream: str) -> set[str]:
    return js(f"CONSUMER.CREATE.{stream}", f"STREAM.MSG.GET.{stream}", f"DIRECT.GET.{stream}")


def scheduler_allowed() -> set[str]:
    allowed = started() | js("STREAM.NAMES", f"STREAM.PURGE.OBJ_QM_SNAPSHOTS",
                             "DIRECT.GET.KV_QM_LEASES.$KV.QM_LEASES.main",
                             "CONSUMER.DELETE.QM_COMMANDS.scheduler-main")  # fmt: skip
    allowed |= {"$KV.QM_LEASES.main", "$O.QM_SNAPSHOTS.M.probe",
                "$JS.ACK.QM_COMMANDS.scheduler-main.1.1.1.1.0",
                "$JS.ACK.QM_FACTS.executor-simulated.1.1.1.1.0",
                f"$JS.ACK.QM_FACTS.{TEAM}-0.1.1.1.1.0"}  # fmt: skip
    for stream in STREAMS:
        allowed |= log_reader(stream) | js(f"STREAM.CREATE.{stream}", f"STREAM.UPDATE.{stream}",
                                           f"CONSUMER.LIST.{stream}", f"CONSUMER.NAMES.{stream}")
    for stream, name in ((FACTS_STREAM, "executor-simulated"), (COMMANDS_STREAM, "scheduler-main"),
                         (FACTS_STREAM, f"{TEAM}-0"), (FACTS_STREAM, f"{TEAM}-{CONSUMER_SLOTS}")):
        allowed |= js(f"CONSUMER.DURABLE.CREATE.{stream}.{name}", f"CONSUMER.INFO.{stream}.{name}",
                      f"CONSUMER.MSG.NEXT.{stream}.{name}", f"CONSUMER.CREATE.{stream}.{name}",
                      f"CONSUMER.CREATE.{stream}.{name}.{OWN_FILTER}",
                      f"CONSUMER.CREATE.{stream}.{name}.qm.fact.>")  # fmt: skip
    return allowed


def executor_allowed() -> set[str]:
    """Any consumer name on the fact log but the teams' slots (denied by name)."""
    return started() | log_reader(FACTS_STREAM) | js(
        "CONSUMER.DURABLE.CREATE.QM_FACTS.executor-simulated",
        "CONSUMER.INFO.QM_FACTS.executor-simulated",
        "CONSUMER.DELETE.QM_FACTS.executor-simulated",  # to restore it when it was changed
        f"CONSUMER.DURABLE.CREATE.QM_FACTS.{TEAM}-{CONSUMER_SLOTS}",
        f"CONSUMER.INFO.QM_FACTS.{TEAM}-{CONSUMER_SLOTS}",
        f"CONSUMER.DELETE.QM_FACTS.{TEAM}-{CONSUMER_SLOTS}",
    ) | {"$JS.ACK.QM_FACTS.executor-simulated.1.1.1.1.0"}


def team_allowed() -> set[str]:
    """Its own slot only, and only with its own share's filter in the subject."""
    own = f"{TEAM}-0"
    return js("INFO", "STREAM.INFO.QM_FACTS", f"CONSUMER.CREATE.QM_FACTS.{own}.{OWN_FILTER}",
              f"CONSUMER.INFO.QM_FACTS.{own}", f"CONSUMER.DELETE.QM_FACTS.{own}",
              f"CONSUMER.MSG.NEXT.QM_FACTS.{own}") | {f"$JS.ACK.QM_FACTS.{own}.1.1.1.1.0"}


ALLOWED = {  # role: (allowed publishes among probes(role), allowed subscriptions)
    "scheduler": (scheduler_allowed, {"$KV.QM_LEASES.>"}),
    "projector": (lambda: started() | log_reader(FACTS_STREAM), set()),
    "executor": (executor_allowed, {"_INBOX_executor.>"}),  # its own inbox
    "agent": (executor_allowed, set()),  # and its fleet's bucket, which no probe names
    # the teams' commands (no team may read them: it could answer in the gate's place)
    "gate": (lambda: started() | log_reader(FACTS_STREAM), {"qm.in.>"}),
    TEAM: (team_allowed, set()),
    "pipeline-q-qs2": (lambda: js("INFO", "STREAM.INFO.QM_FACTS"), set()),
    "admin": (lambda: set(admin_probes()), set(SUBSCRIPTIONS)),
}


def admin_probes() -> list[str]:
    """The same verbs on streams and buckets that do not exist: the admin may do everything,
    so its probes must not delete the streams the other probes need."""
    return [subject.replace("QM_", "SCRATCH_") for subject in probes("admin")]


@pytest.fixture(scope="module")
def server_and_creds(tmp_path_factory, generated):
    out = generated
    server = EmbeddedServer(tmp_path_factory.mktemp("table"),
                            extra_args=["-c", str(out / "nats-server.conf")]).start()
    creds = {path.stem: {**read_credentials(path), "url": server.url}
             for path in (out / "creds").iterdir()}  # fmt: skip
    asyncio.run(_create_streams(creds["scheduler"]))
    yield server, creds
    server.stop()


async def _create_streams(env: dict[str, str]) -> None:
    """The streams and buckets, as the scheduler makes them at its start."""
    from quotasched.services.nats.bus import ensure_streams
    from quotasched.services.settings import Settings

    nc = await nats.connect(env["url"], **connect_options(env))
    try:
        await ensure_streams(nc.jetstream(), Settings())
    finally:
        await nc.close()


async def try_everything(env: dict[str, str], subjects: list[str]) -> tuple[set[str], set[str]]:
    """(publishes refused, subscriptions refused) for every probe of one role."""
    errors: list[str] = []

    async def on_error(error: Exception) -> None:
        errors.append(str(error))

    nc = await nats.connect(env["url"], error_cb=on_error, allow_reconnect=False,
                            **connect_options(env))  # fmt: skip
    try:
        replied: set[int] = set()
        prefix = f"{env['QUOTASCHED_NATS_INBOX_PREFIX']}.probe"

        async def on_reply(msg) -> None:
            replied.add(int(msg.subject.rsplit(".", 1)[1]))

        await nc.subscribe(f"{prefix}.*", cb=on_reply)
        for subject in SUBSCRIPTIONS:
            await nc.subscribe(subject)
        for index, subject in enumerate(subjects):
            body = NO_WAIT if ".MSG.NEXT." in subject else b"{}"
            await nc.publish(subject, body, reply=f"{prefix}.{index}")
        await nc.flush()

        def refused(kind: str, subject: str) -> bool:
            needle = f'permissions violation for {kind} to "{subject.lower()}"'
            return any(needle in error.lower() for error in errors)

        def unsettled() -> list[str]:
            return [subject for index, subject in enumerate(subjects) if index not in replied
                    and not refused("publish", subject) and not silent(subject)]

        async def settled():  # every probe answered, or refused by the server
            return not unsettled()

        try:
            await eventually(settled, 30, interval=0.05, what="every probe settled")
        except AssertionError as error:
            raise AssertionError(f"{error}; neither answered nor refused: {unsettled()}") from None
        await nc.flush()
        return ({subject for subject in subjects if refused("publish", subject)},
                {subject for subject in SUBSCRIPTIONS if refused("subscription", subject)})
    finally:
        await nc.close()


@pytest.mark.parametrize("role", list(ALLOWED))
async def test_each_role_may_use_exactly_its_jetstream_verbs(server_and_creds, role):
    _, creds = server_and_creds
    subjects = admin_probes() if role == "admin" else probes(role)
    allowed_publish, allowed_subscribe = ALLOWED[role]
    refused_publish, refused_subscribe = await try_everything(creds[role], subjects)
    assert sorted(set(subjects) - refused_publish) == sorted(allowed_publish())
    assert sorted(set(SUBSCRIPTIONS) - refused_subscribe) == sorted(allowed_subscribe)
