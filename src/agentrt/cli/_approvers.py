"""`agentrt approvers add/list/remove`: the people who decide in passkey mode."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import anyio
import click

from ..errors import AgentrtError
from ..passkeys import RegistryError, read_registry
from ..passkeys._registry import require_webauthn
from ..sanitize import sanitize
from ._app import EXIT_REFUSED, EXIT_UNUSABLE, CommandError, Settings, init_config_path

__all__ = ["approvers"]

_registry_option = click.option(
    "--registry",
    metavar="FILE",
    help="The approvers' registry (owner-only JSON); default: approvers.json beside the "
    "configuration agentrt init writes.",
)


def _registry_path(registry: str | None) -> Path:
    return Path(registry) if registry is not None else init_config_path().parent / "approvers.json"


@click.group()
def approvers() -> None:
    """The approvers who decide with a passkey (WebAuthn) in passkey mode."""


async def _register(path: Path, name: str, subject: str, port: int, wait: float) -> str:
    import uvicorn

    from ..inbox._serve import Listener, _bind, _Server
    from ..passkeys._register import Registration, registration_app

    sock = _bind(Listener("127.0.0.1", port))
    registration = Registration(path, name, subject, port=sock.getsockname()[1])
    server = _Server(
        uvicorn.Config(
            registration_app(registration), log_level="warning", access_log=False,
            lifespan="off", server_header=False, timeout_graceful_shutdown=1,
        )
    )  # fmt: skip
    async with anyio.create_task_group() as group:
        group.start_soon(lambda: server.serve(sockets=[sock]))
        while not server.started:
            if server.should_exit:
                break
            await anyio.sleep(0.01)
        click.echo(f"register: {registration.origin}/#token={registration.token}")
        sys.stdout.flush()
        click.echo(
            f"agentrt approvers: open that address in the browser whose passkey "
            f"{sanitize(name)} will use; waiting {wait:.0f} s",
            err=True,
        )
        try:
            with (
                anyio.move_on_after(wait),
                anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals,
            ):
                async with anyio.create_task_group() as waiting:

                    async def interrupted() -> None:
                        async for _received in signals:
                            waiting.cancel_scope.cancel()

                    waiting.start_soon(interrupted)
                    await registration.done.wait()
                    waiting.cancel_scope.cancel()
        finally:
            server.should_exit = True
    sock.close()
    if registration.added is None:
        raise CommandError(
            f"no passkey was registered for {sanitize(name)}; nothing was added", EXIT_REFUSED
        )
    return registration.added.name


@approvers.command("add")
@click.argument("name")
@click.option("--subject", required=True, metavar="SUB", help="The principal subject NAME is.")
@_registry_option
@click.option("--port", default=0, type=click.IntRange(0, 65535), help="The page's port (0: any).")
@click.option("--wait", default=300.0, type=click.FloatRange(1), help="Seconds to wait.")
def add(name: str, subject: str, registry: str | None, port: int, wait: float) -> None:
    """Register NAME's passkey: print a page's address to open, and add NAME (as principal
    SUB) to the registry once the browser's authenticator made the passkey."""
    path = _registry_path(registry)
    if not name.strip() or not subject.strip():
        raise click.BadParameter("must not be empty", param_hint="NAME or --subject")
    try:
        require_webauthn()
        known = read_registry(path, missing_ok=True)
    except RegistryError as error:
        raise CommandError(str(error), EXIT_UNUSABLE) from error
    if known.by_name(name) is not None:
        raise CommandError(f"approver {sanitize(name)} is already registered; remove it first")
    try:
        added = anyio.run(_register, path, name, subject, port, wait)
    except AgentrtError as error:
        raise CommandError(sanitize(str(error))) from error
    click.echo(f"approver {sanitize(added)} added to {sanitize(str(path))}")


@approvers.command("list")
@_registry_option
@click.pass_obj
def list_approvers(settings: Settings, registry: str | None) -> None:
    """List the registered approvers: name, principal subject, when added."""
    try:
        found = read_registry(_registry_path(registry), missing_ok=True)
    except RegistryError as error:
        raise CommandError(str(error), EXIT_UNUSABLE) from error
    for approver in found.approvers:
        if settings.output.json:
            settings.output.record(
                {"record": "approver", "name": approver.name, "subject": approver.subject,
                 "added_at": approver.added_at}
            )  # fmt: skip
        else:
            settings.output.line(
                f"{sanitize(approver.name)}  {sanitize(approver.subject)}  {approver.added_at}"
            )


@approvers.command("remove")
@click.argument("name")
@_registry_option
def remove(name: str, registry: str | None) -> None:
    """Remove approver NAME: their passkey decides nothing from now on."""
    from ..passkeys._register import remove_approver

    path = _registry_path(registry)
    try:
        remove_approver(path, name)
    except RegistryError as error:
        raise CommandError(str(error)) from error
    click.echo(f"approver {sanitize(name)} removed from {sanitize(str(path))}")
