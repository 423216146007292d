"""`runs`, `show`, `events`, `verify`: reading the database, never writing it.

Each opens the existing file read-only and reads only the page it prints;
totals come from COUNT queries, not from loading everything.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from typing import Final

import click

from ..accounting import (
    ModelAttempt,
    RunSpending,
    list_attempts,
    spending_by_run,
    spending_of,
)
from ..sanitize import sanitize
from ..store import (
    ApprovalRecord,
    ApprovalStatus,
    Event,
    Principal,
    RunRecord,
    StepRecord,
    Store,
    in_passkey_mode,
)
from ..trace import event_json, format_event
from ._app import (
    EXIT_UNUSABLE,
    CommandError,
    Settings,
    configured_registry,
    open_for_reading,
)
from ._output import bounded, flatten, value_field
from ._review import epoch_text, review_lines

__all__ = ["approval_json", "events", "runs", "show", "verify"]

_HASH: Final = re.compile(r"^[0-9a-f]{64}$")
_GOAL_WIDTH: Final = 60


def _short(text: str | None, width: int) -> str:
    """A one-line cell: sanitized, its middle cut to fit about `width` characters."""
    if text is None:
        return "-"
    return bounded(text, head=width * 2 // 3, tail=width // 3)


def _page_line(noun: str, offset: int, shown: int, total: int) -> str:
    if shown == 0:
        return f"no {noun} on this page ({total} in all)"
    return f"{noun} {offset + 1}-{offset + shown} of {total}"


def _limit_option(default: int) -> Callable[[Callable[..., None]], Callable[..., None]]:
    return click.option(
        "--limit",
        type=click.IntRange(1, 10_000),
        default=default,
        show_default=True,
        help="How many to print.",
    )


_offset_option = click.option(
    "--offset", type=click.IntRange(0), default=0, show_default=True, help="How many to skip."
)


@click.command()
@_limit_option(50)
@_offset_option
@click.pass_obj
def runs(settings: Settings, limit: int, offset: int) -> None:
    """List runs, newest first, those waiting for an approval in front."""
    output = settings.output
    with open_for_reading(settings) as store:
        total = store.count_runs()
        page = store.list_runs(limit=limit, offset=offset)
        waiting = {run.run_id: store.waiting_approval(run.run_id) for run in page}
        spent = spending_by_run(store, [run.run_id for run in page])
        principals = {run.run_id: store.principal_of_run(run.run_id) for run in page}
    if output.json:
        for run in page:
            approval = waiting[run.run_id]
            output.record(
                {
                    "record": "run",
                    **_run_json(run),
                    "waiting_approval": approval.approval_id if approval else None,
                    "model_calls": spent[run.run_id].calls if run.run_id in spent else 0,
                    "cost": _cost_json(spent.get(run.run_id)),
                    **_principal_json(principals[run.run_id]),
                }
            )
        output.record({"record": "page", "offset": offset, "shown": len(page), "total": total})
        return
    rows = []
    for run in page:
        approval = waiting[run.run_id]
        status = str(run.status)
        if run.reason and run.reason != status:
            status += f" ({run.reason})"
        rows.append(
            [
                sanitize(run.run_id),
                sanitize(status),
                str(run.step_count),
                _cost_cell(spent.get(run.run_id)),
                sanitize(approval.approval_id) if approval else "-",
                run.updated_at,
                _short(run.goal, _GOAL_WIDTH),
            ]
        )
    headers = ["RUN", "STATUS", "STEPS", "COST", "APPROVAL", "UPDATED", "GOAL"]
    if any(principal is not None for principal in principals.values()):
        # Only when a run of the page has one (the proxy over HTTP with "principals").
        headers.insert(1, "PRINCIPAL")
        for row, run in zip(rows, page, strict=True):
            principal = principals[run.run_id]
            row.insert(1, principal.label() if principal is not None else "-")
    if rows:
        output.table(headers, rows)
    output.line(_page_line("runs", offset, len(page), total))


def _principal_json(principal: Principal | None) -> dict[str, object]:
    """A run's principal as its JSON record's field, only when it has one."""
    return {} if principal is None else {"principal": principal.as_payload()}


def _cost_cell(spent: RunSpending | None) -> str:
    """A run's model cost in dollars: `-` with no model calls, `≥` when a price was unknown."""
    if spent is None or spent.calls == 0:
        return "-"
    if spent.cost_unknown and spent.cost == 0:
        return "unknown"
    return ("≥" if spent.cost_unknown else "") + f"${spent.cost:.4f}"


def _cost_json(spent: RunSpending | None) -> str | None:
    """The exact cost as a decimal string (None when a call's price was unknown)."""
    if spent is None:
        return "0"
    return None if spent.cost_unknown else str(spent.cost)


def _usage_fields(spent: RunSpending) -> list[tuple[str, str]]:
    return [
        ("model calls", str(spent.calls)),
        (
            "tokens",
            f"{spent.input_tokens} in, {spent.output_tokens} out,"
            f" {spent.cache_creation_input_tokens} cache write,"
            f" {spent.cache_read_input_tokens} cache read (charged {spent.charged_tokens})",
        ),
        ("cost", _cost_cell(spent)),
    ]


def _attempt_row(attempt: ModelAttempt) -> list[str]:
    usage = attempt.usage
    return [
        str(attempt.step),
        str(attempt.attempt),
        _short(f"{attempt.provider}:{attempt.model}", 32),
        str(attempt.outcome),
        sanitize(attempt.stop_reason or "-"),
        "-" if usage is None else str(usage.input_tokens),
        "-" if usage is None else str(usage.output_tokens),
        "-"
        if usage is None
        else f"{usage.cache_creation_input_tokens}/{usage.cache_read_input_tokens}",
        str(attempt.charged_tokens),
        "unknown" if attempt.cost is None else f"${attempt.cost:.4f}",
        _attempt_note(attempt),
    ]


def _attempt_note(attempt: ModelAttempt) -> str:
    """The attempt's note, else its error with the end kept (where the status and reason are)."""
    parts = []
    if attempt.error:
        parts.append(bounded(attempt.error, head=12, tail=48))
    if attempt.note:
        parts.append(_short(attempt.note, 60))
    return "; ".join(parts) or "-"


def _attempt_json(attempt: ModelAttempt) -> dict[str, object]:
    usage = attempt.usage
    return {
        "record": "model_call",
        "run_id": attempt.run_id,
        "step": attempt.step,
        "attempt": attempt.attempt,
        "provider": attempt.provider,
        "model": attempt.model,
        "started_at": attempt.started_at,
        "finished_at": attempt.finished_at,
        "outcome": str(attempt.outcome),
        "stop_reason": attempt.stop_reason,
        "input_tokens": None if usage is None else usage.input_tokens,
        "output_tokens": None if usage is None else usage.output_tokens,
        "cache_creation_input_tokens": None if usage is None else usage.cache_creation_input_tokens,
        "cache_read_input_tokens": None if usage is None else usage.cache_read_input_tokens,
        "charged_tokens": attempt.charged_tokens,
        "cost": None if attempt.cost is None else str(attempt.cost),
        "note": attempt.note,
        "error": attempt.error,
    }


def _spending_json(spent: RunSpending) -> dict[str, object]:
    return {
        "record": "model_usage",
        "model_calls": spent.calls,
        "input_tokens": spent.input_tokens,
        "output_tokens": spent.output_tokens,
        "cache_creation_input_tokens": spent.cache_creation_input_tokens,
        "cache_read_input_tokens": spent.cache_read_input_tokens,
        "charged_tokens": spent.charged_tokens,
        "cost": None if spent.cost_unknown else str(spent.cost),
        "cost_known_part": str(spent.cost),
    }


def _run_json(run: RunRecord) -> dict[str, object]:
    return {
        "run_id": run.run_id,
        "goal": run.goal,
        "status": str(run.status),
        "reason": run.reason,
        "result": run.result,
        "created_at": run.created_at,
        "updated_at": run.updated_at,
        "step_count": run.step_count,
        "consecutive_failures": run.consecutive_failures,
        "lease_owner": run.lease_owner,
        "lease_expires_at": run.lease_expires_at,
        "metadata": run.metadata,
    }


def _run_fields(run: RunRecord) -> list[tuple[str, str]]:
    pairs = [
        ("run", sanitize(run.run_id)),
        ("status", str(run.status)),
        ("reason", sanitize(run.reason) if run.reason else "-"),
        ("goal", value_field(run.goal)),
        ("result", value_field(run.result)),
        ("created", run.created_at),
        ("updated", run.updated_at),
        ("steps", str(run.step_count)),
        ("failures in a row", str(run.consecutive_failures)),
    ]
    if run.lease_owner and run.lease_expires_at is not None:
        pairs.append(
            ("lease", f"{sanitize(run.lease_owner)} until {epoch_text(run.lease_expires_at)}")
        )
    pairs.extend(flatten("metadata", run.metadata) if run.metadata else [])
    return pairs


def _principal_fields(principal: Principal | None) -> list[tuple[str, str]]:
    """Who the run is for, when it has a principal: the person, their issuer and client,
    the token's id (never the token), and the groups a condition could read."""
    if principal is None:
        return []
    pairs = [("principal", sanitize(principal.subject)), ("issuer", sanitize(principal.issuer))]
    if principal.client_id:
        pairs.append(("client", sanitize(principal.client_id)))
    if principal.jti:
        pairs.append(("token id", sanitize(principal.jti)))
    if principal.groups:
        pairs.append(("groups", sanitize(", ".join(principal.groups))))
    return pairs


def _decided_fields(approval: ApprovalRecord) -> list[tuple[str, str]]:
    if approval.decided_at is None:
        return []
    return [
        ("decided", approval.decided_at),
        ("decided by", value_field(approval.decided_by)),
        ("note", value_field(approval.note)),
    ]


def approval_json(approval: ApprovalRecord) -> dict[str, object]:
    """The approval as one JSON object (exact values; the hash covers them)."""
    return {
        "record": "approval",
        "approval_id": approval.approval_id,
        "run_id": approval.run_id,
        "step": approval.step,
        "status": str(approval.status),
        "tool": approval.tool,
        "kind": approval.kind,
        "capability": approval.capability,
        "presentation": approval.presentation,
        "args": approval.args,
        "approval_hash": approval.approval_hash,
        "decided_by": approval.decided_by,
        "note": approval.note,
        "created_at": approval.created_at,
        "decided_at": approval.decided_at,
        "expires_at": approval.expires_at,
    }


def _step_row(step: StepRecord) -> list[str]:
    return [
        str(step.step),
        _short(step.tool, 32),
        str(step.status),
        sanitize(step.observation_kind or "-"),
        _short(step.args, 40),
        _short(step.summary, 48),
    ]


def _decision_commands(settings: Settings, approval: ApprovalRecord) -> list[str]:
    database = shlex.quote(settings.database or "")
    run_id = shlex.quote(approval.run_id)
    approval_id = shlex.quote(approval.approval_id)
    return [
        sanitize(f"agentrt --db {database} {verb} {run_id} --approval {approval_id}")
        for verb in ("approve", "reject")
    ]


@click.command()
@click.argument("run_id", metavar="RUN")
@_limit_option(100)
@_offset_option
@click.pass_obj
def show(settings: Settings, run_id: str, limit: int, offset: int) -> None:
    """Show one run, a page of its steps, and the approval it waits on."""
    output = settings.output
    with open_for_reading(settings) as store:
        run = store.get_run(run_id)
        total_steps = store.count_steps(run_id)
        steps = store.list_steps(run_id, limit=limit, offset=offset)
        approval = store.waiting_approval(run_id)
        attempts = list_attempts(store, run_id)
        run_events = store.list_events(run_id, limit=10_000)
        decided_by = _policy_ids(run_events)
        principal = store.principal_of_run(run_id)
    spent = spending_of(attempts)
    if output.json:
        output.record({"record": "run", **_run_json(run), **_principal_json(principal)})
        for step in steps:
            output.record(
                {"record": "step", **_step_json(step), "policy_id": decided_by.get(step.step)}
            )
        output.record(
            {"record": "page", "offset": offset, "shown": len(steps), "total": total_steps}
        )
        for attempt in attempts:
            output.record(_attempt_json(attempt))
        output.record(_spending_json(spent))
        for line in _state_lines(run_events):
            output.record({"record": "state", "line": line})
        if approval is not None:
            output.record(approval_json(approval))
        return
    output.fields(_run_fields(run) + _principal_fields(principal) + _usage_fields(spent))
    output.line()
    if steps:
        output.table(
            ["STEP", "TOOL", "STATUS", "OBSERVED", "ARGUMENTS", "SUMMARY"],
            [_step_row(step) for step in steps],
        )
    output.line(_page_line("steps", offset, len(steps), total_steps))
    if attempts:
        output.line()
        output.table(
            ["STEP", "TRY", "MODEL", "OUTCOME", "STOP", "IN", "OUT", "CACHE W/R", "CHARGED",
             "COST", "NOTE"],
            [_attempt_row(attempt) for attempt in attempts],
        )  # fmt: skip
    for policy_id, numbers in _steps_by_policy(decided_by, steps).items():
        noun = "step" if len(numbers) == 1 else "steps"
        output.line(f"policy {sanitize(policy_id)} decided {noun} {', '.join(numbers)}")
    for line in _state_lines(run_events):
        output.line(line)
    if approval is None:
        return
    output.line()
    if approval.status is ApprovalStatus.PENDING:
        output.line("waiting for an approval:")
        for line in review_lines(approval):
            output.line(line)
        output.line()
        for command in _decision_commands(settings, approval):
            output.line(f"  {command}")
    else:
        output.line("approved, waiting for its program to resume it:")
        for line in review_lines(approval):
            output.line(line)
        output.fields(_decided_fields(approval))


def _state_lines(events: list[Event]) -> list[str]:
    """What each precondition read (or why it could not), and each approval that went stale."""
    lines: list[str] = []
    for event in events:
        payload = event.payload
        step = payload.get("step")
        if event.type == "state_read":
            error, tool, state = payload.get("error"), payload.get("tool"), payload.get("state")
            if isinstance(error, str):
                lines.append(f"step {step}: its precondition failed: {sanitize(error)}")
            elif isinstance(tool, str):
                read = "absent" if payload.get("absent") is True else f"sha256 {state}"
                lines.append(f"step {step}: its state read with {sanitize(tool)}: {read}")
        elif event.type == "approval_stale":
            lines.append(
                f"approval {sanitize(str(payload.get('approval_id')))} went stale: the state "
                f"changed after it was approved (now sha256 {payload.get('current_state')}); "
                "nothing ran"
            )
    return lines


def _policy_ids(events: list[Event]) -> dict[int, str]:
    """Step → the id of the policy that decided it, from the `policy_decided` events."""
    ids: dict[int, str] = {}
    for event in events:
        step, policy_id = event.payload.get("step"), event.payload.get("policy_id")
        if event.type == "policy_decided" and isinstance(step, int) and isinstance(policy_id, str):
            ids.setdefault(step, policy_id)
    return ids


def _steps_by_policy(ids: dict[int, str], steps: list[StepRecord]) -> dict[str, list[str]]:
    grouped: dict[str, list[str]] = {}
    for step in steps:
        if step.step in ids:
            grouped.setdefault(ids[step.step], []).append(str(step.step))
    return grouped


def _step_json(step: StepRecord) -> dict[str, object]:
    return {
        "run_id": step.run_id,
        "step": step.step,
        "tool": step.tool,
        "args": step.args,
        "status": str(step.status),
        "observation_kind": step.observation_kind,
        "content": step.content,
        "summary": step.summary,
        "started_at": step.started_at,
        "finished_at": step.finished_at,
    }


@click.command()
@click.argument("run_id", metavar="RUN")
@_limit_option(1000)
@_offset_option
@click.pass_obj
def events(settings: Settings, run_id: str, limit: int, offset: int) -> None:
    """Print the audit trail of one run, oldest first.

    With --json each line is the event exactly as the JSON Lines trace writes
    it (characters beyond ASCII as escapes).
    """
    output = settings.output
    with open_for_reading(settings) as store:
        store.get_run(run_id)
        total = store.count_events(run_id)
        page = store.list_events(run_id, limit=limit, offset=offset)
    if output.json:
        for event in page:
            output.json_text(event_json(event))
        return
    for event in page:
        output.line(format_event(event))
    output.line(_page_line("events", offset, len(page), total))


def _parse_head(text: str) -> tuple[int, str]:
    seq_text, colon, digest = text.partition(":")
    if not colon or not seq_text.isdecimal() or int(seq_text) < 1 or not _HASH.match(digest):
        raise click.BadParameter(
            "expected SEQ:HASH, a positive event number and a 64-character lowercase hex hash",
            param_hint="--head",
        )
    return int(seq_text), digest


def _unproven_decisions(
    store: Store, approvers_file: str, from_seq: int | None, to_seq: int | None
) -> list[str]:
    """`verify --approvers`: each decision no registered approver's passkey proves."""
    from ..passkeys import RegistryError, audit_decisions, read_registry

    try:
        registry = read_registry(approvers_file)
    except RegistryError as error:
        raise CommandError(str(error), EXIT_UNUSABLE) from error
    return [problem.sentence() for problem in audit_decisions(store, registry, from_seq, to_seq)]


@click.command(short_help="Check the events' hash chain, the head anchor and the tables.")
@click.option(
    "--from", "from_seq", type=click.IntRange(1), metavar="SEQ", help="First event to check."
)
@click.option("--to", "to_seq", type=click.IntRange(1), metavar="SEQ", help="Last event to check.")
@click.option(
    "--head",
    "head",
    metavar="SEQ:HASH",
    help="A head printed earlier: fail unless the chain still reaches it unchanged.",
)
@click.option(
    "--key",
    "key_paths",
    multiple=True,
    metavar="PUB",
    help="An operator's Ed25519 public key (PEM) the checkpoints are signed with; repeat it "
    "for the keys of earlier years.",
)
@click.option(
    "--checkpoints",
    "checkpoint_log",
    metavar="LOG",
    help="The checkpoint log: check the chain against every signed checkpoint in it.",
)
@click.option(
    "--archive",
    "archive_directory",
    metavar="DIR",
    help="The archive directory: check its signed segments and the database as one chain.",
)
@click.option(
    "--tsa-ca",
    "tsa_certificate",
    metavar="FILE",
    help="The timestamp authority's certificate (PEM) to trust: every checkpoint's RFC 3161 "
    "timestamp must verify with it.",
)
@click.option(
    "--since-checkpoint",
    is_flag=True,
    help="Check the hashes only from the last signed checkpoint on (a day's verify reads a "
    "day); the tables are not checked.",
)
@click.option(
    "--approvers",
    "approvers_file",
    metavar="FILE",
    help="The approvers' registry: also check every decision's passkey assertion against "
    "its registered public key, and name each decision no passkey proves (a database in "
    "passkey mode is checked with the registry of agentrt init's configuration unless "
    "FILE is given).",
)
@click.pass_obj
def verify(
    settings: Settings,
    from_seq: int | None,
    to_seq: int | None,
    head: str | None,
    key_paths: tuple[str, ...],
    checkpoint_log: str | None,
    archive_directory: str | None,
    tsa_certificate: str | None,
    since_checkpoint: bool,
    approvers_file: str | None = None,
) -> None:
    """Check the events' hash chain, that no committed event was lost (the head anchor),
    and that every run and approval row matches its events; print the head, or the
    first event or row that disagrees.  `--from`/`--to` check only that range of the chain.
    With `--key` and `--checkpoints`, also check the chain against every signed checkpoint."""
    # Here: the checkpoints' and archives' modules are verify's alone (issue 36).
    from . import _retention

    output = settings.output
    expected = _parse_head(head) if head is not None else None
    if from_seq is not None and to_seq is not None and from_seq > to_seq:
        raise click.BadParameter("--from must not be after --to", param_hint="--from")
    if bool(key_paths) != (checkpoint_log is not None):
        raise click.UsageError("--key and --checkpoints go together")
    if tsa_certificate is not None and checkpoint_log is None:
        raise click.UsageError("--tsa-ca needs --key and --checkpoints")
    if archive_directory is not None and checkpoint_log is None:
        raise click.UsageError("--archive needs --key and --checkpoints (its manifests are signed)")
    if since_checkpoint and (checkpoint_log is None or from_seq is not None or to_seq is not None):
        raise click.UsageError("--since-checkpoint needs --key and --checkpoints, not --from/--to")
    whole = from_seq is None and to_seq is None
    keys = _retention.load_keys(key_paths)
    with open_for_reading(settings) as store:
        signed = (
            None
            if checkpoint_log is None
            else _retention.signed_check(
                store,
                keys,
                checkpoint_log,
                archive_directory,
                since_checkpoint,
                tsa_certificate,
            )
        )
        start_problem = None
        if from_seq is None:
            from_seq, start_problem = _retention.chain_start(store, signed, since_checkpoint)
        report = store.verify_chain(from_seq, to_seq)
        anchor = None
        if expected is not None and report.ok:
            # The head is checked from the first event, so a chain rewritten
            # wholesale (every hash recomputed) cannot reach the old head.
            anchor = store.verify_chain(None, expected[0])
        anchored = store.check_anchor() if whole else None
        state = store.verify_state() if whole and not since_checkpoint and report.ok else None
        if approvers_file is None and in_passkey_mode(store):
            approvers_file = configured_registry()
        forged = (
            None
            if approvers_file is None or not report.ok
            else _unproven_decisions(store, approvers_file, from_seq, to_seq)
        )
    problem = None
    if not report.ok:
        problem = f"the chain is broken at event {report.first_bad_seq}: {report.reason}"
    elif expected is not None and anchor is not None:
        seq, digest = expected
        if not anchor.ok:
            problem = (
                f"the chain no longer reaches event {seq}: it breaks at event "
                f"{anchor.first_bad_seq} ({anchor.reason})"
            )
        elif anchor.head_seq < seq:
            problem = f"the chain no longer reaches event {seq}: it ends at event {anchor.head_seq}"
        elif anchor.head_hash != digest:
            problem = f"event {seq} no longer has hash {digest}: it is now {anchor.head_hash}"
    if problem is None and start_problem is not None:
        problem = start_problem
    if problem is None and signed is not None:
        problem = signed.problem
    if problem is None and anchored is not None and not anchored.ok:
        problem = anchored.reason
    if problem is None and state is not None and not state.ok:
        problem = f"the tables disagree with the events at {state.first_bad}: {state.reason}"
    if problem is None and forged:
        if not output.json:
            for line in forged[1:]:
                output.line(f"unproven: {line}")
        problem = f"{len(forged)} decision(s) no approver's passkey proves; the first: {forged[0]}"
    if output.json:
        record = {
            "record": "verify",
            "ok": problem is None,
            "checked": report.checked,
            "head_seq": report.head_seq,
            "head_hash": report.head_hash,
            "first_bad_seq": report.first_bad_seq,
            "anchor_seq": anchored.anchor_seq if anchored is not None else None,
            "anchor_hash": anchored.anchor_hash if anchored is not None else None,
            "first_bad_row": state.first_bad if state is not None else None,
            "reason": report.reason if problem is None else problem,
        }
        if signed is not None:
            last = None if signed.check is None else signed.check.last
            record["checkpoints"] = None if signed.check is None else signed.check.count
            record["checkpoint_seq"] = None if last is None else last.seq
            record["from_seq"] = report.head_seq - report.checked + 1
        output.record(record)
    elif problem is None:
        lost = (
            "nothing lost since its anchor"
            if anchored is None or anchored.anchor_seq is not None
            else "no head anchor on this host (a restored older backup is not detected here)"
        )
        rows = (
            "the tables were not checked (--since-checkpoint)"
            if since_checkpoint
            else "every row matches its events"
        )
        checks = "" if not whole else f"; {lost}; {rows}"
        since = ""
        if since_checkpoint and from_seq is not None:
            since = f" (from event {from_seq}, after the last signed checkpoint)"
        elif whole and from_seq is not None:
            since = f" (from event {from_seq}: the events before it are archived)"
        output.line(
            f"intact: {report.checked} events checked{since}, head "
            f"{report.head_seq}:{report.head_hash}"
            + checks
            + ("" if signed is None else signed.summary())
            + ("" if forged is None else "; every decision is proven by an approver's passkey")
        )
    if problem is not None:
        raise CommandError(problem)
