"""The `agentrt` group: global options, how the database is opened, and exit codes.

Exit 0 is success, 1 a refusal or a check that failed, 2 bad usage or a
database (or configuration) that cannot be used.  Every error is one line on
stderr, `agentrt: <sentence>`, with anything a model, a server or a file
chose escaped.
"""

from __future__ import annotations

import getpass
import importlib
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Final

import click

from ..errors import AgentrtError, StoreError
from ..sanitize import sanitize
from ..store import DATABASE_ERRORS, Store, open_store
from ._output import Output

__all__ = [
    "EXIT_REFUSED",
    "EXIT_UNUSABLE",
    "AgentrtGroup",
    "CommandError",
    "Settings",
    "configured_database",
    "init_config_path",
    "login_name",
    "open_for_deciding",
    "open_for_reading",
]

EXIT_REFUSED: Final = 1
EXIT_UNUSABLE: Final = 2


class CommandError(click.ClickException):
    """A one-sentence refusal or failure with its exit code, printed as `agentrt: …`."""

    def __init__(self, message: str, exit_code: int = EXIT_REFUSED) -> None:
        super().__init__(message)
        self.exit_code = exit_code

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"agentrt: {self.format_message()}", err=True)


@dataclass(frozen=True, slots=True)
class Settings:
    """The global options every subcommand receives."""

    database: str | None
    output: Output


class AgentrtGroup(click.Group):
    """The command group; turns the runtime's typed errors into exit codes.

    `lazy_commands` maps a command's name to `module:attribute` (relative to
    this package), imported only when that command runs or its help is shown:
    `agentrt approve` need not import the MCP SDK, the web inbox or the
    proxy, which cost most of a second each time the command starts.
    """

    def __init__(
        self, *args: Any, lazy_commands: Mapping[str, str] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.lazy_commands = dict(lazy_commands or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        # In the order an operator meets them (look, decide, check, serve),
        # not alphabetically.
        return [
            *self.lazy_commands,
            *(name for name in self.commands if name not in self.lazy_commands),
        ]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        where = self.lazy_commands.get(cmd_name)
        if where is None or cmd_name in self.commands:
            return super().get_command(ctx, cmd_name)
        module_name, _, attribute = where.partition(":")
        command = getattr(importlib.import_module(module_name, __package__), attribute)
        if not isinstance(command, click.Command):
            raise TypeError(f"{where} is not a click command")
        self.add_command(command, cmd_name)
        return command

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except StoreError as error:
            raise CommandError(sanitize(str(error)), EXIT_UNUSABLE) from error
        except DATABASE_ERRORS as error:
            # A file that is not an agentrt database (or is damaged) surfaces
            # here; naming it beats a traceback.
            raise CommandError(
                f"the database cannot be read: {sanitize(str(error))}", EXIT_UNUSABLE
            ) from error
        except AgentrtError as error:
            raise CommandError(sanitize(str(error)), EXIT_REFUSED) from error


def _database_path(settings: Settings) -> str:
    if settings.database:
        return settings.database
    configured = configured_database()
    if configured is None:
        raise CommandError(
            "no database given: pass --db PATH, set AGENTRT_DB, or run agentrt init",
            EXIT_UNUSABLE,
        )
    return configured


def init_config_path() -> Path:
    """Where `agentrt init` writes `proxy.json` by default ($XDG_CONFIG_HOME/agentrt)."""
    configured = os.environ.get("XDG_CONFIG_HOME")
    return (Path(configured) if configured else Path.home() / ".config") / "agentrt" / "proxy.json"


def configured_database() -> str | None:
    """The database of the configuration `agentrt init` wrote, if there is one: a person told
    that a call waits needs no path to decide it."""
    path = init_config_path()
    if not path.exists():
        return None
    # The proxy's own reader: the file is owner-checked, and relative paths resolve as the
    # proxy resolves them.  Imported only here (it brings the MCP client with it).
    from ..proxy.config import ConfigError, load_config

    try:
        database = load_config(path).database
    except ConfigError as error:
        raise CommandError(
            f"no --db given, and the configuration agentrt init wrote cannot be read: "
            f"{sanitize(str(error))}",
            EXIT_UNUSABLE,
        ) from error
    return str(database)


def configured_registry() -> str | None:
    """The approvers' registry of the configuration `agentrt init` wrote, when it is in
    passkey mode: `verify` checks a passkey database's decisions with it."""
    path = init_config_path()
    if not path.exists():
        return None
    from ..proxy.config import ConfigError, load_config

    try:
        passkeys = load_config(path).passkeys
    except ConfigError as error:
        raise CommandError(
            f"the configuration agentrt init wrote cannot be read: {sanitize(str(error))}",
            EXIT_UNUSABLE,
        ) from error
    return None if passkeys is None else str(passkeys.registry)


@contextmanager
def open_for_reading(settings: Settings) -> Iterator[Store]:
    """The existing database, opened read-only: never created, migrated or written."""
    store = open_store(_database_path(settings), read_only=True, create=False)
    try:
        yield store
    finally:
        store.close()


@contextmanager
def open_for_deciding(settings: Settings) -> Iterator[Store]:
    """The existing database, opened to record an operator's decision; never created."""
    store = open_store(_database_path(settings), create=False)
    try:
        yield store
    finally:
        store.close()


def login_name() -> str:
    """The login name, used as a label for who decided (it proves nothing)."""
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return ""
