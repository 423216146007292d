"""`agentrt approver serve`: the signed HTTP approver channel for one database."""

from __future__ import annotations

import os
import signal
import sys

import anyio
import click

from ..approver import SECRET_FILE_VARIABLE, SecretError, read_secret
from ..inbox import InboxError, Listener, parse_listen
from ..store import Store
from ._app import EXIT_UNUSABLE, CommandError, Settings, open_for_deciding

__all__ = ["approver"]


async def _serve(store: Store, secret: bytes, listener: Listener) -> None:
    from ..approver._serve import running_approver

    async with running_approver(store, secret, listener) as address:
        click.echo(f"approver: {address}")
        sys.stdout.flush()
        click.echo(f"agentrt approver: serving {store.path} at {address}; Ctrl-C stops", err=True)
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for _received in signals:
                return


@click.group(short_help="The signed HTTP approver channel.")
def approver() -> None:
    """The signed HTTP approver channel: a chat bot or a small page shows and decides
    approvals, every request signed with a shared secret (docs/approvals.md)."""


@approver.command(short_help="Serve the signed approver channel.")
@click.option(
    "--listen",
    required=True,
    metavar="HOST:PORT",
    help="Where to listen; port 0 picks a free one (the first line printed says which).",
)
@click.option(
    "--secret-file",
    metavar="FILE",
    help=f"The shared secret, owner-only, 32 bytes or more (or {SECRET_FILE_VARIABLE}).",
)
@click.pass_obj
def serve(settings: Settings, listen: str, secret_file: str | None) -> None:
    """Serve the approver channel until interrupted.

    The secret is read from a file, never from the command line; whoever holds it can
    decide any approval whose run id they know.  The first line printed is the address.
    """
    secret_file = secret_file or os.environ.get(SECRET_FILE_VARIABLE) or None
    if secret_file is None:
        raise CommandError(
            f"the approver channel needs a secret: --secret-file FILE or {SECRET_FILE_VARIABLE}",
            EXIT_UNUSABLE,
        )
    try:
        secret = read_secret(secret_file)
        listener = parse_listen(listen, allow_remote=True, tls_cert="-", tls_key="-")
    except (SecretError, InboxError) as error:
        raise CommandError(str(error), EXIT_UNUSABLE) from error
    listener = Listener(listener.host, listener.port)
    with open_for_deciding(settings) as store:
        anyio.run(_serve, store, secret, listener)
