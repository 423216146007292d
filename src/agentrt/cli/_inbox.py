"""`agentrt inbox`: serve the approval inbox for one database until interrupted."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

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
from ..passkeys import PasskeyMode, QuorumRule, RegistryError, read_registry
from ..passkeys._registry import require_webauthn
from ..store import Store
from ._app import EXIT_UNUSABLE, CommandError, Settings, login_name, open_for_deciding

__all__ = ["inbox"]


async def _serve(
    store: Store, listener: Listener, token: str | None, passkeys: PasskeyMode | None = None
) -> None:
    async with running_inbox(
        store, listener, token=token, login=login_name(), passkeys=passkeys
    ) as running:
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
@click.option(
    "--approvers",
    "approvers_file",
    metavar="FILE",
    help="Passkey mode: decide only with the passkeys of the approvers in FILE "
    "(agentrt approvers add); served at http://localhost:PORT.",
)
@click.option(
    "--quorum",
    "quorums",
    multiple=True,
    metavar="CLASS=N",
    help="In passkey mode, N distinct approvers for a tool of side-effect CLASS "
    "(destructive=2); repeatable.",
)
@click.pass_obj
def inbox(
    settings: Settings,
    listen: str,
    token_file: str | None,
    allow_remote: bool,
    tls_cert: str | None,
    tls_key: str | None,
    approvers_file: str | None,
    quorums: tuple[str, ...],
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
    passkeys = None
    if approvers_file is not None:
        try:
            require_webauthn()
            read_registry(approvers_file)  # refused now, not at the first decision
        except RegistryError as error:
            raise CommandError(str(error), EXIT_UNUSABLE) from error
        passkeys = PasskeyMode(Path(approvers_file).resolve(), QuorumRule(_quorum(quorums)))
    elif quorums:
        raise click.UsageError("--quorum needs --approvers (a quorum counts approvers' passkeys)")
    with open_for_deciding(settings) as store:
        anyio.run(_serve, store, listener, token, passkeys)


def _quorum(quorums: tuple[str, ...]) -> dict[str, int]:
    table: dict[str, int] = {}
    for text in quorums:
        name, equals, count = text.partition("=")
        if not equals or not name or not count.isdecimal() or int(count) < 1:
            raise click.BadParameter(f"{text!r} is not CLASS=N", param_hint="--quorum")
        table[name] = int(count)
    return table
