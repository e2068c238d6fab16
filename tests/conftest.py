"""Shared pytest configuration."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden",
        action="store_true",
        default=False,
        help="Rewrite tests/golden/expected/* from the current output instead of comparing.",
    )


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    """True when the run was started with --update-golden."""
    return bool(request.config.getoption("--update-golden"))


_LOUD_NOTICE: list[str] = []


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """Note when the compiled-core equivalence tests did not run (no C compiler, no Python
    headers, a build of other sources): the suite then proves the interpreted core only, while
    `make demo` and production may run the compiled one.  Printed last (pytest_unconfigure)."""
    skipped = [report for report in terminalreporter.stats.get("skipped", [])
               if "test_compiled_core" in report.nodeid]  # fmt: skip
    if skipped:
        reason = skipped[0].longrepr[-1] if isinstance(skipped[0].longrepr, tuple) else ""
        _LOUD_NOTICE[:] = [
            "!" * 88,
            f"THE COMPILED-CORE EQUIVALENCE DID NOT RUN ({len(skipped)} tests skipped): {reason}",
            "Only the interpreted decision core was tested; build the compiled one with "
            "`.venv/bin/python -m quotasched.services.native build` (a C compiler and Python headers).",
            "!" * 88,
        ]


def pytest_unconfigure(config: pytest.Config) -> None:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        for line in _LOUD_NOTICE:
            reporter.write_line(line, red=True, bold=True)
