"""The fact appender's chain when an ack comes late.

Found in a fresh-clone run of test_broker_faults (the fact log's leader killed under load):
one command's fact never reached the log while the next one's did.  An append waits for the
previous one's ack before it is sent; when that wait ran out, the append handed back the
previous append's own future.  The ack came a little later, resolved it, and the append that
was never sent passed for stored: its commands were acked, and the next append, fenced where
the late one ended, was stored after the gap.  Here the late ack is real: the server is
paused (SIGSTOP) while an append is in flight, for longer than the appender waits."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from quotasched.events.subjects import FACTS_STREAM, fact_subject
from quotasched.services.client import Bus
from quotasched.services.nats.bus import FactAppender, ensure_streams
from quotasched.services.nats.log import ALL_FACTS
from quotasched.services.settings import Settings

pytestmark = pytest.mark.nats


def message(n: int) -> tuple[str, bytes, dict[str, str]]:
    subject = fact_subject("JobSubmitted", "fq", "alpha")
    return subject, b'{"n": %d}' % n, {"Nats-Msg-Id": f"t:{n}:0"}


async def pause(pid: int) -> None:
    """SIGSTOP `pid` and wait until every one of its threads has stopped: a group stop is not
    atomic, and on a loaded machine a thread of nats-server still running could answer the
    append this test means to leave unanswered (seen once in CI)."""
    os.kill(pid, signal.SIGSTOP)
    for _ in range(500):
        states = []
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                stat = (task / "stat").read_text()
            except FileNotFoundError:  # a thread that ended meanwhile
                continue
            states.append(stat.rsplit(")", 1)[1].split()[0])
        if states and all(state in "Tt" for state in states):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"nats-server {pid} did not stop: thread states {states}")


async def stored(js) -> list[bytes]:
    info = await js.stream_info(FACTS_STREAM)
    return [(await js.get_msg(FACTS_STREAM, seq)).data for seq in range(1, info.state.last_seq + 1)]


async def test_an_append_sent_after_a_late_ack_never_passes_for_stored(nats_server):
    async with Bus(nats_server.url) as bus:
        await ensure_streams(bus.js, Settings())
        # shared: each append waits for the previous one's ack (as on a replicated stream)
        appender = await FactAppender(bus.nc, ALL_FACTS, 0, shared=True).start()
        appender.wait_previous_s = 1.0
        try:
            (first,) = await appender.append([message(1)])
            assert await asyncio.wait_for(first, 5) == 1

            await pause(nats_server.process.pid)
            try:
                (late,) = await appender.append([message(2)])  # sent; the ack waits
                (unsent,) = await appender.append([message(3)])  # the wait runs out
            finally:
                os.kill(nats_server.process.pid, signal.SIGCONT)
            assert await asyncio.wait_for(late, 10) == 2  # the late ack resolves it
            (after,) = await appender.append([message(4)])  # the chain stays broken

            for future in (unsent, after):
                assert future.done()
                with pytest.raises(TimeoutError, match="unanswered after 1 s; nothing after it"):
                    future.result()
            await asyncio.sleep(0.5)  # anything sent by mistake would be stored by now
            assert await stored(bus.js) == [b'{"n": 1}', b'{"n": 2}']
        finally:
            await appender.close()


async def test_a_pipelined_append_is_stored_as_sent_whether_its_frames_are_built_here_or_by_nats_py(nats_server):
    """The writer's frames (natsfix.hpub_frame) and nats-py's own publish, mixed in one append
    (a header value with surrounding spaces is not plain and goes through nats-py): every
    message stored in order, with the headers it was given and the fence the appender set."""
    async with Bus(nats_server.url) as bus:
        await ensure_streams(bus.js, Settings())
        appender = await FactAppender(bus.nc, ALL_FACTS, 0).start()
        batch = [message(n) for n in range(1, 6)]
        batch[2][2]["Qm-Note"] = " padded "  # nats-py strips it; so must the stored header
        [future] = await appender.append(batch)
        assert await asyncio.wait_for(future, 10) == 5
        [future] = await appender.append([message(6)])
        assert await asyncio.wait_for(future, 10) == 6
        for seq in range(1, 7):
            stored_message = await bus.js.get_msg(FACTS_STREAM, seq)
            assert stored_message.data == b'{"n": %d}' % seq
            headers = stored_message.headers
            assert headers["Nats-Msg-Id"] == f"t:{seq}:0"
            assert headers["Nats-Expected-Last-Subject-Sequence"] == str(seq - 1)
            assert headers["Nats-Expected-Last-Subject-Sequence-Subject"] == ALL_FACTS
            assert headers.get("Qm-Note") == ("padded" if seq == 3 else None)
        await appender.close()
