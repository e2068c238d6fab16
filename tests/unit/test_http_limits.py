"""The rules the HTTP ports keep, without a network: error lines per interval (`Throttle`),
signed requests performed once (`Replays`), the Host and Origin values a server answers to
(`HostRule`)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import pytest

from quotasched.services.endpoint.sigv4 import Replays, Unauthenticated
from quotasched.services.http_guard import HostRule, Throttle, ThrottleFilter


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_of_identical_errors_is_one_line_and_the_next_one_counts_the_rest():
    clock = Clock()
    throttle = Throttle(60.0, clock)
    told = [throttle.admit("accept failed") for _ in range(500)]
    assert told[0] == 0 and told[1:] == [None] * 499
    assert throttle.admit("another error") == 0  # each kind its own line
    clock.now = 61.0
    assert throttle.admit("accept failed") == 499  # the next line says how many were held back
    assert throttle.admit("accept failed") is None
    assert throttle.held() == {"accept failed": 1}  # told at close


def test_the_libraries_error_lines_are_throttled_too(caplog):
    logger = logging.getLogger("test.http.throttle")
    logger.addFilter(ThrottleFilter(3600.0))
    with caplog.at_level(logging.ERROR, logger="test.http.throttle"):
        for _ in range(100):
            logger.error("socket.accept() out of system resource: %s", "EMFILE")
    assert [record.getMessage() for record in caplog.records] == [
        "socket.accept() out of system resource: EMFILE"]


def test_a_signature_is_performed_once_within_its_window_and_forgotten_after():
    replays, now = Replays(), datetime(2026, 1, 1, tzinfo=UTC)
    replays.claim("sig-a", now, now)
    with pytest.raises(Unauthenticated) as refused:
        replays.claim("sig-a", now, now + timedelta(minutes=14))
    assert (refused.value.kind, refused.value.status) == ("InvalidSignatureException", 403)
    replays.claim("sig-a", now, now + timedelta(minutes=16))  # expired: check_fresh refuses it
    assert len(replays) == 1


def test_a_failed_request_may_come_again_and_memory_is_bounded():
    replays, now = Replays(capacity=2), datetime(2026, 1, 1, tzinfo=UTC)
    replays.claim("sig-a", now, now)
    replays.release("sig-a")  # answered an error: nothing done, a retry is welcome
    replays.claim("sig-a", now, now)
    replays.claim("sig-b", now, now)
    with pytest.raises(Unauthenticated) as full:
        replays.claim("sig-c", now, now)
    assert (full.value.kind, full.value.status) == ("ThrottlingException", 429)
    replays.claim("sig-c", now + timedelta(minutes=1), now + timedelta(minutes=16))  # room again
    assert len(replays) == 1


@pytest.mark.parametrize("host, allowed, refused", [
    ("127.0.0.1", ["127.0.0.1:8080", "localhost:8080", "[::1]:8080", "LOCALHOST:8080"],
     ["evil.example:8080", "127.0.0.1:8081", "127.0.0.1", "", "10.0.0.1:8080", "batch:8080"]),
    ("::1", ["[::1]:8080", "localhost:8080"], ["[::2]:8080", "evil:8080"]),
    ("10.1.2.3", ["10.1.2.3:8080", "batch.example.com"], ["127.0.0.1:8080", "evil:8080"]),
])  # fmt: skip
def test_a_server_answers_to_the_addresses_it_listens_on_and_the_declared_names(host, allowed,
                                                                                  refused):  # fmt: skip
    rule = HostRule(host, 8080, ("batch.example.com",))
    assert [value for value in allowed if not rule.allows(value)] == []
    assert [value for value in refused if rule.allows(value)] == []


def test_a_wildcard_address_answers_any_name_unless_names_are_declared():
    assert HostRule("0.0.0.0", 8080, ()).allows("anything:8080")
    declared = HostRule("0.0.0.0", 8080, ("batch:8080",))
    assert declared.allows("batch:8080") and not declared.allows("batch:9090")
    assert not declared.allows("evil:8080")


def test_an_origin_must_be_the_servers_own():
    rule = HostRule("127.0.0.1", 8080, ())
    assert rule.allows_origin("http://127.0.0.1:8080")
    assert rule.allows_origin("http://localhost:8080")
    for origin in ("http://evil.example", "null", "http://127.0.0.1:9999", "file://",
                   "chrome-extension://abc"):
        assert not rule.allows_origin(origin), origin
