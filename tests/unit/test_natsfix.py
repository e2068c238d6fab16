"""The replacement header parser gives exactly what nats-py's own parser gives."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from quotasched.services.nats import natsfix

# Header-ish bytes: names and values from a mix of token characters, whitespace of every kind
# str.isspace() knows in ASCII (including \x1c-\x1f), colons, CR/LF and non-ASCII bytes.
_PIECES = st.sampled_from([b"Nats-Msg-Id", b"Qm-Facts", b"Status", b"X", b" ", b"\t", b"\x0b",
                           b"\x0c", b"\x1c", b"\x1f", b":", b": ", b"\r\n", b"\r", b"\n", b"",
                           b"main:1:0", b"100", b"\xc3\xa9", b"\xff", b"NATS/1.0"])  # fmt: skip
_BLOCKS = st.lists(_PIECES, max_size=30).map(b"".join)


@settings(max_examples=2000, deadline=None)
@given(_BLOCKS)
def test_the_same_headers_as_nats_py(raw):
    assert natsfix.parse_header_lines(raw) == natsfix.ORIGINAL(raw)


def test_a_stored_fact_header_block():
    raw = (b"Nats-Msg-Id: main:12:0\r\nQm-Facts: 2\r\nNats-Expected-Last-Subject-Sequence: 41"
           b"\r\nNats-Expected-Last-Subject-Sequence-Subject: qm.fact.>\r\n\r\n")
    expected = {"Nats-Msg-Id": "main:12:0", "Qm-Facts": "2",
                "Nats-Expected-Last-Subject-Sequence": "41",
                "Nats-Expected-Last-Subject-Sequence-Subject": "qm.fact.>"}  # fmt: skip
    assert natsfix.parse_header_lines(raw) == natsfix.ORIGINAL(raw) == expected


def test_installed_by_the_bus_module():
    from nats.aio.client import Client

    import quotasched.services.nats.bus  # noqa: F401  (installs it)

    assert Client._parse_header_lines is natsfix.parse_header_lines
    assert Client._process_msg is natsfix._process_msg  # raw subscriptions (test_bulk_read.py)


# -- the writer's frames: exactly what nats-py's publish would send, or nats-py does it --------

def _nats_py_frame(subject: str, reply: str, headers: dict[str, str], payload: bytes) -> bytes:
    """What nats-py's own `_send_publish` hands to its outbound buffer."""
    import asyncio

    from nats.aio.client import Client

    client, sent = Client(), []

    async def capture(command: bytes, priority: bool = False) -> None:
        sent.append(command)

    client._send_command = capture
    asyncio.run(client._send_publish(subject, reply, payload, len(payload), headers))
    return sent[0]


_NAMES = st.sampled_from(["Nats-Msg-Id", "Qm-Facts", "Nats-Expected-Last-Subject-Sequence",
                          "X", " Padded", "bad name", "semi;colon", "", "é", "Nats-Batch-Id"])  # fmt: skip
_VALUES = st.text(alphabet=st.sampled_from("ab:09 .>\t\r\né"), max_size=12)
_SUBJECTS = st.text(alphabet=st.sampled_from("qm.fact>*~_- \t\r\né"), min_size=0, max_size=20)


@settings(max_examples=2000, deadline=None)
@given(_SUBJECTS, st.sampled_from(["", "_INBOX.abc.7", "bad reply"]),
       st.dictionaries(_NAMES, _VALUES, max_size=5), st.binary(max_size=40))
def test_frames_are_nats_pys_own_or_left_to_it(subject, reply, headers, payload):
    frame = natsfix.hpub_frame(subject, reply, headers, payload)
    if frame is None:
        return  # not plain: publish_all hands it to nats-py's publish
    assert frame == _nats_py_frame(subject, reply, headers, payload)


def test_the_writers_fact_frame_is_built_here():
    headers = {"Nats-Msg-Id": "main:12:0", "Qm-Facts": "2",
               "Nats-Expected-Last-Subject-Sequence": "41",
               "Nats-Expected-Last-Subject-Sequence-Subject": "qm.fact.>"}  # fmt: skip
    payload = b'{"kind":"JobDispatched","at":1.5}'
    for reply in ("", "_INBOX.x1.3"):
        frame = natsfix.hpub_frame("qm.fact.q.qs1.JobDispatched", reply, headers, payload)
        assert frame == _nats_py_frame("qm.fact.q.qs1.JobDispatched", reply, headers, payload)


def test_what_is_not_plain_is_left_to_nats_py():
    assert natsfix.hpub_frame("qm.fact.a b", "", {}, b"") is None
    assert natsfix.hpub_frame("", "", {}, b"") is None
    assert natsfix.hpub_frame("qm.x", "in box", {}, b"") is None
    assert natsfix.hpub_frame("qm.x", "", {"bad name": "1"}, b"") is None
    assert natsfix.hpub_frame("qm.x", "", {"X": "1\r\nPUB evil 1\r\n"}, b"") is None
    assert natsfix.hpub_frame("qm.x", "", {"X": " 1"}, b"") is None


# The parser: frames as nats-server writes them, and lines in other forms, cut anywhere.
_TOKENS = st.sampled_from([b"qm.cmd.q.s.SubmitServiceJob", b"_INBOX.x.1", b"a", b"$JS.ACK.S.c.1.5.5.1733.0",
                           b"\xc3\xa9", b"1"])  # fmt: skip
_PAYLOADS = st.sampled_from([b"", b"{}", b"x\r\ny", b"\r\n", b"MSG a 1 3\r\n", b"x" * 300])
_HEADERS = st.sampled_from([b"NATS/1.0\r\n\r\n", b"NATS/1.0\r\nQm-Facts: 2\r\n\r\n",
                            b"NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: 3\r\n\r\n",
                            b"NATS/1.0 404 No Messages\r\n\r\n"])  # fmt: skip
_ODD_LINES = st.sampled_from([b"PING\r\n", b"PONG\r\n", b"+OK\r\n", b"INFO {\"max_payload\": 9}\r\n",
                              b"-ERR 'Stale Connection'\r\n", b"MSG  a 1 3\r\nabc\r\n",
                              b"MSG\ta 1 3\r\nabc\r\n", b"MSG a x 3\r\nabc\r\n", b"MSG a 1 3x\r\nabc\r\n",
                              b"MSG a 1 r s 3\r\nabc\r\n", b"HMSG a 1 x 3\r\nabc\r\n",
                              b"MSG a 1_0 3\r\nabc\r\n", b"MSG a 1 \r\n", b"HMSG a 1 12 12\r\n",
                              b"BOGUS\r\n", b"MSG a 1 3 \r\nabc\r\n"])  # fmt: skip


@st.composite
def _frame(draw) -> bytes:
    kind = draw(st.sampled_from(["msg", "hmsg", "odd"]))
    if kind == "odd":
        return draw(_ODD_LINES)
    subject, sid, payload = draw(_TOKENS), draw(st.integers(0, 99)), draw(_PAYLOADS)
    reply = draw(st.one_of(st.just(b""), _TOKENS))
    arg = b" " + reply if reply else b""
    if kind == "msg":
        return b"MSG %s %d%s %d\r\n%s\r\n" % (subject, sid, arg, len(payload), payload)
    headers = draw(_HEADERS)
    return b"HMSG %s %d%s %d %d\r\n%s%s\r\n" % (subject, sid, arg, len(headers),
                                                len(headers) + len(payload), headers, payload)


class _Recorder:
    """What the parser hands its client."""

    def __init__(self):
        self.calls: list[tuple] = []
        self._subs: dict = {}  # no raw subscriptions: every message through _process_msg

    async def _process_msg(self, sid, subject, reply, payload, headers):
        self.calls.append(("msg", sid, bytes(subject), bytes(reply), payload, headers))

    async def _process_ping(self):
        self.calls.append(("ping",))

    async def _process_pong(self):
        self.calls.append(("pong",))

    async def _process_info(self, info):
        self.calls.append(("info", info))

    async def _process_err(self, err):
        self.calls.append(("err", err))


def _parsed(parse, pieces: list[bytes]) -> tuple:
    import asyncio

    from nats.errors import ProtocolError
    from nats.protocol.parser import AWAITING_MSG_PAYLOAD, Parser

    client = _Recorder()
    parser = Parser(client)

    async def feed() -> str | None:
        try:
            for piece in pieces:
                await parse(parser, piece)
        except ProtocolError as error:
            return f"{type(error).__name__}: {error}"
        return None

    raised = asyncio.run(feed())
    waiting = parser.state == AWAITING_MSG_PAYLOAD  # then what the next bytes complete matters
    return (client.calls, raised, bytes(parser.buf), parser.state,
            (parser.needed, parser.header_needed, dict(parser.msg_arg)) if waiting else None)


@settings(max_examples=1500, deadline=None)
@given(st.lists(_frame(), min_size=1, max_size=12), st.data())
def test_the_parser_hands_over_what_nats_py_would(frames, data):
    stream = b"".join(frames)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=6)))
    pieces = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)])]
    assert _parsed(natsfix.parse, pieces) == _parsed(natsfix.ORIGINAL_PARSE, pieces)


def test_the_parser_reads_a_stream_of_facts_in_small_pieces():
    frame = (b"HMSG qm.fact.q.s.JobSubmitted 7 $JS.ACK.F.c.1.5.5.1733.0 25 28\r\n"
             b"NATS/1.0\r\nQm-Facts: 1\r\n\r\n{}x\r\n")  # fmt: skip
    stream = frame * 50
    pieces = [stream[at:at + 7] for at in range(0, len(stream), 7)]
    calls = _parsed(natsfix.parse, pieces)[0]
    assert calls == _parsed(natsfix.ORIGINAL_PARSE, pieces)[0]
    assert calls == [("msg", 7, b"qm.fact.q.s.JobSubmitted", b"$JS.ACK.F.c.1.5.5.1733.0",
                      b"{}x", b"NATS/1.0\r\nQm-Facts: 1\r\n\r\n")] * 50  # fmt: skip


def test_a_reconnect_while_a_message_is_handled_drops_the_old_buffer_as_nats_py_does():
    """nats-py resets the parser (a new, empty buffer) when it reconnects, which may happen
    while a message is being handled: the rest of the old buffer is not parsed."""
    import asyncio

    from nats.protocol.parser import Parser

    def handled(parse, pieces: list[bytes]) -> list:
        client = _Recorder()
        parser = Parser(client)
        record = client._process_msg

        async def then_reconnect(*args):
            await record(*args)
            parser.reset()

        client._process_msg = then_reconnect

        async def feed() -> None:
            for piece in pieces:
                await parse(parser, piece)

        asyncio.run(feed())
        return client.calls

    stream = b"MSG a 1 2\r\nhi\r\n" * 3
    for pieces in ([stream], [stream[:12], stream[12:]]):  # whole; the first payload split
        assert handled(natsfix.parse, pieces) == handled(natsfix.ORIGINAL_PARSE, pieces) == [
            ("msg", 1, b"a", b"", b"hi", None)], pieces  # fmt: skip
