"""The inbox's JSON: store records turned into what the page shows, every string sanitized.

A thin view: it reads through the store's own methods and shapes the
result; it decides nothing.  The page puts these strings into the DOM with
`textContent` only, so markup in them is text, and `sanitize` has already
made control, bidi and invisible characters visible escapes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from ..canonical import canonical_json
from ..sanitize import sanitize
from ..store import (
    ApprovalRecord,
    ApprovalStatus,
    ChainReport,
    Event,
    RunRecord,
    RunStatus,
    StepRecord,
    Store,
)
from .review import (
    TextReview,
    displayed_hash,
    edits_of,
    parsed_arguments,
    pretty_json_lines,
    size_of,
    state_changes,
    text_review,
    written_texts,
)

__all__ = [
    "MAX_SHOWN_LINES",
    "ToolInfo",
    "approval_view",
    "chain_view",
    "event_view",
    "head_seq",
    "run_detail",
    "run_view",
    "waiting_approvals",
]

MAX_SHOWN_LINES: Final = 20_000
"""Lines of one text block sent to the page; past it the page says how many it leaves out."""

_KIND_LABELS: Final = {
    "interrupted_side_effect": "a mutating call was cut off; it may have taken effect",
    "unknown_outcome": "a mutating call's outcome is unknown; approving runs it again",
}


@dataclass(frozen=True, slots=True)
class ToolInfo:
    """What the proxy knows of a tool that the database does not: its server and description."""

    server: str
    description: str


def _text(value: str | None) -> str | None:
    return None if value is None else sanitize(value)


def _block(review: TextReview) -> dict[str, Any]:
    shown = review.lines[:MAX_SHOWN_LINES]
    return {
        "lines": list(shown),
        "line_count": review.line_count,
        "omitted": review.line_count - len(shown),
        "size": review.size,
        "ends_with_newline": review.ends_with_newline,
    }


def _lines_block(lines: list[str], size: str) -> dict[str, Any]:
    shown = lines[:MAX_SHOWN_LINES]
    return {
        "lines": shown,
        "line_count": len(lines),
        "omitted": len(lines) - len(shown),
        "size": size,
        "ends_with_newline": False,
    }


def _reason(events: list[Event], approval_id: str) -> str:
    for event in events:
        if event.type == "approval_requested" and event.payload.get("approval_id") == approval_id:
            reason = event.payload.get("reason")
            return sanitize(reason) if isinstance(reason, str) and reason else "-"
    return "-"


def approval_view(
    store: Store, approval: ApprovalRecord, tools: Mapping[str, ToolInfo]
) -> dict[str, Any]:
    """One approval as the page shows it, with the hash of exactly these fields."""
    run = store.get_run(approval.run_id)
    arguments = parsed_arguments(approval)
    if arguments is None:
        argument_lines = [sanitize(line) for line in approval.args.split("\n")]
    else:
        argument_lines = pretty_json_lines(arguments)
    presentation = approval.presentation
    warning = presentation.get("warning") if isinstance(presentation, Mapping) else None
    info = tools.get(approval.tool)
    host_session = run.metadata.get("host_session")
    principal = store.principal_of_run(approval.run_id)
    return {
        "approval_id": sanitize(approval.approval_id),
        "run_id": sanitize(approval.run_id),
        # Who asked, as their access token proved it (the proxy over HTTP with "principals").
        "principal": principal.label() if principal is not None else None,
        # The host session whose taint judged the call (docs/flows.md), shown and, raw,
        # what the page's button clears.
        "host_session": sanitize(host_session) if host_session is not None else None,
        "clear_taint": host_session,
        # The raw identifiers the decision names, kept apart from their display form.
        "decide": {"run_id": approval.run_id, "approval_id": approval.approval_id},
        "step": approval.step,
        "status": str(approval.status),
        "tool": sanitize(approval.tool),
        "server": sanitize(info.server) if info else None,
        "description": text_review(info.description).lines if info else None,
        "kind": sanitize(approval.kind),
        "kind_note": _KIND_LABELS.get(approval.kind),
        "reason": _reason(store.list_events(approval.run_id), approval.approval_id),
        "warning": _text(warning) if isinstance(warning, str) else None,
        "goal": sanitize(run.goal),
        "capability": pretty_json_lines(approval.capability),
        "presentation": pretty_json_lines(presentation),
        "arguments": _lines_block(argument_lines, size_of(approval.args)),
        "writes": [
            {"label": label, **_block(review)} for label, review in written_texts(arguments)
        ],
        "edits": [
            {
                "label": edit.label,
                "old_size": edit.old.size,
                "new_size": edit.new.size,
                "diff": [
                    {"sign": line.sign, "text": line.text} for line in edit.diff[:MAX_SHOWN_LINES]
                ],
                "omitted": max(0, len(edit.diff) - MAX_SHOWN_LINES),
            }
            for edit in edits_of(arguments)
        ]
        + [
            # A change against the state its precondition read, drawn as an edit's diff.
            {
                "label": "; ".join((change.label, *change.notes)),
                "old_size": change.old_size,
                "new_size": change.new_size,
                "diff": [
                    {"sign": line.sign, "text": line.text} for line in change.diff[:MAX_SHOWN_LINES]
                ],
                "omitted": max(0, len(change.diff) - MAX_SHOWN_LINES),
            }
            for change in state_changes(approval)
        ],
        "created_at": approval.created_at,
        "expires_at": approval.expires_at,
        "approval_hash": displayed_hash(approval),
    }


def waiting_approvals(store: Store) -> list[ApprovalRecord]:
    """Every pending approval, newest first, found through the runs waiting on one."""
    found: list[ApprovalRecord] = []
    offset = 0
    while True:
        page = store.list_runs(limit=100, offset=offset)
        for run in page:
            if run.status is not RunStatus.WAITING_FOR_APPROVAL:
                # Runs waiting for an approval come first; the rest wait for nothing.
                return sorted(found, key=lambda approval: approval.created_at, reverse=True)
            approval = store.waiting_approval(run.run_id)
            if approval is not None and approval.status is ApprovalStatus.PENDING:
                found.append(approval)
        if len(page) < 100:
            return sorted(found, key=lambda approval: approval.created_at, reverse=True)
        offset += 100


def head_seq(store: Store) -> int:
    """The number of the chain's last event, found with O(log n) lookups of `event_at`."""
    if store.event_at(1) is None:
        return 0
    low, high = 1, 2
    while store.event_at(high) is not None:
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        if store.event_at(middle) is None:
            high = middle
        else:
            low = middle
    return low


def run_view(store: Store, run: RunRecord) -> dict[str, Any]:
    approval = store.waiting_approval(run.run_id)
    principal = store.principal_of_run(run.run_id)
    return {
        "run_id": sanitize(run.run_id),
        "principal": principal.label() if principal is not None else None,
        "link": run.run_id,
        "status": str(run.status),
        "reason": sanitize(run.reason),
        "steps": run.step_count,
        "approval": sanitize(approval.approval_id) if approval else None,
        "approval_status": str(approval.status) if approval else None,
        "updated_at": run.updated_at,
        "goal": sanitize(run.goal),
    }


def _step_view(step: StepRecord) -> dict[str, Any]:
    return {
        "step": step.step,
        "tool": sanitize(step.tool),
        "status": str(step.status),
        "observed": sanitize(step.observation_kind or "-"),
        "arguments": _block(text_review(step.args)),
        "content": None if step.content is None else _block(text_review(step.content)),
        "summary": _text(step.summary),
        "started_at": step.started_at,
        "finished_at": step.finished_at,
    }


def event_view(event: Event) -> dict[str, Any]:
    payload = canonical_json(event.payload)
    return {
        "seq": event.seq,
        "type": sanitize(event.type),
        "created_at": sanitize(event.created_at),
        "payload": pretty_json_lines(event.payload),
        "payload_size": size_of(payload),
        "hash": event.hash,
    }


def run_detail(
    store: Store, run_id: str, tools: Mapping[str, ToolInfo], limit: int = 500
) -> dict[str, Any]:
    """One run: its record, its steps and events (first `limit` of each), its waiting approval."""
    run = store.get_run(run_id)
    approval = store.waiting_approval(run_id)
    return {
        "run": {
            **run_view(store, run),
            "result": _text(run.result),
            "created_at": run.created_at,
            "metadata": pretty_json_lines(run.metadata),
        },
        "steps": [_step_view(step) for step in store.list_steps(run_id, limit=limit)],
        "step_total": store.count_steps(run_id),
        "events": [event_view(event) for event in store.list_events(run_id, limit=limit)],
        "event_total": store.count_events(run_id),
        "approval": None if approval is None else approval_view(store, approval, tools),
    }


def chain_view(report: ChainReport) -> dict[str, Any]:
    return {
        "ok": report.ok,
        "checked": report.checked,
        "head_seq": report.head_seq,
        "head_hash": report.head_hash,
        "first_bad_seq": report.first_bad_seq,
        "reason": sanitize(report.reason),
    }
