"""A message of at most BOUNDED_MESSAGE_BYTES cannot hold a payload over the 10 KiB limit.

The codec tells validation so (`SIZE_BOUNDED`), and a payload object in such a message is not
encoded again to be measured.  The bound rests on how much longer encoding JSON again can make
any part of it: at most 4.5x (a number written `1e15` comes back as `1000000000000000.0`), so
the compact ASCII JSON of a payload within 2,048 bytes is at most 9,216 bytes.  Checked here on
hand-picked worst cases and on generated payloads written as tersely as JSON allows, then end
to end: the same verdicts either side of the bound.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quotasched.events import commands
from quotasched.events.codec import DecodeError, decode_command
from quotasched.events.commands import BOUNDED_MESSAGE_BYTES, PAYLOAD_LIMIT_BYTES

WORST = 4.5


def measured(payload: object) -> int:
    """What the 10 KiB limit measures: the payload's compact JSON with ASCII escapes."""
    return len(json.dumps(payload, separators=(",", ":")).encode())


def terse(value: object) -> str:
    """`value` as short as JSON can write it: raw UTF-8, no spaces, numbers in their shortest
    form (`1e15` rather than `1000000000000000.0`)."""
    if isinstance(value, float):
        plain = repr(value)
        mantissa, _, exponent = f"{value:.17e}".partition("e")
        digits = mantissa.rstrip("0").rstrip(".")
        short = f"{digits}e{int(exponent)}"
        for candidate in (short, plain):
            assert float(candidate) == value
        return min(short, plain, key=len)
    if isinstance(value, dict):
        return "{" + ",".join(f"{terse(k)}:{terse(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(terse(item) for item in value) + "]"
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def test_the_worst_cases_by_hand():
    """Each kind of token at its worst: a number, the characters JSON escapes longest."""
    for raw in ('[1e15]', '[9e15]', '[-1e15]', '["é"]', '["€"]', '["😀"]', '["\x7f"]',
                '{"k":1e15,"é":"😀"}', '[1E+15]', '[1e-4]', '[0.1e1]', '[1e400]'):  # fmt: skip
        size = len(raw.encode())
        assert measured(json.loads(raw)) <= WORST * size, raw
    assert measured([1e15]) == len("[1000000000000000.0]")  # the 4.5x of the bound, met


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**30, 10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.builds(lambda m, e: float(f"{m}e{e}"), st.integers(1, 99), st.integers(-30, 30))
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=30,
)  # fmt: skip


@settings(max_examples=2000, deadline=None)
@given(json_values)
def test_encoding_again_makes_a_payload_at_most_4_5_times_longer(value):
    raw = terse(value)
    again = json.loads(raw)
    assert measured(again) <= WORST * len(raw.encode())
    assert WORST * BOUNDED_MESSAGE_BYTES <= PAYLOAD_LIMIT_BYTES


def _submission(payload: object) -> bytes:
    return json.dumps({"kind": "SubmitServiceJob", "jobName": "j", "jobQueue": "q",
                       "quotaShareName": "s", "serviceRequestPayload": payload},
                      ensure_ascii=False, separators=(",", ":")).encode()  # fmt: skip


def _payload(pad: str) -> dict:
    return {"ResourceConfig": {"InstanceType": "ml.p4d.24xlarge", "InstanceCount": 2},
            "HyperParameters": {"pad": pad}}  # fmt: skip


class Measured(Exception):
    """The payload was encoded again to be measured."""


def test_a_message_within_the_bound_skips_measuring_and_a_longer_one_is_measured(monkeypatch):
    """Either side of the bound, the verdicts are the limit's: within it no payload is
    encoded again (the measuring is made to fail there, and nothing fails), beyond it a
    payload of 10 KiB + 1 is refused and one of exactly 10 KiB accepted."""
    small = _payload("x" * 100)
    assert len(_submission(small)) <= BOUNDED_MESSAGE_BYTES
    dumps = json.dumps

    def measuring(value, *args, **kwargs):
        if kwargs.get("separators") == (",", ":"):
            raise Measured  # not a ValueError: validation lets it through
        return dumps(value, *args, **kwargs)

    within, beyond = _submission(small), _submission(_payload("x" * BOUNDED_MESSAGE_BYTES))
    monkeypatch.setattr(commands.json, "dumps", measuring)
    assert decode_command(within).need() == (("ml.p4d.24xlarge", 2),)
    with pytest.raises(Measured):
        decode_command(beyond)
    monkeypatch.setattr(commands.json, "dumps", dumps)

    base = measured(_payload(""))
    exact = _payload("x" * (PAYLOAD_LIMIT_BYTES - base))
    assert measured(exact) == PAYLOAD_LIMIT_BYTES
    assert decode_command(_submission(exact)).need() == (("ml.p4d.24xlarge", 2),)
    over = _payload("x" * (PAYLOAD_LIMIT_BYTES - base + 1))
    with pytest.raises(DecodeError, match="10 KiB"):
        decode_command(_submission(over))


def test_the_bound_holds_for_text_counted_in_characters():
    """A message given as text is measured at 4 bytes a character: 600 characters of 4 bytes
    each (2,400 bytes) are not within the bound, and their payload is measured."""
    payload = _payload("😀" * 600)
    text = _submission(payload).decode()
    assert len(text) * 4 > BOUNDED_MESSAGE_BYTES
    assert measured(payload) > 3 * 600  # escaped: 12 bytes a character
    assert decode_command(text).need() == (("ml.p4d.24xlarge", 2),)
