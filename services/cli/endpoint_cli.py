"""`quotasched endpoint`: the AWS Batch endpoint as a process of its own (the "API process"),
in front of a NATS server the scheduler already uses.

    quotasched auth generate --config examples/shares.yaml --out nats-auth
    quotasched endpoint --nats-url nats://127.0.0.1:4222 --keys nats-auth/endpoint-keys.json
    set -a; . nats-auth/creds/pipeline-q-qs1.env; set +a    # AWS_ACCESS_KEY_ID, ... of q/qs1
    aws batch --endpoint-url http://127.0.0.1:PORT submit-service-job ...

With --keys every request must be SigV4-signed by a key of the file and is performed as that
key's role (`services.endpoint.roles`); without it, nothing is checked, so it serves loopback
only, with the process's own NATS credentials (as `quotasched up` does).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, NoReturn, Optional

import typer

DEFAULT_HOST = "127.0.0.1"

NatsUrl = Annotated[
    Optional[str],
    typer.Option(
        "--nats-url",
        envvar="QUOTASCHED_NATS_URL",
        help="The NATS server (or cluster seeds, comma-separated) the scheduler uses; required.",
    ),
]


def register(app: typer.Typer) -> None:
    app.command("endpoint")(endpoint)


def endpoint(
    nats_url: NatsUrl = None,
    keys: Annotated[
        Optional[Path],
        typer.Option(
            "--keys",
            envvar="QUOTASCHED_ENDPOINT_KEYS",
            help="The access keys (endpoint-keys.json of `quotasched auth generate`): requests "
            "must be signed by one and run as its role. Without it nothing is checked and "
            "only loopback is served.",
            show_default=False,
        ),
    ] = None,
    host: Annotated[
        str,
        typer.Option("--host", help="Address to listen on (other than loopback only with --keys)."),
    ] = DEFAULT_HOST,
    port: Annotated[
        int, typer.Option("--port", min=0, max=65535, help="Port to listen on (0: a free one).")
    ] = 0,
) -> None:
    """Serve the AWS Batch API (rest-json, for `aws batch --endpoint-url` and boto3) in front
    of a running scheduler's NATS server.

    The first line printed is `AWS_ENDPOINT_URL_BATCH=http://HOST:PORT`.  With --keys, an
    unsigned request, an unknown key, a wrong or expired signature is refused as AWS refuses
    it (403), and whatever the key's role may not do on NATS is AccessDeniedException (403).
    Exit status 2: no --nats-url, a keys file that cannot be used, a port that is taken, or a
    non-loopback --host without --keys.  Ctrl-C or SIGTERM stops it.
    """
    import asyncio

    from quotasched.services import logs
    from quotasched.services.endpoint.roles import KeysError, load_keys
    from quotasched.services.endpoint.server import is_loopback

    if nats_url is None:
        _refuse("--nats-url (or QUOTASCHED_NATS_URL) is required")
    if keys is None and not is_loopback(host):
        _refuse(f"without --keys nothing is checked, so only loopback is served, not {host}: "
                "give --keys (the endpoint-keys.json of `quotasched auth generate`)")  # fmt: skip
    try:
        loaded = load_keys(keys) if keys is not None else None
    except KeysError as error:
        _refuse(error)
    logs.configure()
    asyncio.run(_serve(nats_url, loaded, host, port))


async def _serve(nats_url: str, keys, host: str, port: int) -> None:
    """Until SIGINT or SIGTERM; the URL announced first."""
    import asyncio
    import signal

    from quotasched.services.nats.bus import Unreachable
    from quotasched.services.client import Bus
    from quotasched.services.endpoint.server import Endpoint, EndpointError

    bus = None
    try:
        if keys is None:  # the process's own credentials (the environment) for every request
            bus = await Bus(nats_url, name="quotasched-aws-endpoint").__aenter__()
        server = await Endpoint(bus, port, host=host, keys=keys, nats_url=nats_url).start()
    except (EndpointError, Unreachable) as error:
        if bus is not None:
            await bus.close()
        _refuse(error)
    print(f"AWS_ENDPOINT_URL_BATCH={server.url}", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await server.close()
        if bus is not None:
            await bus.close()


def _refuse(reason: object) -> NoReturn:
    """The endpoint cannot start: one line, exit status 2."""
    typer.echo(f"quotasched endpoint: {reason}", err=True)
    raise typer.Exit(2) from None
