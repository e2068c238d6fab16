"""How a process presents its NATS credentials: the QUOTASCHED_NATS_* environment as connect
options.

Every entry point (CLI, Python client, services) connects alike: QUOTASCHED_NATS_USER and
QUOTASCHED_NATS_PASSWORD (a role's user, services/config/auth.py derives them),
QUOTASCHED_NATS_INBOX_PREFIX (the role's own inbox), and QUOTASCHED_NATS_TLS_CA (a CA bundle:
TLS, with the server's certificate verified against it).
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from typing import Any

USER_ENV = "QUOTASCHED_NATS_USER"
PASSWORD_ENV = "QUOTASCHED_NATS_PASSWORD"
INBOX_ENV = "QUOTASCHED_NATS_INBOX_PREFIX"
TLS_CA_ENV = "QUOTASCHED_NATS_TLS_CA"


def connect_options(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """nats.connect keyword arguments for the credentials, inbox prefix and TLS CA in the
    environment (nothing when none is set)."""
    environ = os.environ if environ is None else environ
    options: dict[str, Any] = {}
    if environ.get(USER_ENV):
        options["user"] = environ[USER_ENV]
        options["password"] = environ.get(PASSWORD_ENV, "")
    if environ.get(INBOX_ENV):
        options["inbox_prefix"] = environ[INBOX_ENV]
    if environ.get(TLS_CA_ENV):
        options["tls"] = ssl.create_default_context(cafile=environ[TLS_CA_ENV])
    return options


def broker_options(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The same, as FastStream's NatsBroker keyword arguments (its `security` object)."""
    from faststream.security import BaseSecurity, SASLPlaintext

    options = connect_options(environ)
    broker: dict[str, Any] = {}
    if "inbox_prefix" in options:
        broker["inbox_prefix"] = options["inbox_prefix"]
    if "user" in options:
        broker["security"] = SASLPlaintext(options["user"], options["password"],
                                           ssl_context=options.get("tls"))  # fmt: skip
    elif "tls" in options:
        broker["security"] = BaseSecurity(ssl_context=options["tls"])
    return broker
