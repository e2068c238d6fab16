"""The live fixtures of tests/integration (a real nats-server, quotasched subprocesses)."""

from tests.integration.conftest import nats_server, spawn  # noqa: F401
