"""`approve`, `reject`, `cancel`: the operator's decisions, recorded in the database.

An approval is a hash, not a yes.  The command prints the waiting request,
hashes exactly the fields it printed, and decides against that hash; the
store then refuses if the row changed in between (edited in the database, or
replaced by a newer approval).  Nobody is asked without a terminal: a script
names the approval it means (`--approval ID`) or says `--yes`.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from typing import Final, TypeVar

import click

from .. import approvals, grants
from ..errors import AgentrtError
from ..grants import GrantRequest
from ..inbox.review import displayed_hash
from ..mcp import parse_duration
from ..sanitize import sanitize
from ..store import (
    ApprovalRecord,
    ApprovalStatus,
    StandingGrant,
    Store,
    epoch_to_iso,
    in_passkey_mode,
)
from ._app import CommandError, Settings, login_name, open_for_deciding, open_for_reading
from ._inspect import approval_json
from ._review import review_lines

__all__ = ["approve", "cancel", "reject"]

_Decorated = TypeVar("_Decorated", bound=Callable[..., object])

_APPROVE: Final = "approve"
_REJECT: Final = "reject"
# The most runs `approve` without a run looks through for waiting requests.
_LISTED: Final = 200


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


def _requested_reason(store: Store, approval: ApprovalRecord) -> str:
    """The reason the approval was asked for, as its `approval_requested` event holds it."""
    for event in store.list_events(approval.run_id, limit=10_000):
        if event.type == "approval_requested" and event.payload.get("approval_id") == (
            approval.approval_id
        ):
            return sanitize(str(event.payload.get("reason", "")))
    return "-"


def _hash_of_what_was_shown(approval: ApprovalRecord) -> str:
    # Recomputed from the fields printed, not copied from the row's stored
    # hash: a row edited in the database keeps its old hash, and deciding
    # against that would approve text nobody was shown.
    return displayed_hash(approval)


PASSKEY_MODE_REFUSAL: Final = (
    "this database is decided with approvers' passkeys (passkey mode): decide in the inbox "
    "at http://localhost:PORT, where your passkey signs the decision"
)


def _refuse_in_passkey_mode(store: Store) -> None:
    # A label typed at a terminal proves nobody; a shell the model drives could type it.
    if in_passkey_mode(store):
        raise CommandError(PASSKEY_MODE_REFUSAL)


def _decide(
    settings: Settings,
    verdict: str,
    run_id: str,
    approval_id: str | None,
    by: str,
    note: str | None,
    yes: bool,
    full: bool,
    grant: GrantRequest | None = None,
) -> None:
    output = settings.output
    with open_for_deciding(settings) as store:
        _refuse_in_passkey_mode(store)
        approval = _find_waiting(store, run_id, approval_id)
        shown_hash = _hash_of_what_was_shown(approval)
        # The grant's scope is checked and shown before anyone is asked; a refusal decides nothing.
        scope = None if grant is None else grants.grant_scope(store, approval, grant)
        if output.json:
            output.record(approval_json(approval))
            if scope is not None:
                output.record(_scope_json(scope))
        else:
            for line in review_lines(approval, full=full):
                output.line(line)
            if approval.kind.startswith("flow:"):
                # Why a flow rule holds it: the session and its earlier calls (docs/flows.md).
                output.line(f"why: {_requested_reason(store, approval)}")
            for line in scope.lines() if scope is not None else ():
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
        if verdict == _APPROVE:
            decided = approvals.approve(
                store,
                run_id,
                approval_hash=shown_hash,
                approval_id=approval.approval_id,
                by=by,
                note=note or "",
                grant=(
                    None
                    if grant is None or scope is None
                    else dataclasses.replace(grant, scope_hash=scope.scope_hash)
                ),
            )
        else:
            decided = approvals.reject(
                store,
                run_id,
                approval_hash=shown_hash,
                approval_id=approval.approval_id,
                by=by,
                note=note or "",
            )
        given = (
            None
            if scope is None
            else next(
                (g for g in grants.list_grants(store) if g.approval_id == decided.approval_id),
                None,
            )
        )
        # A proxy run resumes when the host asks again, not when a program resumes it.
        proxy_run = "proxy_session" in (store.get_run(run_id).metadata or {})
    if output.json:
        output.record({**approval_json(decided), "record": "decision"})
        if given is not None:
            output.record(grant_json(given))
        return
    if given is not None:
        output.line(
            f"standing grant {given.grant_id} covers further calls of {sanitize(given.tool)} "
            f"until {epoch_to_iso(given.expires_at)}; end it with: agentrt revoke {given.grant_id}"
        )
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
@click.argument("run_id", metavar="[RUN]", required=False)
@_approval_option
@_by_option("decided")
@click.option("--note", default="", help="A note kept with the decision.")
@click.option(
    "--grant-calls",
    type=click.IntRange(min=1),
    metavar="N",
    help="Also grant the next N calls of this tool in this proxy session (a standing grant).",
)
@click.option(
    "--grant-for",
    metavar="DURATION",
    help="A standing grant lasting DURATION (1h, 30m; at most the operator's maximum).",
)
@click.option(
    "--grant-when",
    metavar="CEL",
    help="A standing grant covering only calls whose arguments satisfy CEL (as a rule's when).",
)
@_yes_option
@_full_option
@click.pass_obj
def approve(
    settings: Settings,
    run_id: str | None,
    approval_id: str | None,
    by: str,
    note: str,
    grant_calls: int | None,
    grant_for: str | None,
    grant_when: str | None,
    yes: bool,
    full: bool,
) -> None:
    """Approve the request RUN waits on, exactly as printed.

    Without RUN, list what waits (in the database given, or the one of the
    configuration agentrt init wrote) and, at a terminal, decide one by one.

    With --grant-calls, --grant-for or --grant-when, the approval also gives a
    standing grant: later calls of the same tool in the same proxy session run
    without asking, within what the grant and the operator's maximum allow.
    """
    if run_id is None:
        if approval_id is not None:
            raise click.UsageError("--approval names an approval of RUN: give RUN too")
        _choose_and_decide(settings, by, full)
        return
    grant = None
    if grant_calls is not None or grant_for is not None or grant_when is not None:
        grant = GrantRequest(
            seconds=None if grant_for is None else _duration(grant_for),
            calls=grant_calls,
            when=grant_when,
        )
    _decide(settings, _APPROVE, run_id, approval_id, by, note, yes, full, grant)


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--grant-for") from None


def _scope_json(scope: grants.GrantScope) -> dict[str, object]:
    return {"record": "grant_scope", **scope.scope, "scope_hash": scope.scope_hash}


def grant_json(grant: StandingGrant) -> dict[str, object]:
    """A standing grant as one JSON Lines record."""
    return {
        "record": "grant",
        "grant_id": grant.grant_id,
        "status": str(grant.status),
        "session": grant.session,
        "tool": grant.tool,
        "when": grant.condition,
        "calls_given": grant.calls_given,
        "calls_left": grant.calls_left,
        "expires_at": epoch_to_iso(grant.expires_at),
        "approval_id": grant.approval_id,
        "given_by": grant.given_by,
        "scope_hash": grant.scope_hash,
    }


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


def _waiting_now(store: Store) -> list[ApprovalRecord]:
    """The approvals that wait for a person's decision, oldest first (a bounded page)."""
    waiting = []
    for run in store.list_runs(limit=_LISTED):
        approval = store.waiting_approval(run.run_id)
        if approval is not None and approval.status is ApprovalStatus.PENDING:
            waiting.append(approval)
    return sorted(waiting, key=lambda approval: approval.created_at)


def _choose_and_decide(settings: Settings, by: str, full: bool) -> None:
    """`agentrt approve` with no run: list what waits and, at a terminal, decide each in turn."""
    output = settings.output
    with open_for_reading(settings) as store:
        _refuse_in_passkey_mode(store)
        waiting = _waiting_now(store)
    if output.json:
        for approval in waiting:
            output.record(approval_json(approval))
    else:
        if not waiting:
            output.line("nothing waits for a decision")
        for number, approval in enumerate(waiting, 1):
            output.line(
                f"{number}. approval {sanitize(approval.approval_id)}: {sanitize(approval.tool)} "
                f"({sanitize(approval.kind)}), run {sanitize(approval.run_id)}, waiting since "
                f"{approval.created_at}"
            )
    if not waiting or output.json:
        return
    if not _at_a_terminal():
        raise CommandError(
            f"{len(waiting)} request(s) wait; without a terminal to ask at, name one: "
            "agentrt approve RUN --approval ID (or agentrt reject RUN --approval ID)"
        )
    for approval in waiting:
        choice = click.prompt(
            f"approval {sanitize(approval.approval_id)} ({sanitize(approval.tool)}): "
            "approve, reject or skip?",
            type=click.Choice(["a", "r", "s"]),
            default="s",
            err=True,
        )
        if choice == "s":
            continue
        verdict = _APPROVE if choice == "a" else _REJECT
        try:
            _decide(
                settings, verdict, approval.run_id, approval.approval_id, by,
                "" if verdict == _APPROVE else None, False, full,
            )  # fmt: skip
        except (CommandError, AgentrtError) as error:
            # One request moved on (decided elsewhere, expired): the others still wait.
            output.line(f"skipped {sanitize(approval.approval_id)}: {sanitize(str(error))}")
