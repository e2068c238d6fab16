"""Log level and format from the environment (issue 21): QUOTASCHED_LOG_LEVEL and
QUOTASCHED_LOG_FORMAT, with a clear refusal of a value that names neither."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import structlog

from quotasched.services import logs

QUOTASCHED = str(Path(sys.executable).parent / "quotasched")


@pytest.fixture(autouse=True)
def fresh_structlog():
    yield
    structlog.reset_defaults()


def emitted(capsys) -> str:
    structlog.get_logger("t").info("hello", answer=42)
    structlog.get_logger("t").debug("hidden")
    return capsys.readouterr().err


def test_json_lines_by_default(monkeypatch, capsys):
    monkeypatch.delenv(logs.LEVEL_ENV, raising=False)
    monkeypatch.delenv(logs.FORMAT_ENV, raising=False)
    logs.configure()
    [line] = emitted(capsys).splitlines()
    assert {key: json.loads(line)[key] for key in ("event", "answer", "level")} == {
        "event": "hello", "answer": 42, "level": "info"}


def test_console_format_and_debug_level_from_the_environment(monkeypatch, capsys):
    monkeypatch.setenv(logs.FORMAT_ENV, "console")
    monkeypatch.setenv(logs.LEVEL_ENV, "debug")
    logs.configure("WARNING")  # the environment wins over the command's default
    out = emitted(capsys)
    assert "hello" in out and "answer=42" in out and "hidden" in out
    with pytest.raises(json.JSONDecodeError):
        json.loads(out.splitlines()[0])


def test_a_level_above_info_hides_info(monkeypatch, capsys):
    monkeypatch.setenv(logs.LEVEL_ENV, "ERROR")
    monkeypatch.delenv(logs.FORMAT_ENV, raising=False)
    logs.configure()
    assert emitted(capsys) == ""


@pytest.mark.parametrize("variable, value, message", [
    ("QUOTASCHED_LOG_LEVEL", "LOUD",
     "QUOTASCHED_LOG_LEVEL='LOUD': expected one of DEBUG, INFO, WARNING, ERROR, CRITICAL"),
    ("QUOTASCHED_LOG_FORMAT", "xml", "QUOTASCHED_LOG_FORMAT='xml': expected json or console"),
])  # fmt: skip
def test_a_value_that_names_nothing_is_one_line_and_exit_2(variable, value, message, tmp_path):
    env = {**os.environ, variable: value}
    done = subprocess.run([QUOTASCHED, "scheduler", "--nats-url", "nats://127.0.0.1:1"],
                          env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == f"quotasched: {message}"


def test_readable_lines_on_a_terminal_json_elsewhere_by_default(monkeypatch, capsys):
    """Issue 32: `up` on a terminal logged JSON; without QUOTASCHED_LOG_FORMAT a terminal now
    gets readable lines, a file or a pipe (capsys is not a terminal) still JSON."""
    monkeypatch.delenv(logs.FORMAT_ENV, raising=False)
    monkeypatch.delenv(logs.LEVEL_ENV, raising=False)
    logs.configure()
    json.loads(emitted(capsys).splitlines()[0])  # not a terminal: JSON
    structlog.reset_defaults()
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    logs.configure()
    out = emitted(capsys)
    assert "hello" in out and "answer" in out and "\x1b[" in out  # coloured, for a person
    with pytest.raises(json.JSONDecodeError):
        json.loads(out.splitlines()[0])
    structlog.reset_defaults()
    monkeypatch.setenv(logs.FORMAT_ENV, "json")  # asked for: JSON on a terminal too
    logs.configure()
    json.loads(emitted(capsys).splitlines()[0])
