"""A fact an executor cannot read is logged, acked and skipped (services/executors/app.py), on a
real nats-server: the executor's subscriber decodes what it reads into the contract's models
(events/facts.py), only for the kinds it uses; one that is not valid gets one error line with
its stream sequence and why, is acked like any other, and the facts after it run.  Catching up
after a restart (`catch_up`) skips it the same way."""

from __future__ import annotations

import json

import nats
import pytest
from faststream.nats import NatsBroker

from quotasched.events.codec import encode_bytes
from quotasched.events.subjects import FACTS_STREAM
from quotasched.services.executors import app
from quotasched.services.nats.bus import ensure_streams
from quotasched.services.nats.credentials import broker_options
from quotasched.services.settings import Settings
from tests.executor_facts import dispatched, submitted
from tests.integration.helpers import eventually
from tests.unit.test_executor_facts import Lines

pytestmark = [pytest.mark.nats]

SUBJECT = "qm.fact.q.qs1.{}"
TAGS = {"duration": "1"}


async def test_an_invalid_fact_is_logged_acked_and_skipped_and_the_next_ones_run(
        nats_server, monkeypatch, tmp_path):  # fmt: skip
    lines = Lines()
    monkeypatch.setattr(app, "log", lines)
    nc = await nats.connect(nats_server.url)
    js = nc.jetstream()
    await ensure_streams(js, Settings())
    reports: list[tuple[str, int, str]] = []

    async def heard(message) -> None:
        command = json.loads(message.data)
        reports.append((command["jobId"], command["attempt"], command["status"]))

    await nc.subscribe("qm.cmd.q.qs1.ReportJobStatus", cb=heard)
    log = [  # (subject's kind, bytes)
        ("JobSubmitted", encode_bytes(submitted("broken", TAGS))),
        ("JobDispatched", b'{"kind": "JobDispatched", "at": 1.0, "commandSeq": 2, '
                          b'"jobId": "broken", "attempt": 1}'),  # no queue, share, usage...
        ("JobPreempted", b"\xff\xfe not a fact\n"),
        ("CommandRejected", b"not read: not a kind an executor uses"),
        ("JobSubmitted", encode_bytes(submitted("good", TAGS))),
        ("JobDispatched", encode_bytes(dispatched("good"))),
    ]
    for kind, data in log:
        await js.publish(SUBJECT.format(kind), data, stream=FACTS_STREAM)
    last = len(log)

    executor = first = None
    broker = NatsBroker(nats_server.url, logger=None, **broker_options())
    try:
        first = app.build_executor(broker, "simulated", speed=100.0, state_dir=str(tmp_path))
        assert await app.catch_up(js, first) == 0  # a new consumer
        await broker.start()
        await first.watch.first_look()
        await first.recover()

        async def good_ended() -> bool:
            return ("good", 1, "SUCCEEDED") in reports

        await eventually(good_ended, 30, what="the good job SUCCEEDED")
        await eventually(lambda: _acked(js, first.consumer, last), 30, what="every fact acked")
        assert first.handled_seq == last
        assert [job for job, _, _ in reports].count("broken") == 0
        errors = [fields for level, _, fields in lines.lines if level == "error"]
        assert [(fields["seq"], fields["subject"]) for fields in errors] == [
            (2, SUBJECT.format("JobDispatched")), (3, SUBJECT.format("JobPreempted"))]
        assert all("\n" not in fields["error"] for fields in errors)
        assert "JobDispatched.jobQueue: Field required" in errors[0]["error"]
        assert "Invalid JSON" in errors[1]["error"]
        await first.close()
        first = None
        await broker.stop()

        # The next executor of the same name catches up on what that consumer was delivered:
        # the invalid JobPreempted (a kind it learns from) is logged and skipped again.
        lines.lines.clear()
        executor = app.build_executor(NatsBroker(nats_server.url, logger=None), "simulated",
                                      state_dir=str(tmp_path))  # fmt: skip
        assert await app.catch_up(js, executor) == last
        assert sorted(executor.specs) == ["broken", "good"]
        assert [fields["seq"] for level, _, fields in lines.lines if level == "error"] == [3]
    finally:
        for running in (first, executor):
            if running is not None:
                await running.close()
        await broker.stop()
        await nc.close()


async def _acked(js, consumer: str, through: int) -> bool:
    info = await js.consumer_info(FACTS_STREAM, consumer)
    return info.ack_floor.stream_seq >= through and info.num_ack_pending == 0
