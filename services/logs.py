"""structlog configuration: one JSON object per line on stderr (or readable console lines),
context bound per command."""

from __future__ import annotations

import logging
import os
import sys

import structlog


LEVEL_ENV = "QUOTASCHED_LOG_LEVEL"
FORMAT_ENV = "QUOTASCHED_LOG_FORMAT"
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
FORMATS = ("json", "console")


class LogSettingError(ValueError):
    """QUOTASCHED_LOG_LEVEL or QUOTASCHED_LOG_FORMAT names no level or format."""


def configure(level: str = "INFO", json: bool | None = None) -> None:
    """JSON lines on standard error by default.  QUOTASCHED_LOG_LEVEL (DEBUG, INFO, WARNING,
    ERROR) overrides `level`, and QUOTASCHED_LOG_FORMAT=console gives readable lines for a
    person at a terminal; a value that names neither is refused (LogSettingError)."""
    level = os.environ.get(LEVEL_ENV, level).strip().upper()
    if level not in LEVELS:
        raise LogSettingError(f"{LEVEL_ENV}={level!r}: expected one of {', '.join(LEVELS)}")
    if json is None:
        chosen = os.environ.get(FORMAT_ENV, "json").strip().lower()
        if chosen not in FORMATS:
            raise LogSettingError(f"{FORMAT_ENV}={chosen!r}: expected json or console")
        json = chosen == "json"
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
