"""`agentrt inbox`: serve the approval inbox for one database until interrupted."""

from __future__ import annotations

import signal
import sys

import anyio
import click

from ..inbox import (
    DEFAULT_LISTEN,
    InboxError,
    Listener,
    parse_listen,
    read_or_create_token,
    running_inbox,
)
from ..store import Store
from ._app import EXIT_UNUSABLE, CommandError, Settings, login_name, open_for_deciding

__all__ = ["inbox"]


async def _serve(store: Store, listener: Listener, token: str | None) -> None:
    async with running_inbox(store, listener, token=token, login=login_name()) as running:
        # The first line of stdout, and the only place the token is ever printed.
        click.echo(f"inbox: {running.address_with_token}")
        sys.stdout.flush()
        click.echo(
            f"agentrt inbox: serving {store.path} at {running.address}; Ctrl-C stops", err=True
        )
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for _received in signals:
                return


@click.command(short_help="Serve the approval inbox, a local web page.")
@click.option(
    "--listen",
    default=DEFAULT_LISTEN,
    show_default=True,
    metavar="HOST:PORT",
    help="Where to listen; port 0 picks a free one. Loopback unless --allow-remote.",
)
@click.option(
    "--token-file",
    metavar="FILE",
    help="Keep the token in FILE (created owner-only) instead of a fresh one each start.",
)
@click.option("--allow-remote", is_flag=True, help="Allow a non-loopback --listen (needs TLS).")
@click.option("--tls-cert", metavar="FILE", help="TLS certificate (PEM) for a remote listener.")
@click.option("--tls-key", metavar="FILE", help="TLS private key (PEM) for a remote listener.")
@click.pass_obj
def inbox(
    settings: Settings,
    listen: str,
    token_file: str | None,
    allow_remote: bool,
    tls_cert: str | None,
    tls_key: str | None,
) -> None:
    """Serve the approval inbox: a local web page to see and decide waiting approvals.

    The first line printed is the address to open, with its token.
    """
    try:
        listener = parse_listen(
            listen, allow_remote=allow_remote, tls_cert=tls_cert, tls_key=tls_key
        )
        token = read_or_create_token(token_file) if token_file is not None else None
    except InboxError as error:
        raise CommandError(str(error), EXIT_UNUSABLE) from error
    with open_for_deciding(settings) as store:
        anyio.run(_serve, store, listener, token)
