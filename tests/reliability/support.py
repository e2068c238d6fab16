"""Small helpers of the reliability tests (everything talks to a real nats-server)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from nats.js.api import ConsumerConfig, DeliverPolicy


async def read_stream(js, stream: str, subject: str) -> list[tuple[int, dict[str, Any] | None]]:
    """(stream seq, JSON object or None when undecodable) of every message of `stream` on
    `subject`, read with an ordered consumer up to the stream's last sequence at the call."""
    info = await js.stream_info(stream)
    end = info.state.last_seq
    out: list[tuple[int, dict[str, Any] | None]] = []
    if info.state.messages == 0:
        return out
    done = asyncio.Event()

    async def deliver(msg) -> None:
        seq = msg.metadata.sequence.stream
        try:
            out.append((seq, json.loads(msg.data)))
        except ValueError:
            out.append((seq, None))
        if seq >= end:
            done.set()

    sub = await js.subscribe(subject, cb=deliver, ordered_consumer=True, stream=stream,
                             config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL))  # fmt: skip
    try:
        # the last message may be on another subject: stop once nothing came for a second
        while not done.is_set():
            before = len(out)
            try:
                await asyncio.wait_for(done.wait(), 1.0)
            except (asyncio.TimeoutError, TimeoutError):
                if len(out) == before:
                    break
    finally:
        await sub.unsubscribe()
    return out


async def publish_retrying(js, items, pace=None, published: list[int] | None = None,
                           prefix: str = "w") -> list[int]:  # fmt: skip
    """Publish workload items (command, route) the way a careful client does when the broker
    may be down: each with a message id (`<prefix>-<index>`), retried until JetStream acks it.
    A retry of a command that was stored after all is recognised by the stream's duplicate
    window and acked with the first one's sequence, so each command is stored once."""
    from quotasched.events.subjects import COMMANDS_STREAM, subject_for_command
    from quotasched.services.client.commands import as_command as _as_command

    seqs = published if published is not None else []
    for index, (command, route) in enumerate(items):
        if pace is not None:
            await pace(index)
        decoded, data = _as_command(command)
        subject = subject_for_command(decoded, route)
        seqs.append(await publish_until_stored(js, subject, data, f"{prefix}-{index}"))
    return seqs


async def publish_until_stored(js, subject: str, data: bytes, message_id: str,
                               timeout: float = 2.0) -> int:  # fmt: skip
    """Publish one message on the command stream with a message id, retried until JetStream
    acks it; its stream sequence (the first one's, if a retry was a duplicate)."""
    from quotasched.events.subjects import COMMANDS_STREAM

    while True:
        try:
            ack = await js.publish(subject, data, stream=COMMANDS_STREAM, timeout=timeout,
                                   headers={"Nats-Msg-Id": message_id})  # fmt: skip
            return ack.seq
        except Exception:  # the broker is restarting, full or a node is gone: try again
            await asyncio.sleep(0.2)


# -- the hostile job class (hostile_job.sh), shared by its test and its soak -----------------

HOSTILE_JOB = Path(__file__).with_name("hostile_job.sh")


def hostile_job_folder() -> tuple[Path, Path, Path]:
    """(folder, script, reports): a folder every user may reach (pytest's tmp_path is root's
    0700; a job may run as `nobody`), sticky and world-writable like /tmp, holding a copy of
    hostile_job.sh and the folder its reports go to.  The caller removes it."""
    folder = Path(tempfile.mkdtemp(prefix="quotasched-hostile-", dir="/tmp"))
    os.chmod(folder, 0o1777)
    script = folder / "hostile_job.sh"
    shutil.copy(HOSTILE_JOB, script)
    os.chmod(script, 0o755)
    reports = folder / "reports"
    reports.mkdir()
    os.chmod(reports, 0o1777)
    return folder, script, reports


def escaped_children(report_dir: Path) -> list[int]:
    """The pids of the `setsid` child and the daemon a hostile attempt started (its report
    folder's setsid.pid and daemon.pid), those it had time to write."""
    pids = []
    for name in ("setsid.pid", "daemon.pid"):
        path = report_dir / name
        if path.is_file() and path.read_text().strip().isdigit():
            pids.append(int(path.read_text()))
    return pids


def sleeper_alive(pid: int) -> bool:
    """The hostile job's `sleep` still runs as `pid` (not a zombie, not a reused pid)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return b"sleep 60" in cmdline.replace(b"\0", b" ") and state != "Z"
