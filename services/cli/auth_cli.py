"""`quotasched auth generate`: NATS users, permissions and credentials from the configuration.

    quotasched auth generate --config examples/shares.yaml --out nats-auth
    nats-server -c nats-auth/nats-server.conf -js      # or include it in your server's config
    set -a; . nats-auth/creds/pipeline-q-qs1.env; set +a
    quotasched apply jobs.jsonl --wait                 # as the pipeline of q/qs1
    quotasched endpoint --nats-url ... --keys nats-auth/endpoint-keys.json   # the AWS API
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

auth_app = typer.Typer(help="NATS users, subject permissions and credentials per role.",
                       no_args_is_help=True)  # fmt: skip


def register(app: typer.Typer) -> None:
    app.add_typer(auth_app, name="auth")


@auth_app.command()
def generate(
    config: Annotated[Path, typer.Option("--config", help="Shares configuration: the YAML of `config apply`, or a command file (JSON Lines).")],
    out: Annotated[Path, typer.Option("--out", help="Directory for nats-server.conf and creds/<role>.env.")],
    tls_ca: Annotated[Optional[str], typer.Option("--tls-ca", help="CA bundle the clients verify the server with (written into each credentials file).")] = None,
) -> None:
    """Write a nats-server configuration with one user per role (admin, scheduler, projector,
    executor, and a pipeline per quota share) and their subject permissions, and a
    credentials file per role.  Passwords are random; the files are readable by you only."""
    from quotasched.services.config import auth
    from quotasched.services.config.as_code import ConfigError

    try:
        shares = auth.shares_of(config)
    except (ConfigError, OSError, ValueError, KeyError) as error:
        typer.echo(f"quotasched auth generate: {config}: {error}", err=True)
        raise typer.Exit(2) from None
    if not shares:
        typer.echo(f"quotasched auth generate: {config} declares no quota share", err=True)
        raise typer.Exit(2)
    try:
        roles = auth.roles(shares)
    except auth.NameCollision as error:  # before a file is written: nothing half-generated
        typer.echo(f"quotasched auth generate: {config}: {error}", err=True)
        raise typer.Exit(2) from None
    for path in auth.write(roles, out, tls_ca):
        typer.echo(str(path))
