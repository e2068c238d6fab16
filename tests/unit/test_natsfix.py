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
