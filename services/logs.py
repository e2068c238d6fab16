"""structlog configuration: readable lines on a terminal's stderr, one JSON object per line
otherwise, context bound per command; and `LineBudget`, which bounds the lines one kind of
event may write (a few in full per key and window, the rest summed up in one line)."""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable

import structlog


LEVEL_ENV = "QUOTASCHED_LOG_LEVEL"
FORMAT_ENV = "QUOTASCHED_LOG_FORMAT"
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
FORMATS = ("json", "console")


class LogSettingError(ValueError):
    """QUOTASCHED_LOG_LEVEL or QUOTASCHED_LOG_FORMAT names no level or format."""


_configured: dict[str, str] = {}  # the level `configure` chose last (a child logs at it too)


def configured_level() -> str | None:
    """The level this process logs at (None before `configure`)."""
    return _configured.get("level")


def configure(level: str = "INFO", json: bool | None = None) -> None:
    """Readable lines on standard error when it is a terminal (a person watches), JSON lines
    otherwise (a file, a pipe, a log collector).  QUOTASCHED_LOG_LEVEL (DEBUG, INFO, WARNING,
    ERROR) overrides `level`, and QUOTASCHED_LOG_FORMAT=json|console chooses either way; a
    value that names neither is refused (LogSettingError)."""
    level = os.environ.get(LEVEL_ENV, level).strip().upper()
    if level not in LEVELS:
        raise LogSettingError(f"{LEVEL_ENV}={level!r}: expected one of {', '.join(LEVELS)}")
    if json is None:
        chosen = os.environ.get(FORMAT_ENV, "").strip().lower()
        if chosen and chosen not in FORMATS:
            raise LogSettingError(f"{FORMAT_ENV}={chosen!r}: expected json or console")
        json = chosen == "json" if chosen else not sys.stderr.isatty()
    _configured["level"] = level
    renderer = (structlog.processors.JSONRenderer() if json
                else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty()))  # fmt: skip
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )


def get(name: str) -> structlog.typing.FilteringBoundLogger:
    return structlog.get_logger(name)


class Held:
    """One key's window of a `LineBudget` that held lines back: what its summary line tells."""

    __slots__ = ("key", "opened", "count", "told", "kinds", "first", "last")

    def __init__(self, key: object, opened: float, mark: object) -> None:
        self.key = key
        self.opened = opened  # when the window opened (the budget's clock)
        self.count = 0  # events in the window, the ones told in full included
        self.told = 0  # told in full
        self.kinds: dict[str, int] = {}  # events per kind (the first `max_kinds`; then OTHER)
        self.first = mark  # the first and last event's mark (e.g. a stream sequence)
        self.last = mark

    @property
    def held_back(self) -> int:
        return self.count - self.told


class LineBudget:
    """At most `lines` full lines per key in each window of `window_s` seconds (a key's window
    opens with its first event); the rest are held back and counted, per kind, and a window
    that held some back is told in one summary line when it has closed: on the key's next
    event after it (`admit`), or when the owner asks (`due`, on a timer; `flush`, at close).

    Bounded: at most `max_keys` windows are open at once (an event of a further key counts
    under `overflow_key`), and at most `max_kinds` kinds per window (the rest count as OTHER).
    `clock` is injectable for tests.  (services/http_guard.py's `Throttle` is the simpler rule
    its error lines keep: one line per kind and interval, the next one counting the rest.)"""

    OTHER = "(other)"

    def __init__(self, lines: int = 5, window_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic, max_keys: int = 1000,
                 max_kinds: int = 8, overflow_key: object = None) -> None:  # fmt: skip
        self.lines = lines
        self.window_s = window_s
        self.clock = clock
        self.max_keys = max_keys
        self.max_kinds = max_kinds
        self.overflow_key = overflow_key
        self._open: dict[object, Held] = {}  # in the order the windows opened
        self._closed: list[Held] = []  # closed, held lines back, not yet returned

    def admit(self, key: object, kind: str, mark: object = None) -> tuple[bool, Held | None]:
        """Count one event: (tell it in full?, the key's previous window if it has closed
        and held lines back: its summary is due now, before this event's line)."""
        now = self.clock()
        window = self._open.get(key)
        closed = None
        if window is not None and now - window.opened >= self.window_s:
            del self._open[key]
            if window.count > window.told:
                closed = window
            window = None
        if window is None:
            if len(self._open) >= self.max_keys:
                self._expire(now)
                if len(self._open) >= self.max_keys and key != self.overflow_key:
                    return self.admit(self.overflow_key, kind, mark)
            window = self._open[key] = Held(key, now, mark)
        window.count += 1
        window.last = mark
        kinds = window.kinds
        if kind in kinds:
            kinds[kind] += 1
        elif len(kinds) < self.max_kinds:
            kinds[kind] = 1
        else:
            kinds[self.OTHER] = kinds.get(self.OTHER, 0) + 1
        if window.told < self.lines:
            window.told += 1
            return True, closed
        return False, closed

    def due(self) -> list[Held]:
        """The windows closed by now that held lines back (each returned once); closed
        windows that held nothing back are forgotten."""
        self._expire(self.clock())
        closed, self._closed = self._closed, []
        return closed

    def flush(self) -> list[Held]:
        """Every window that held lines back, closed or not (at close); all forgotten."""
        held = self._closed + [w for w in self._open.values() if w.count > w.told]
        self._closed, self._open = [], {}
        return held

    def next_close(self) -> float | None:
        """When (by the clock) the earliest window that held lines back closes (or closed:
        one `due` has not returned yet); None when no window holds any back."""
        if self._closed:
            return self._closed[0].opened + self.window_s
        for window in self._open.values():  # in the order they opened
            if window.count > window.told:
                return window.opened + self.window_s
        return None

    def _expire(self, now: float) -> None:
        """Close the windows whose time is up (the oldest first: the dict is in order)."""
        while self._open:
            key, window = next(iter(self._open.items()))
            if now - window.opened < self.window_s:
                return
            del self._open[key]
            if window.count > window.told:
                self._closed.append(window)
