"""Soak: many more crashes than the suite, on demand.  Not run by CI.

    .venv/bin/python benchmarks/soak.py                      # ~100 faults, about 6-8 minutes
    .venv/bin/python benchmarks/soak.py --faults 400 --commands 60000 --seed 7
    .venv/bin/python benchmarks/soak.py --smoke              # one fault of each kind: ~15-30 s

One real nats-server (file storage) in a temporary directory, a scheduler, a projector, and a
steady stream of workload commands (tests/integration/helpers.generate_workload), published
with message ids and retried until acked, as a careful client does.  At random moments one
fault is injected: mostly SIGKILL of the scheduler (a fresh process is started at once), some
SIGKILL of the projector, a few SIGKILL of nats-server itself (restarted on the same store),
and a few full disks: the server's store (`max_file_store`, STORE_LIMIT) is filled by a filler
stream until writes are refused, left full for a few seconds, then freed; the scheduler must
stall, say "disk full", and decide every waiting command once space is back.
All along, a hostile tenant (share delta's pipeline) publishes messages the spec refuses
(tests/reliability/hostile.refused_message: undecodable, out of bounds, just under the 1 MiB
limit, clock attacks, commands about other teams' jobs), one per --hostile-every honest ones.
At the end it checks what the suite checks, and prints a summary:

  - the honest commands' facts equal `replay` of the honest commands alone, at the times the
    stream stamped them (nothing lost, nothing duplicated, even the logical times agree, and
    the hostile messages changed nothing), every command decided once;
  - every hostile message that was stored got exactly one CommandRejected;
  - the projector's DuckDB file equals a clean rebuild of that log.

Exit status 0 when every check holds, 1 otherwise.

--smoke: 500 commands (unless --commands) and 4 faults (unless --faults), the first four one
of each kind in a fixed order (SMOKE_FAULTS) rather than drawn, on a store of 16 MiB
(SMOKE_STORE_LIMIT) so that the disk-full fault fills it in a moment; every check and the
summary as above, in seconds: that the soak runs (`make test`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nats.js.api import StreamConfig  # noqa: E402
from nats.errors import TimeoutError as NatsTimeout  # noqa: E402
from nats.js.errors import APIError  # noqa: E402

from quotasched.services.nats.bus import STORAGE_CODES  # noqa: E402
from quotasched.services.client import Bus  # noqa: E402
from quotasched.services.nats.embedded import EmbeddedServer  # noqa: E402
from quotasched.services.projector.client import wait_for_position  # noqa: E402
from tests.integration.conftest import Process  # noqa: E402
from tests.integration.helpers import (  # noqa: E402
    assert_decided_once,
    assert_same_facts,
    comparable,
    eventually,
    generate_workload,
    holder_of,
    read_facts,
    replayed_as_live,
    wait_decided,
)
from tests.integration.test_projector_live import (  # noqa: E402
    assert_same_tables,
    nats_checksums,
    rebuilt_checksums,
    write_fact_file,
)
from tests.reliability.hostile import refused_message  # noqa: E402
from tests.reliability.support import publish_retrying, publish_until_stored  # noqa: E402


STORE_LIMIT = 256 * 1024 * 1024  # the server's max_file_store: what a disk-full fault fills
SMOKE_STORE_LIMIT = 16 * 1024 * 1024  # --smoke's
SMOKE_FAULTS = ("scheduler SIGKILL", "projector SIGKILL", "disk full", "nats-server SIGKILL")
FILLER = "SOAK_FILLER"


class Soak:
    def __init__(self, root: Path, seed: int, store_limit: int = STORE_LIMIT,
                 order: tuple[str, ...] = ()):  # fmt: skip
        self.root = root
        self.rng = random.Random(seed)
        self.store_limit = store_limit
        self.order = list(order)  # the first faults' kinds, in this order; then drawn
        root.mkdir(parents=True, exist_ok=True)
        conf = root / "nats.conf"
        conf.write_text(f"jetstream {{ max_file_store: {store_limit} }}\n")
        self.server = EmbeddedServer(root / "nats", extra_args=["-c", str(conf)]).start()
        self.env = {**os.environ, "QUOTASCHED_NATS_URL": self.server.url,
                    "QUOTASCHED_TICK_INTERVAL_S": "100000", "QUOTASCHED_LEASE_TTL_S": "2",
                    "QUOTASCHED_PROJECTOR_MAX_BATCH": "50", "QUOTASCHED_PROJECTOR_MAX_WAIT_MS": "0"}
        self.started = 0
        self.faults = {"scheduler SIGKILL": 0, "projector SIGKILL": 0, "nats-server SIGKILL": 0,
                       "disk full": 0}
        self.scheduler = self.spawn("scheduler")
        self.projector = self.spawn("projector", "--db", str(root / "soak.duckdb"))

    def spawn(self, *args: str) -> Process:
        self.started += 1
        return Process(list(args), self.env, self.root / f"{args[0]}-{self.started}.log")

    async def leading(self) -> None:
        async def led():
            return holder_of(self.scheduler)

        await eventually(led, 60, what="a scheduler leading")

    def draw(self) -> str:
        roll = self.rng.random()
        if roll < 0.03:
            return "disk full"
        if roll < 0.07:
            return "nats-server SIGKILL"
        if roll < 0.20:
            return "projector SIGKILL"
        return "scheduler SIGKILL"

    async def inject(self, js) -> str:
        kind = self.order.pop(0) if self.order else self.draw()
        if kind == "disk full":
            await self.fill_and_free(js)
        elif kind == "nats-server SIGKILL":
            self.server.kill()
            await asyncio.sleep(self.rng.uniform(0.2, 1.0))
            self.server.start()
        elif kind == "projector SIGKILL":
            self.projector.kill()
            self.projector.log.close()
            self.projector = self.spawn("projector", "--db", str(self.root / "soak.duckdb"))
        else:
            await self.leading()
            await asyncio.sleep(self.rng.uniform(0.0, 0.8))
            self.scheduler.kill()
            self.scheduler.log.close()
            self.scheduler = self.spawn("scheduler")
        self.faults[kind] += 1
        return kind

    async def fill_and_free(self, js) -> None:
        """Fill the store until the server refuses writes for lack of storage, keep it full
        for a few seconds (commands wait, new ones are refused), then free it."""
        await js.add_stream(StreamConfig(name=FILLER, subjects=["soak.filler"]))
        chunk = b"\0" * ((1 << 20) - 4096)  # under max_payload with the publish headers
        for _ in range(2 * self.store_limit // len(chunk)):
            try:
                await js.publish("soak.filler", chunk, stream=FILLER, timeout=10)
            except APIError as error:
                if error.err_code in STORAGE_CODES:
                    break
                raise
            except (asyncio.TimeoutError, NatsTimeout):  # a full store may answer nothing
                break
        await asyncio.sleep(self.rng.uniform(1.0, 4.0))
        await js.delete_stream(FILLER)

    def disk_full_lines(self) -> int:
        """How many "disk full" errors the scheduler processes logged."""
        return sum(path.read_text(errors="replace").count('"disk full: ')
                   for path in self.root.glob("scheduler-*.log"))  # fmt: skip

    def stop(self) -> None:
        for process in (self.scheduler, self.projector):
            process.stop()
        self.server.stop()


HOSTILE_TEAM = ("fq", "delta")


async def publish_hostile(js, rng: random.Random, items, every: int, published: list[int],
                          stored: dict[int, str], stop: asyncio.Event) -> None:  # fmt: skip
    """One refused-by-construction message per `every` honest commands published, each with a
    message id and retried until stored (a server kill may lose the ack, not the message)."""
    others = [command["jobId"] for command, _ in items if command["kind"] == "SubmitServiceJob"
              and command["quotaShareName"] != HOSTILE_TEAM[1]]  # fmt: skip
    sent = 0
    while not stop.is_set():
        if len(published) < (sent + 1) * every:
            await asyncio.sleep(0.01)
            continue
        kind, subject, payload = refused_message(rng, HOSTILE_TEAM, "alpha", others, 0.01)
        sent += 1
        stored[await publish_until_stored(js, subject, payload, f"hostile-{sent}", 5)] = kind


async def soak(faults: int, commands: int, seed: int, root: Path, hostile_every: int,
               smoke: bool = False) -> bool:  # fmt: skip
    began = time.monotonic()
    items = generate_workload(seed=seed, count=commands)
    run = Soak(root, seed, SMOKE_STORE_LIMIT, SMOKE_FAULTS) if smoke else Soak(root, seed)
    try:
        await run.leading()
        async with Bus(run.server.url) as bus:
            published: list[int] = []
            steady = asyncio.Event()
            steady.set()

            async def pace(index: int) -> None:
                if steady.is_set() and index % 10 == 0:
                    await asyncio.sleep(0.1)

            publisher = asyncio.create_task(publish_retrying(bus.js, items, pace, published))
            hostile: dict[int, str] = {}
            done = asyncio.Event()
            tenant = asyncio.create_task(publish_hostile(
                bus.js, random.Random(seed + 1), items, hostile_every, published, hostile, done))
            for number in range(1, faults + 1):
                kind = await run.inject(bus.js)
                if number % 10 == 0:
                    print(f"  {number} faults ({kind}), {len(published)} commands published",
                          flush=True)  # fmt: skip
                await asyncio.sleep(run.rng.uniform(0.0, 1.5))
            steady.clear()
            seqs = await publisher
            done.set()
            await tenant
            await run.leading()
            last_seq = max(seqs[-1], *hostile) if hostile else seqs[-1]
            await wait_decided(bus.js, last_seq, timeout=300, processes=[run.scheduler])
            facts = await read_facts(bus.js)
            expected = await replayed_as_live(bus.js, items, seqs)
            honest = set(seqs)
            kinds: dict[int, list[str]] = {}
            for fact in facts:
                kinds.setdefault(fact["commandSeq"], []).append(fact["kind"])
            checks = {}
            for name, check in (
                ("honest commands stored once each", lambda: len(honest) == len(items)),
                ("honest facts equal replay of the honest commands alone", lambda: assert_same_facts(
                    [f for f in facts if f["commandSeq"] in honest], expected, drop=(),
                    context="soak:") or True),
                ("every hostile message refused alone", lambda: all(
                    kinds.get(seq) == ["CommandRejected"] for seq in hostile)),
                ("no fact from anything else", lambda: set(kinds) <= honest | set(hostile)),
                ("every command decided once", lambda: assert_decided_once(facts) or True),
            ):  # fmt: skip
                try:
                    checks[name] = bool(check())
                except AssertionError as error:
                    checks[name] = False
                    print(f"FAILED {name}: {error}", flush=True)
            last = len(facts)
            await wait_for_position(bus.nc, last, timeout=300)
            facts_file = root / "facts.jsonl"
            await write_fact_file(bus.js, facts_file)
            rebuilt = rebuilt_checksums(facts_file, root / "rebuilt.duckdb")
            live = await nats_checksums(bus.nc)
            try:
                assert_same_tables(live[1], rebuilt[1], "soak")
                checks["projection equals a clean rebuild"] = live[0] == rebuilt[0] == last
            except AssertionError as error:
                checks["projection equals a clean rebuild"] = False
                print(f"FAILED projection: {error}", flush=True)
    finally:
        run.stop()
    ok = all(checks.values())
    lost = len({f["commandSeq"] for f in expected} - {f["commandSeq"] for f in facts})
    duplicated = len(facts) - len({json.dumps(fact, sort_keys=True)
                                   for fact in comparable(facts, drop=())})  # fmt: skip
    print(f"\nsoak seed {seed}: {sum(run.faults.values())} faults injected "
          + ", ".join(f"{n} {kind}" for kind, n in run.faults.items())
          + f"; {len(items)} honest commands sent; {len(facts)} facts ({len(expected)} from the honest "
          f"commands, as replay gives them, {len(hostile)} refusals of hostile messages); "
          f"commands with facts lost: {lost}; "
          f"duplicated facts: {duplicated}; "
          f"'disk full' errors logged: {run.disk_full_lines()}; "
          f"hostile messages refused: {len(hostile)} "
          f"({', '.join(f'{n} {kind}' for kind, n in Counter(hostile.values()).items())}); "
          f"{time.monotonic() - began:.0f} s")  # fmt: skip
    for name, passed in checks.items():
        print(f"  {'ok  ' if passed else 'FAIL'} {name}")
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--faults", type=int, default=None, help="default 100, smoke 4")
    parser.add_argument("--commands", type=int, default=None, help="default 20000, smoke 500")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--hostile-every", type=int, default=10,
                        help="one hostile message per this many honest commands")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument("--smoke", action="store_true",
                        help="500 commands, one fault of each kind, a 16 MiB store: that it runs "
                             "(make test)")  # fmt: skip
    args = parser.parse_args()
    faults = args.faults if args.faults is not None else 4 if args.smoke else 100
    commands = args.commands if args.commands is not None else 500 if args.smoke else 20_000
    root = Path(tempfile.mkdtemp(prefix="quotasched-soak-"))
    ok = asyncio.run(soak(faults, commands, args.seed, root, args.hostile_every, args.smoke))
    if args.keep:
        print(f"logs and stores kept in {root}")
    else:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
