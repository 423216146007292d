"""The `agentrt` command's click group (`agentrt.cli.cli`): its global options and its
subcommands, each imported only when it runs."""

from __future__ import annotations

from typing import Final

import click

from ._app import AgentrtGroup, Settings
from ._output import Output

__all__ = ["cli"]

# In the order an operator meets them: look, decide, check, serve.  Each is
# imported only when it runs (or its help is shown).
_COMMANDS: Final = {
    "runs": "._inspect:runs",
    "show": "._inspect:show",
    "events": "._inspect:events",
    "approve": "._decide:approve",
    "reject": "._decide:reject",
    "cancel": "._decide:cancel",
    "grants": "._grants:grants_command",
    "revoke": "._grants:revoke",
    "verify": "._inspect:verify",
    "inbox": "._inbox:inbox",
    "approver": "._approver:approver",
    "approvers": "._approvers:approvers",
    "export": "._export:export",
    "init": "._init:init",
    "pin": "._servers:pin",
    "classify": "._classify:classify",
    "check": "._servers:check",
    "proxy": "._servers:proxy",
    "demo": "._servers:demo",
    "recheck": "._recheck:recheck",
    "bench": "._bench:bench",
    "taint": "._taint:taint",
    "login": "._login:login",
    "checkpoint": "._retention:checkpoint",
    "archive": "._retention:archive_command",
    "evidence": "._retention:evidence",
    "verify-evidence": "._retention:verify_evidence_command",
}


@click.group(
    cls=AgentrtGroup,
    lazy_commands=_COMMANDS,
    context_settings={"help_option_names": ["-h", "--help"]},
)
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
