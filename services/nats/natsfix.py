"""A faster, equivalent header parser for nats-py 2.16 (installed by services.nats.bus on import).

nats-py parses the header block of every message it receives in Python, and checks each header
*name* for whitespace one character at a time in a generator expression.  Every fact carries
four headers (`Nats-Msg-Id`, `Qm-Facts` and the two `Nats-Expected-Last-Subject-Sequence*`
fencing headers, which the server stores with the message), about 100 characters of names: that
check alone was a third of the cost of reading the fact log (profiled in a restart: 4.3 s of
10.8 s for 118k facts).  Everything that reads facts pays it: recovery, the projector, the
executors.

`parse_header_lines` keeps nats-py's rules exactly (split on CRLF, skip lines without a colon,
names stripped and ASCII-only, names containing whitespace skipped, values stripped and decoded
as UTF-8 with replacement); tests/unit/test_natsfix.py checks it against the original on
generated header blocks.  Only the whitespace test changes: `str.split()` splits on exactly the
characters `str.isspace()` accepts, in C.  A block that is all ASCII (every fact's) is decoded
once, and each header name's checks are remembered: 1.1 µs for a fact's four headers instead
of 1.8 µs (timeit, best of 7, 2026-12-04).

`publish_all` is the other direction, for the scheduler's writer: nats-py encodes a message's
headers one name at a time (a regular expression, a strip, a translate and two encodes per
header), about 8 µs for a fact's four headers, a sixth of the writer's whole cost per command
(live_bench, 2026-12-04).  `hpub_frame` builds the very bytes nats-py's `_send_publish` would
hand to its outbound buffer, with one format per header, for messages whose subjects and
headers are plain (what the writer's always are: token names, values without CR/LF or
surrounding whitespace); anything else, and any state of the connection but connected,
goes through `Client.publish` unchanged.  tests/unit/test_natsfix.py checks the frames
against nats-py's own on generated subjects, headers and payloads.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from nats.aio.client import _HEADER_KEY_RE, _SUBJECT_INVALID_RE, Client
from nats.aio.subscription import Subscription
from nats.protocol.parser import AWAITING_CONTROL_LINE, AWAITING_MSG_PAYLOAD, Parser

_CRLF = b"\r\n"
ORIGINAL = Client._parse_header_lines


_BYTES_SPACE = " \t\n\r\x0b\x0c"  # what bytes.strip() strips (str.strip() strips \x1c-\x1f too)
_NAMES: dict[str, str] = {}  # raw header name -> its key, for names found to be tokens
_MOST_CHECKED = 65_536  # entries of each cache of checked names and subjects


def parse_header_lines(raw: bytes) -> dict[str, str]:
    """nats-py's header lines, parsed: an all-ASCII block at once, anything else line by line
    (`_parse_lines`), with nats-py's rules either way."""
    if not raw.isascii():
        return _parse_lines(raw)
    out: dict[str, str] = {}
    names = _NAMES
    for line in raw.decode("ascii").split("\r\n"):
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            continue
        key = names.get(name)
        if key is None:
            key = name.strip(_BYTES_SPACE)
            if key and key.split() != [key]:
                continue  # whitespace inside the name: not a token
            if len(names) >= _MOST_CHECKED:
                names.clear()
            names[name] = key
        out[key] = value.strip(_BYTES_SPACE)
    return out


def _parse_lines(raw: bytes) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in raw.split(_CRLF):
        if not line:
            continue
        name, sep, value = line.partition(b":")
        if not sep:
            continue
        try:
            key = name.strip().decode("ascii")
        except UnicodeDecodeError:
            continue
        if key and key.split() != [key]:
            continue  # whitespace inside the name: not a token
        out[key] = value.strip().decode("utf-8", "replace")
    return out


# nats-py's own rules, its own patterns: a header name is an RFC 7230 token (_HEADER_KEY_RE); a
# subject has no whitespace or CR/LF (_SUBJECT_INVALID_RE).
_CHECKED_NAMES: set[str] = set()  # header names found to be tokens (a handful)
_CHECKED_SUBJECTS: set[str] = set()  # subjects found plain (one per queue, share and kind)


def _plain_subject(subject: str) -> bool:
    if subject in _CHECKED_SUBJECTS:
        return True
    if not subject or _SUBJECT_INVALID_RE.search(subject):
        return False
    if len(_CHECKED_SUBJECTS) >= _MOST_CHECKED:
        _CHECKED_SUBJECTS.clear()
    _CHECKED_SUBJECTS.add(subject)
    return True


def hpub_frame(subject: str, reply: str, headers: dict[str, str], payload: bytes) -> bytes | None:
    """The bytes nats-py's `_send_publish` sends for this message, or None when it is not
    plain (a subject or reply nats-py would refuse, a header name that is not a token, a value
    nats-py would strip or mend): then only nats-py may encode it."""
    if not _plain_subject(subject) or (reply and _SUBJECT_INVALID_RE.search(reply)):
        return None
    lines = ["NATS/1.0\r\n"]
    for name, value in headers.items():
        if name not in _CHECKED_NAMES:
            if not _HEADER_KEY_RE.fullmatch(name):
                return None
            _CHECKED_NAMES.add(name)
        if "\r" in value or "\n" in value or value.strip() != value:
            return None
        lines.append(f"{name}: {value}\r\n")
    lines.append("\r\n")
    head = "".join(lines).encode()
    size = len(head)
    return b"".join((f"HPUB {subject} {reply} {size} {size + len(payload)}\r\n".encode(),
                     head, payload, _CRLF))  # fmt: skip


async def publish_all(nc: Client, messages: list[tuple[str, str, dict[str, str], bytes]]) -> None:
    """Publish (subject, reply, headers, payload) messages in order, as `nc.publish` each
    would, but the frames of plain messages are built here and handed to nats-py's outbound
    buffer at once (one command, then nats-py's own flush rule).  Otherwise every message goes
    through `nc.publish`, which raises what it raises (a closed or draining connection, a
    payload over max_payload) or buffers while reconnecting."""
    if nc.is_connected and not nc.is_draining_pubs:
        frames, sent = [], 0
        most = nc.max_payload
        for subject, reply, headers, payload in messages:
            frame = hpub_frame(subject, reply, headers, payload) if len(payload) <= most else None
            if frame is None:
                break
            frames.append(frame)
            sent += len(payload)
        else:
            await send_frames(nc, frames, sent)
            return
    for subject, reply, headers, payload in messages:
        await nc.publish(subject, payload, reply=reply, headers=headers)


async def send_frames(nc: Client, frames: list[bytes], payload_bytes: int) -> None:
    """Hand ready PUB/HPUB frames (`payload_bytes` of payload in all) to nats-py's outbound
    buffer as one command, counted as nats-py counts what it publishes, then its flush rule.
    While reconnecting they wait in that buffer, as a publish's would."""
    nc.stats["out_msgs"] += len(frames)
    nc.stats["out_bytes"] += payload_bytes
    await nc._send_command(b"".join(frames))
    if nc._flush_queue is not None and nc._flush_queue.empty():
        await nc._flush_pending()


# Subscriptions whose messages bypass nats-py's message path (`raw_subscribe`): the handler gets
# the frame's subject, reply subject, header block (None without headers) and payload, at once.
RawHandler = Callable[[bytes, bytes, "bytes | None", bytes], None]
ORIGINAL_PROCESS_MSG = Client._process_msg


def _handed_raw(client: Client, sid: int, subject: bytes, reply: bytes, data: bytes,
                headers: bytes | None) -> bool:  # fmt: skip
    """Hand a message to its subscription's raw handler, if it has one (counted as nats-py
    counts a message in); False when it has none."""
    handler = getattr(client._subs.get(sid), "raw_handler", None)
    if handler is None:
        return False
    client.stats["in_msgs"] += 1
    client.stats["in_bytes"] += len(data)
    handler(subject, reply, headers, data)
    return True


async def _process_msg(self: Client, sid: int, subject: bytes, reply: bytes, data: bytes,
                       headers: bytes | None) -> None:  # fmt: skip
    if not _handed_raw(self, sid, subject, reply, data, headers):
        await ORIGINAL_PROCESS_MSG(self, sid, subject, reply, data, headers)


async def raw_subscribe(nc: Client, subject: str, handler: RawHandler,
                        queue: str = "") -> Subscription:  # fmt: skip
    """A subscription whose messages go to `handler(subject, reply, header block, payload)` as they
    are parsed, without nats-py's Msg, header parsing, pending queue and callback task (about
    5 µs a message, more than half of reading a fact: services/nats/log.py).  The handler runs
    on nats-py's read loop, so it must not block; unsubscribe as usual.  `queue`: a queue
    group's name (each message to one member of the group)."""
    if Client._process_msg is not _process_msg:  # the handler would never be called
        install()
    sub = await nc.subscribe(subject, queue=queue)
    sub.raw_handler = handler
    return sub


def header_value(headers: bytes | None, name: bytes) -> bytes | None:
    """The value of header `name` in a raw NATS header block (`NATS/1.0\r\nName: value\r\n
    ...`), stripped; None when absent.  For headers the reader's own writer set."""
    if not headers:
        return None
    start = headers.find(b"\r\n" + name + b":")
    if start < 0:
        return None
    start += len(name) + 3
    return headers[start:headers.index(b"\r\n", start)].strip()


class ControlAnswers:
    """What a raw handler (which cannot await) owes a push consumer: an empty message to a
    flow control request's reply, and to the subject a heartbeat names as stalled
    (`Nats-Consumer-Stalled`), each sent by a task of its own; `unanswered()` is called when
    one could not be sent."""

    def __init__(self, nc: Client, unanswered: Callable[[], None]):
        self.nc, self.unanswered = nc, unanswered
        self.tasks: set[asyncio.Task] = set()

    def alive(self, reply: bytes, headers: bytes) -> bool:
        """Answer a status frame if it is flow control or a heartbeat (status 100: the consumer
        is alive); False for any other status."""
        if not headers.startswith(b"NATS/1.0 100"):
            return False
        answer = reply or header_value(headers, b"Nats-Consumer-Stalled")
        if answer:
            task = asyncio.get_running_loop().create_task(self.nc.publish(answer.decode()))
            self.tasks.add(task)
            task.add_done_callback(self._sent)
        return True

    def _sent(self, task: asyncio.Task) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.unanswered()

    def cancel(self) -> None:
        for task in list(self.tasks):
            task.cancel()


ORIGINAL_PARSE = Parser.parse


async def parse(self: Parser, data: bytes = b"") -> None:
    """nats-py's `Parser.parse`, with the frames that carry messages (`MSG`, `HMSG`) read by
    splitting their control line on single spaces instead of trying two regular expressions
    on it, a frame whose payload has arrived dispatched without a detour through the
    parser's state, and a raw subscription's handler called without `_process_msg`'s
    coroutine.  The frames of a fact log: 2.1 µs a fact instead of 2.4 µs to parse; a bulk
    read 4.6 µs a fact instead of 4.9 µs (200k facts, 2026-12-05, this 2-core machine).
    The rest is the interpreter's work per frame.  Any other line (PING, PONG, INFO, +OK, -ERR), or a
    message line in another form than nats-server writes (tabs, runs of spaces, a size that
    is not digits), goes to nats-py's own parse with the rest of the buffer, which leaves the
    parser as it would have: tests/unit/test_natsfix.py compares the two on generated
    streams cut at every kind of boundary."""
    buf = self.buf
    buf.extend(data)
    while buf:
        if self.state == AWAITING_MSG_PAYLOAD:
            needed = self.needed
            if len(buf) < needed + 2:
                return
            header_needed, arg = self.header_needed, self.msg_arg
            if header_needed > 0:
                headers = bytes(buf[:header_needed])
                payload = bytes(buf[header_needed:needed])
                self.header_needed = 0
            else:
                headers, payload = None, bytes(buf[:needed])
            del buf[:needed + 2]
            self.state = AWAITING_CONTROL_LINE
            sid, subject, reply = arg["sid"], arg["subject"], arg["reply"]
            if not _handed_raw(self.nc, sid, subject, reply, payload, headers):  # no coroutine
                await self.nc._process_msg(sid, subject, reply, payload, headers)
            buf = self.buf  # a reconnect meanwhile gives the parser a new buffer
            continue
        first = buf[0]
        head = 5 if first == 72 and buf.startswith(b"HMSG ") else (
            4 if first == 77 and buf.startswith(b"MSG ") else 0)  # fmt: skip
        end = buf.find(b"\r\n") if head else -1
        if end < 0:
            if not head:
                await ORIGINAL_PARSE(self)
            return  # the rest of the line is on its way (nats-py waits the same)
        line = buf[head:end]
        args = line.split(b" ")
        count = len(args)
        if not (3 + (head == 5) <= count <= 4 + (head == 5)) or line.split() != args \
                or not args[-1].isdigit() or (head == 5 and not args[-2].isdigit()):
            await ORIGINAL_PARSE(self)
            return
        try:
            sid = int(args[1])
        except ValueError:
            await ORIGINAL_PARSE(self)  # "nats: malformed MSG", as nats-py says it
            return
        subject = args[0]
        reply = args[2] if count == 4 + (head == 5) else b""
        needed = int(args[-1])
        header_needed = int(args[-2]) if head == 5 else 0
        start = end + 2
        if len(buf) < start + needed + 2:  # the payload is on its way
            self.msg_arg["subject"], self.msg_arg["sid"], self.msg_arg["reply"] = subject, sid, reply
            self.needed = needed
            if head == 5:
                self.header_needed = header_needed
            del buf[:start]
            self.state = AWAITING_MSG_PAYLOAD
            return
        if header_needed > 0:
            headers = bytes(buf[start:start + header_needed])
            payload = bytes(buf[start + header_needed:start + needed])
        else:
            headers, payload = None, bytes(buf[start:start + needed])
        del buf[:start + needed + 2]
        if not _handed_raw(self.nc, sid, subject, reply, payload, headers):  # no coroutine
            await self.nc._process_msg(sid, subject, reply, payload, headers)
        buf = self.buf


def install() -> None:
    Client._parse_header_lines = staticmethod(parse_header_lines)
    Client._process_msg = _process_msg
    Parser.parse = parse
