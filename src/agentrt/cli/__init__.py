"""The `agentrt` operator command: see what agents did and decide what they may do next.

`cli` is the click group; `main()` is the console script's entry point.
Global options come before the subcommand: `--db PATH` (or `AGENTRT_DB`)
and `--json` (JSON Lines instead of aligned text).  Exit 0 is success, 1 a
refusal or a check that failed, 2 bad usage or an unusable database.
"""

from __future__ import annotations

import click

from ._app import AgentrtGroup, Settings
from ._classify import classify
from ._decide import approve, cancel, reject
from ._export import export
from ._inbox import inbox
from ._init import init
from ._inspect import events, runs, show, verify
from ._output import Output
from ._recheck import recheck
from ._servers import check, demo, pin, proxy

__all__ = ["cli", "main"]


@click.group(cls=AgentrtGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--db",
    "database",
    envvar="AGENTRT_DB",
    metavar="PATH",
    help="The database of runs, approvals and events: a file, or a postgresql:// URL "
    "(or AGENTRT_DB). It is never created here.",
)
@click.option("--json", "json_lines", is_flag=True, help="Print JSON Lines instead of text.")
@click.pass_context
def cli(context: click.Context, database: str | None, json_lines: bool) -> None:
    """See what agents did and decide what they may do next."""
    context.obj = Settings(database=database, output=Output(json=json_lines))


for _command in (
    runs,
    show,
    events,
    approve,
    reject,
    cancel,
    verify,
    inbox,
    export,
    init,
    pin,
    classify,
    check,
    proxy,
    demo,
):
    cli.add_command(_command)
cli.add_command(recheck)


def main() -> None:
    """Entry point of the `agentrt` console script."""
    cli(prog_name="agentrt")
