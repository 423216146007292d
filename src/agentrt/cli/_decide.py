"""`approve`, `reject`, `cancel`: the operator's decisions, recorded in the database.

An approval is a hash, not a yes.  The command prints the waiting request,
hashes exactly the fields it printed, and decides against that hash; the
store then refuses if the row changed in between (edited in the database, or
replaced by a newer approval).  Nobody is asked without a terminal: a script
names the approval it means (`--approval ID`) or says `--yes`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeVar

import click

from .. import approvals
from ..canonical import canonical_json
from ..inbox.review import (
    TextReview,
    displayed_hash,
    edits_of,
    parsed_arguments,
    size_of,
    text_review,
)
from ..sanitize import sanitize
from ..store import ApprovalRecord, ApprovalStatus, Store
from ._app import CommandError, Settings, login_name, open_for_deciding
from ._inspect import _epoch, approval_json
from ._output import bounded, jsonable

__all__ = ["approve", "cancel", "reject"]

_Decorated = TypeVar("_Decorated", bound=Callable[..., object])

_APPROVE: Final = "approve"
_REJECT: Final = "reject"

SHORT_VALUE: Final = 80
"""A one-line string this long or shorter is printed as it is, without its size."""
ALL_LINES_UP_TO: Final = 60
"""Content of this many lines or fewer is printed in full."""
HEAD_LINES: Final = 40
TAIL_LINES: Final = 10
LINE_WIDTH: Final = 300
"""Characters of one content line printed before its middle is cut (without --full)."""
_INDENT: Final = "    "


def _one_line(text: str, full: bool) -> str:
    if full or len(text) <= LINE_WIDTH:
        return sanitize(text)
    return bounded(text, head=LINE_WIDTH * 2 // 3, tail=LINE_WIDTH // 3)


def _numbered(review: TextReview, raw_lines: list[str], full: bool) -> list[str]:
    """Numbered content lines, the middle of a long text cut with a count of what is hidden."""
    width = len(str(review.line_count))
    numbers = list(range(review.line_count))
    if not full and review.line_count > ALL_LINES_UP_TO:
        hidden = review.line_count - HEAD_LINES - TAIL_LINES
        head, tail = numbers[:HEAD_LINES], numbers[-TAIL_LINES:]
        return [
            *(f"{_INDENT}{n + 1:>{width}}  {_one_line(raw_lines[n], full)}" for n in head),
            f"{_INDENT}{'':>{width}}  … {hidden} lines not shown (--full prints every line) …",
            *(f"{_INDENT}{n + 1:>{width}}  {_one_line(raw_lines[n], full)}" for n in tail),
        ]
    return [f"{_INDENT}{n + 1:>{width}}  {_one_line(raw_lines[n], full)}" for n in numbers]


def _text_value(text: str, full: bool) -> tuple[str, list[str]]:
    """A string as a field value, plus the lines printed under it when it has several."""
    if "\n" not in text:
        if len(text) <= SHORT_VALUE:
            return sanitize(text), []
        return f"{_one_line(text, full)}  ({size_of(text)})", []
    review = text_review(text)
    ending = ", ends with a newline" if review.ends_with_newline else ""
    body = text[:-1] if review.ends_with_newline else text
    return f"{review.line_count} lines, {review.size}{ending}:", _numbered(
        review, body.split("\n"), full
    )


def _value(value: Any, full: bool) -> tuple[str, list[str]]:
    if value is None:
        return "-", []
    if isinstance(value, str):
        return _text_value(value, full)
    if isinstance(value, bool):
        return ("true" if value else "false"), []
    if isinstance(value, int):
        return str(value), []
    encoded = canonical_json(jsonable(value))
    if len(encoded) <= SHORT_VALUE:
        return sanitize(encoded), []
    return f"{_one_line(encoded, full)}  ({size_of(encoded)} of JSON)", []


_Row = tuple[str, str, list[str]]


def _members(prefix: str, value: Any, full: bool, same_as: Mapping[str, str]) -> list[_Row]:
    if isinstance(value, Mapping) and value:
        rows: list[_Row] = []
        for key, item in value.items():
            name = f"{prefix}.{bounded(str(key), 40, 10)}"
            if key in same_as:
                rows.append((name, same_as[key], []))
            else:
                rows.append((name, *_value(item, full)))
        return rows
    return [(prefix, *_value(value, full))]


def _echoes(approval: ApprovalRecord, arguments: Any) -> dict[str, str]:
    """Presentation members that repeat the arguments exactly, said once instead of twice.

    Only an exact copy (or an exact prefix, for a preview) is folded: a
    presentation that says anything else is printed in full.
    """
    presentation = approval.presentation
    folded: dict[str, str] = {}
    if not isinstance(presentation, Mapping) or not isinstance(arguments, Mapping):
        return folded
    shown = presentation.get("arguments")
    if shown is not None and jsonable(shown) == jsonable(arguments):
        folded["arguments"] = "(exactly the arguments printed below)"
    preview = presentation.get("preview")
    if isinstance(preview, str) and preview:
        for name, item in arguments.items():
            if isinstance(item, str) and item.startswith(preview):
                what = "all" if item == preview else f"the first {len(preview)} characters"
                folded["preview"] = f"({what} of arguments.{sanitize(str(name))}, below)"
                break
    return folded


def review_lines(approval: ApprovalRecord, *, full: bool = False) -> list[str]:
    """The approval as the operator reads it before deciding: one field a line, names aligned,
    multi-line content as numbered lines under its field, and edits as a diff."""
    arguments = parsed_arguments(approval)
    echoes = _echoes(approval, arguments)
    rows: list[_Row] = [
        ("approval", sanitize(approval.approval_id), []),
        ("run", sanitize(approval.run_id), []),
        ("step", str(approval.step), []),
        ("status", str(approval.status), []),
        ("tool", *_value(approval.tool, full)),
        ("kind", *_value(approval.kind, full)),
        *_members("capability", approval.capability, full, {}),
        *_members("presentation", approval.presentation, full, echoes),
    ]
    if isinstance(arguments, Mapping) and arguments:
        rows.append(("arguments", f"{size_of(approval.args)} of JSON:", []))
        rows.extend(_members("arguments", arguments, full, {}))
    else:
        rows.append(("arguments", *_value(approval.args, full)))
    for edit in edits_of(arguments):
        diff = [
            f"{_INDENT}{line.sign if line.sign != '@' else ''} {line.text}" for line in edit.diff
        ]
        rows.append((edit.label, f"old {edit.old.size}, new {edit.new.size}, as a diff:", diff))
    rows += [
        ("created", approval.created_at, []),
        ("expires", "-" if approval.expires_at is None else _epoch(approval.expires_at), []),
        ("hash", displayed_hash(approval), []),
    ]
    width = max(len(name) for name, _, _ in rows)
    lines: list[str] = []
    for name, value, under in rows:
        lines.append(f"{name.ljust(width)}  {value}".rstrip())
        lines.extend(under)
    return lines


def _at_a_terminal() -> bool:
    """Whether a person can answer: standard input is a terminal."""
    return sys.stdin.isatty()


def _find_waiting(store: Store, run_id: str, approval_id: str | None) -> ApprovalRecord:
    if approval_id is None:
        run = store.get_run(run_id)
        approval = store.waiting_approval(run_id)
        if approval is None:
            raise CommandError(
                f"run {sanitize(run_id)} is not waiting for a decision (it is {run.status})"
            )
        if approval.status is not ApprovalStatus.PENDING:
            raise CommandError(
                f"run {sanitize(run_id)} is not waiting for a decision: its approval "
                f"{sanitize(approval.approval_id)} is {approval.status} and waits for its "
                "program to resume the run"
            )
        return approval
    approval = store.get_approval(approval_id)
    if approval.run_id != run_id:
        raise CommandError(
            f"approval {sanitize(approval_id)} belongs to run {sanitize(approval.run_id)}, "
            f"not {sanitize(run_id)}"
        )
    if approval.status is not ApprovalStatus.PENDING:
        raise CommandError(
            f"approval {sanitize(approval_id)} is {approval.status}, not waiting for a decision"
        )
    return approval


def _hash_of_what_was_shown(approval: ApprovalRecord) -> str:
    # Recomputed from the fields printed, not copied from the row's stored
    # hash: a row edited in the database keeps its old hash, and deciding
    # against that would approve text nobody was shown.
    return displayed_hash(approval)


def _decide(
    settings: Settings,
    verdict: str,
    run_id: str,
    approval_id: str | None,
    by: str,
    note: str | None,
    yes: bool,
    full: bool,
) -> None:
    output = settings.output
    with open_for_deciding(settings) as store:
        approval = _find_waiting(store, run_id, approval_id)
        shown_hash = _hash_of_what_was_shown(approval)
        if output.json:
            output.record(approval_json(approval))
        else:
            for line in review_lines(approval, full=full):
                output.line(line)
            if verdict == _REJECT and (note is not None or yes or not _at_a_terminal()):
                # Without a terminal to ask at, an unnamed note is no note.
                output.line(f"the model will be told: {sanitize(note) if note else '-'}")
        asked = False
        if not yes:
            if _at_a_terminal():
                asked = True
                if not click.confirm(
                    f"{verdict.capitalize()} approval {sanitize(approval.approval_id)}?",
                    err=True,
                ):
                    raise CommandError(
                        f"nothing was decided; approval {sanitize(approval.approval_id)} "
                        f"still waits (run {sanitize(run_id)})"
                    )
            elif approval_id is None:
                raise CommandError(
                    f"no terminal to ask at: to {verdict} this request, name it with "
                    f"--approval {sanitize(approval.approval_id)} (or pass --yes)"
                )
        if verdict == _REJECT and note is None:
            note = ""
            if asked:
                note = click.prompt(
                    "What should the model be told? (empty for nothing)",
                    default="",
                    show_default=False,
                    err=True,
                )
        decide = approvals.approve if verdict == _APPROVE else approvals.reject
        decided = decide(
            store,
            run_id,
            approval_hash=shown_hash,
            approval_id=approval.approval_id,
            by=by,
            note=note or "",
        )
        # A proxy run resumes when the host asks again, not when a program resumes it.
        proxy_run = "proxy_session" in (store.get_run(run_id).metadata or {})
    if output.json:
        output.record({**approval_json(decided), "record": "decision"})
        return
    if verdict == _APPROVE:
        if proxy_run:
            output.line(
                f"approved {sanitize(decided.approval_id)}; the next identical call to "
                f"{sanitize(decided.tool)} through the proxy runs it"
            )
        else:
            output.line(
                f"approved {sanitize(decided.approval_id)}; run {sanitize(run_id)} executes this "
                "exact request when its program resumes it"
            )
    else:
        told = f"; the model is told: {sanitize(decided.note)}" if decided.note else ""
        output.line(
            f"rejected {sanitize(decided.approval_id)}; run {sanitize(run_id)} is cancelled{told}"
        )


_approval_option = click.option(
    "--approval",
    "approval_id",
    metavar="ID",
    help="The approval meant (as printed); needed without a terminal unless --yes.",
)
_yes_option = click.option("--yes", is_flag=True, help="Decide without asking.")
_full_option = click.option(
    "--full", is_flag=True, help="Print every line of long content (it is cut head and tail)."
)


def _by_option(verb: str) -> Callable[[_Decorated], _Decorated]:
    return click.option(
        "--by",
        metavar="NAME",
        default=login_name,
        show_default="your login name",
        help=f"Who {verb}, recorded as a label (it proves nothing).",
    )


@click.command()
@click.argument("run_id", metavar="RUN")
@_approval_option
@_by_option("decided")
@click.option("--note", default="", help="A note kept with the decision.")
@_yes_option
@_full_option
@click.pass_obj
def approve(
    settings: Settings,
    run_id: str,
    approval_id: str | None,
    by: str,
    note: str,
    yes: bool,
    full: bool,
) -> None:
    """Approve the request RUN waits on, exactly as printed."""
    _decide(settings, _APPROVE, run_id, approval_id, by, note, yes, full)


@click.command(short_help="Reject the request RUN waits on; the run is cancelled.")
@click.argument("run_id", metavar="RUN")
@_approval_option
@_by_option("decided")
@click.option(
    "--note",
    default=None,
    help="What the model is told about the rejection (asked for at a terminal).",
)
@_yes_option
@_full_option
@click.pass_obj
def reject(
    settings: Settings,
    run_id: str,
    approval_id: str | None,
    by: str,
    note: str | None,
    yes: bool,
    full: bool,
) -> None:
    """Reject the request RUN waits on; the run is cancelled and the model told --note."""
    _decide(settings, _REJECT, run_id, approval_id, by, note, yes, full)


@click.command()
@click.argument("run_id", metavar="RUN")
@_by_option("cancelled")
@click.pass_obj
def cancel(settings: Settings, run_id: str, by: str) -> None:
    """End a run that has not ended, as operator_cancelled."""
    output = settings.output
    with open_for_deciding(settings) as store:
        run = approvals.cancel(store, run_id, by=by)
    if output.json:
        output.record(
            {"record": "run", "run_id": run.run_id, "status": str(run.status), "reason": run.reason}
        )
        return
    output.line(f"run {sanitize(run.run_id)} is {run.status} ({sanitize(run.reason)})")
