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
