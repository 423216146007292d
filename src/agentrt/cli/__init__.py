"""The `agentrt` operator command: see what agents did and decide what they may do next.

`cli` is the click group; `main()` is the console script's entry point.
Global options come before the subcommand: `--db PATH` (or `AGENTRT_DB`)
and `--json` (JSON Lines instead of aligned text).  Exit 0 is success, 1 a
refusal or a check that failed, 2 bad usage or an unusable database.

`agentrt proxy --config FILE`, the one form a host's configuration starts
every time it opens, is served without importing click (issue 36): a host
waits on the proxy's start-up, and the group adds nothing to that command.
Any other form (another option, `--help`, a global option) goes through the
group as every command does.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._group import cli

__all__ = ["cli", "main"]

_CONFIG_OPTION = "--config="


def __getattr__(name: str) -> Any:
    if name == "cli":
        from ._group import cli

        return cli
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def served_config(argv: list[str]) -> str | None:
    """The configuration `argv` serves if it is exactly `proxy --config FILE` (or
    `proxy --config=FILE`); None for any other command line."""
    match argv:
        case ["proxy", "--config", path] if path and not path.startswith("-"):
            return path
        case ["proxy", option] if option.startswith(_CONFIG_OPTION) and option != _CONFIG_OPTION:
            return option.removeprefix(_CONFIG_OPTION)
    return None


def main() -> None:
    """Entry point of the `agentrt` console script."""
    config = served_config(sys.argv[1:])
    if config is not None:
        from ..proxy._serve import exit_process, serve

        # As the group's `proxy` subcommand serves it: `--token`'s variable, no HTTP.
        token = os.environ.get("AGENTRT_PROXY_TOKEN") or None
        exit_process(serve(config, token=token))
    from ._group import cli

    cli(prog_name="agentrt")
