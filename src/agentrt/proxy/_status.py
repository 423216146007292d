"""`gate_status`: the proxy's own tool, which tells the model what became of its requests.

It reads the database and nothing else: it never runs, decides, approves or
writes anything, and it knows only the approvals of its own session.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, Final

from ..errors import RunNotFound
from ..sanitize import sanitize
from ..store import ApprovalRecord, ApprovalStatus, Store
from ._answers import Answer, bounded
from ._index import CallIndex, CallRow, Settled

__all__ = ["STATUS_TOOL", "GateStatus"]

STATUS_TOOL: Final = "gate_status"
_STATUS_SCHEMA: Final = {
    "type": "object",
    "properties": {
        "approval_id": {
            "type": "string",
            "description": "The approval id a PENDING_APPROVAL answer named (optional).",
        }
    },
    "additionalProperties": False,
}
_STATUS_DESCRIPTION: Final = (
    "Say which of this session's requests wait for a person's approval, or, given an "
    "approval_id, what became of that request. It only reads; it never runs, approves or "
    "changes anything."
)


class GateStatus:
    """Answers `gate_status` for one session, from its call index and the store."""

    def __init__(self, store: Store, index: CallIndex, log: Callable[[str], None]) -> None:
        self.store = store
        self.index = index
        self.log = log
        # Each tool withheld now (its server changed it since its pin) and why, told with
        # the listing so the model can say why a tool it saw is gone (`_live.py`).
        self.withheld: Callable[[], list[tuple[str, str]]] = list

    def listed(self) -> dict[str, Any]:
        """The tool as `tools/list` offers it, read-only with one optional argument: as the
        SDK's `Tool` model dumps it (a test holds the two equal)."""
        return {
            "name": STATUS_TOOL,
            "description": _STATUS_DESCRIPTION,
            "inputSchema": copy.deepcopy(_STATUS_SCHEMA),
            "annotations": {"readOnlyHint": True},
        }

    async def answer(self, arguments: dict[str, Any] | None, session: str | None = None) -> Answer:
        """Answer from the database alone: never executes, decides or writes a run.
        `session` is whose calls it knows (the index's keyspace of the caller's principal,
        over HTTP with `"principals"`); by default the proxy session's.

        Never raises: a store that cannot be read is told as such, and no
        answer names a run, a path or the database.
        """
        try:
            answer = await self.store.run(self._read, arguments, session)
        except Exception as exc:
            self.log(f"agentrt proxy: gate_status could not read the database: "
                     f"{sanitize(str(exc))}")  # fmt: skip
            return Answer.status_unavailable()
        withheld = self.withheld()
        if withheld and not answer.is_error and not (arguments or {}).get("approval_id"):
            lines = [f"{len(withheld)} tool(s) are withheld: their server changed them since the "
                     "operator reviewed them, and nothing runs until the operator pins them "
                     "again:"]  # fmt: skip
            lines += [f"- {name}: {bounded(sanitize(reason), 200)}" for name, reason in withheld]
            return Answer(answer.text + "\n" + "\n".join(lines), False)
        return answer

    def _listing(self, session: str | None) -> Answer:
        held = self.index.waiting(session)
        waiting = [(row, a) for row, a in held if a.status is ApprovalStatus.PENDING]
        approved = [(row, a) for row, a in held if a.status is ApprovalStatus.APPROVED]
        if not waiting and not approved:
            return Answer("No request of this session waits for a person's approval.", False)
        return Answer("\n".join(_listing_lines(waiting, approved)), False)

    def _read(self, arguments: dict[str, Any] | None, session: str | None = None) -> Answer:
        arguments = arguments or {}
        unknown = sorted(set(arguments) - {"approval_id"})
        if unknown:
            return Answer.invalid(STATUS_TOOL, f"unknown argument {unknown[0]!r}")
        approval_id = arguments.get("approval_id")
        if approval_id is None:
            return self._listing(session)
        if not isinstance(approval_id, str):
            return Answer.invalid(STATUS_TOOL, "approval_id must be a string")
        try:
            approval = self.store.get_approval(approval_id)
        except RunNotFound:
            approval = None
        if approval is None or self.index.get(approval.run_id, session) is None:
            # Another session's approvals are not this model's business.
            return Answer(
                f"There is no approval {bounded(approval_id, 80)} in this session.", False
            )
        described = {
            ApprovalStatus.PENDING: "is waiting for a person's decision",
            ApprovalStatus.APPROVED: (
                "was approved and has not run yet: it runs on the next call of the tool with "
                "exactly the same arguments"
            ),
            ApprovalStatus.USED: _what_ran(self.index.get(approval.run_id, session)),
            ApprovalStatus.REJECTED: "was rejected",
            ApprovalStatus.EXPIRED: "expired before anyone decided; the call did not run",
            ApprovalStatus.SUPERSEDED: "was replaced by a newer request for the same call",
            ApprovalStatus.STALE: (
                "was approved, but the state it acts on changed before it ran; it did not "
                "run, and calling again asks for a new approval"
            ),
        }[approval.status]
        note = (
            f' The reviewer said: "{bounded(approval.note)}".'
            if approval.status is ApprovalStatus.REJECTED and approval.note
            else ""
        )
        return Answer(
            f"Approval {approval.approval_id} for {approval.tool} {described}.{note}", False
        )


def _listing_lines(
    waiting: list[tuple[CallRow, ApprovalRecord]], approved: list[tuple[CallRow, ApprovalRecord]]
) -> list[str]:
    lines = []
    if waiting:
        lines.append(f"{len(waiting)} request(s) wait for a person's decision:")
        for row, waits in waiting:
            lines.append(
                f"- approval {waits.approval_id}: {row.tool} "
                f"({_status_word(waits.kind)}), waiting since {waits.created_at}"
            )
    if approved:
        # Decided, so no longer waiting on a person: the model's own call is what runs it.
        lines.append(f"{len(approved)} request(s) were approved and have not run yet:")
        for row, decided in approved:
            lines.append(
                f"- approval {decided.approval_id}: {row.tool} was approved; it runs on the "
                "next call of the tool with exactly the same arguments"
            )
    return lines


def _what_ran(row: CallRow | None) -> str:
    """What the executed step recorded, for an approval that was used."""
    outcome = row.outcome if row is not None else None
    if outcome == Settled.RESULT:
        return "was approved and the call ran: the server returned a result"
    if outcome == Settled.TOOL_ERROR:
        return "was approved and the call ran: the server reported an error"
    if outcome == Settled.DENIED:
        return "was approved, but the policy denied the call when it was to run; it did not run"
    if outcome == Settled.INVALID:
        return "was approved, but the call was refused as invalid; it did not run"
    if row is not None and row.unknown_outcome:
        return (
            "was approved and the call was sent, but its outcome is unknown; a person decides "
            "what happens next"
        )
    return "was approved and the call is running or its outcome is not recorded yet"


def _status_word(kind: str) -> str:
    if kind == "interrupted_side_effect":
        return "an earlier attempt was cut off"
    if kind == "unknown_outcome":
        return "an earlier attempt's outcome is unknown"
    return "needs approval"
