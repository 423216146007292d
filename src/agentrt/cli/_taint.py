"""`taint list` and `taint clear`: the operator's view and reset of host sessions' taint.

A host session's taint (the labels of the calls it ran, docs/flows.md) lasts
until the session ends or the operator clears it here (or with the inbox's
button); the clear is recorded in the chain as `taint_cleared`.  The model has
no way to clear it: no tool, no argument, no elicitation reaches this.
"""

from __future__ import annotations

import click

from ..proxy._flows import TaintStore
from ..sanitize import sanitize
from ._app import CommandError, Settings, login_name, open_for_deciding, open_for_reading

__all__ = ["taint"]


@click.group()
def taint() -> None:
    """See and clear the information-flow taint of host sessions (docs/flows.md)."""


@taint.command("list")
@click.pass_obj
def list_sessions(settings: Settings) -> None:
    """Every tainted host session, with each label and the first call that gave it."""
    output = settings.output
    with open_for_reading(settings) as store:
        sessions = TaintStore(store).sessions()
    if output.json:
        for session, held in sessions.items():
            output.record(
                {
                    "record": "taint",
                    "session": session,
                    "labels": [
                        {"label": t.label, "tool": t.tool, "at": t.at, "run_id": t.run_id}
                        for t in held
                    ],
                }
            )
        return
    if not sessions:
        output.line("no host session is tainted")
        return
    output.table(
        ["SESSION", "LABEL", "FIRST FROM", "AT", "RUN"],
        [
            [sanitize(session), sanitize(t.label), sanitize(t.tool), sanitize(t.at),
             sanitize(t.run_id)]
            for session, held in sessions.items()
            for t in held
        ],
    )  # fmt: skip


@taint.command("clear")
@click.argument("session", metavar="SESSION")
@click.option(
    "--by",
    metavar="NAME",
    default=login_name,
    show_default="your login name",
    help="Who cleared it, recorded as a label (it proves nothing).",
)
@click.option("--note", default="", help="Why, recorded with the clear.")
@click.pass_obj
def clear(settings: Settings, session: str, by: str, note: str) -> None:
    """Clear SESSION's taint (as `taint list`, a held approval's reason or the inbox name
    it): its next calls are judged as a fresh session's."""
    output = settings.output
    with open_for_deciding(settings) as store:
        labels = TaintStore(store).clear(session, by, note)
    if not labels:
        raise CommandError(f"host session {sanitize(session)} holds no taint")
    if output.json:
        output.record({"record": "taint_cleared", "session": session, "labels": list(labels)})
        return
    output.line(f"cleared {', '.join(labels)} from host session {sanitize(session)}")
