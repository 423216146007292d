"""The approver interface: one run's approvals, as a chat bot or a small page needs them.

`Approver(store, run_id)` shows the run's pending approval, one approval of the run
(as JSON, and as sanitized plain text a chat message can carry), and decides it
through `approvals.py`, bound to the hash that was shown.  It never lists across
runs: an approval that is not the run's is "not found", exactly as a missing one,
so a caller holding one run's id learns nothing of another.  Every refusal is an
`ApproverRefusal` with the HTTP status and the stable `code` the signed channel
answers with.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from .. import approvals
from ..errors import AgentrtError, ApprovalError, RunNotFound, RunStateError
from ..grants import GrantRefused, GrantRequest, GrantScope, grant_scope
from ..inbox.review import displayed_hash
from ..sanitize import sanitize
from ..store import ApprovalRecord, ApprovalStatus, RunRecord, RunStatus, Store

__all__ = [
    "MAX_LISTED",
    "MAX_TEXT",
    "ApprovalView",
    "Approver",
    "ApproverRefusal",
    "approval_path",
]

MAX_LISTED: Final = 20
"""Approvals one listing returns at most (a run has one pending approval at a time)."""
MAX_TEXT: Final = 12_000
"""Characters of an approval's plain text; a longer one is cut in the middle, said so."""

_NEXT_STEP: Final = (
    "the run waits for its owner to resume it, or for the host's identical call through the proxy"
)


class ApproverRefusal(AgentrtError):
    """A request the approver refuses: `status` (HTTP) and `code` say which, the message why."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


def approval_path(run_id: str, approval_id: str) -> str:
    """The approver channel's path of one approval (its identifiers percent-encoded)."""
    from urllib.parse import quote

    return f"/runs/{quote(run_id, safe='')}/approvals/{quote(approval_id, safe='')}"


@dataclass(frozen=True, slots=True)
class ApprovalView:
    """One approval as an approver is shown it: `approval` the row, `shown_hash` the hash
    of exactly the fields shown (recomputed, never copied), `run_status` its run's."""

    approval: ApprovalRecord
    shown_hash: str
    run_status: RunStatus

    def json(self) -> dict[str, Any]:
        """The exact values (JSON escapes them), the hash to decide against, and the text."""
        approval = self.approval
        return {
            "approval_id": approval.approval_id,
            "run_id": approval.run_id,
            "run_status": str(self.run_status),
            "step": approval.step,
            "status": str(approval.status),
            "tool": approval.tool,
            "kind": approval.kind,
            "capability": approval.capability,
            "presentation": approval.presentation,
            "args": approval.args,
            "hash": self.shown_hash,
            "created_at": approval.created_at,
            "expires_at": approval.expires_at,
            "decided_by": approval.decided_by,
            "decided_at": approval.decided_at,
            "note": approval.note,
            "path": approval_path(approval.run_id, approval.approval_id),
            "text": self.text(),
        }

    def text(self) -> str:
        """Plain text a chat message can carry: the terminal's review (every string
        sanitized: no control, bidi or invisible character survives), bounded."""
        from ..cli._review import review_lines

        approval = self.approval
        pending = approval.status is ApprovalStatus.PENDING
        lines = [
            f"{'A call waits for approval' if pending else 'Approval'}: "
            f"{sanitize(approval.tool)} (run {sanitize(approval.run_id)})",
            "",
            *review_lines(approval),
        ]
        if pending:
            lines += ["", f"decide: POST {approval_path(approval.run_id, approval.approval_id)}"
                      "/approve or /reject with this hash"]  # fmt: skip
        text = "\n".join(lines)
        if len(text) > MAX_TEXT:
            cut = len(text) - MAX_TEXT
            head, tail = text[: MAX_TEXT * 3 // 4], text[-(MAX_TEXT // 4) :]
            text = f"{head}\n… {cut} characters not shown …\n{tail}"
        return text


@dataclass(frozen=True, slots=True)
class Decided:
    """What a decision left: the approval as decided and what happens next."""

    approval: ApprovalRecord
    next_step: str

    def json(self) -> dict[str, Any]:
        approval = self.approval
        return {
            "approval_id": approval.approval_id,
            "run_id": approval.run_id,
            "status": str(approval.status),
            "hash": approval.approval_hash,
            "by": approval.decided_by,
            "note": approval.note,
            "next": self.next_step,
        }


def _not_found() -> ApproverRefusal:
    # One sentence for a missing run, a missing approval and another run's approval.
    return ApproverRefusal(404, "not_found", "no such run or approval")


class Approver:
    """The approvals of one run (`run_id`), shown and decided through `approvals.py`.

    Synchronous store work: async code calls it in `Store.run`.
    """

    def __init__(self, store: Store, run_id: str) -> None:
        self.store = store
        self.run_id = run_id

    # -- looking ----------------------------------------------------------------

    def run(self) -> RunRecord:
        try:
            return self.store.get_run(self.run_id)
        except RunNotFound:
            raise _not_found() from None

    def _approval(self, approval_id: str) -> ApprovalRecord:
        try:
            approval = self.store.get_approval(approval_id)
        except RunNotFound:
            raise _not_found() from None
        if approval.run_id != self.run_id:
            raise _not_found()
        return approval

    def pending(self, limit: int = MAX_LISTED) -> list[ApprovalView]:
        """The run's approvals waiting for a decision (at most `limit`; today one at most)."""
        run = self.run()
        latest = self.store.latest_approval(self.run_id)
        if latest is None or latest.status is not ApprovalStatus.PENDING or limit < 1:
            return []
        return [ApprovalView(latest, displayed_hash(latest), run.status)]

    def view(self, approval_id: str) -> ApprovalView:
        """One approval of this run, whatever its status; `not_found` if it is not the run's."""
        run = self.run()
        approval = self._approval(approval_id)
        return ApprovalView(approval, displayed_hash(approval), run.status)

    # -- deciding ---------------------------------------------------------------

    def _refuse_unless_decidable(
        self, approval_id: str, shown_hash: str, *, expires_when_granted: bool = False
    ) -> ApprovalRecord:
        """The refusal a decision on `approval_id` gets now, or the approval if there is none.

        `expires_when_granted`: leave a due approval to `approvals.approve`, which
        records its expiry (the run cancelled) and never grants it.
        """
        run = self.run()
        approval = self._approval(approval_id)
        status = approval.status
        if status is ApprovalStatus.EXPIRED:
            raise ApproverRefusal(410, "expired", f"approval {sanitize(approval_id)} expired")
        if status is ApprovalStatus.SUPERSEDED:
            raise ApproverRefusal(
                409, "approval_changed",
                f"approval {sanitize(approval_id)} was replaced by a newer request; "
                "look at the run's pending approval again",
            )  # fmt: skip
        if status is not ApprovalStatus.PENDING:
            raise ApproverRefusal(
                409, "not_pending", f"approval {sanitize(approval_id)} is already {status}"
            )
        if run.status.terminal:
            raise ApproverRefusal(
                409, "run_finished", f"run {sanitize(self.run_id)} already ended ({run.status})"
            )
        if run.status is not RunStatus.WAITING_FOR_APPROVAL:
            raise ApproverRefusal(
                409, "run_not_waiting",
                f"run {sanitize(self.run_id)} is {run.status}, not waiting for an approval",
            )  # fmt: skip
        if approval.recomputed_hash() != approval.approval_hash:
            raise ApproverRefusal(
                409, "approval_changed",
                f"approval {sanitize(approval_id)} no longer matches its hash; the stored "
                "request was changed and cannot be decided",
            )  # fmt: skip
        if shown_hash != approval.approval_hash:
            raise ApproverRefusal(
                409, "approval_hash",
                f"approval {sanitize(approval_id)} is not the request that was shown (the hash "
                "differs); look at it again before deciding",
            )  # fmt: skip
        if (
            not expires_when_granted
            and approval.expires_at is not None
            and self.store.clock() >= approval.expires_at
        ):
            raise ApproverRefusal(410, "expired", f"approval {sanitize(approval_id)} expired")
        return approval

    def _decide(
        self, verdict: str, approval_id: str, shown_hash: str, by: str, note: str,
        grant: GrantRequest | None = None,
    ) -> Any:  # fmt: skip
        granting = verdict == "approve"
        self._refuse_unless_decidable(approval_id, shown_hash, expires_when_granted=granting)
        try:
            if granting:
                return approvals.approve(
                    self.store, self.run_id, approval_hash=shown_hash, approval_id=approval_id,
                    by=by, note=note, grant=grant,
                )  # fmt: skip
            return approvals.reject(
                self.store, self.run_id, approval_hash=shown_hash, approval_id=approval_id,
                by=by, note=note,
            )  # fmt: skip
        except GrantRefused as refused:
            # Nothing was decided: a grant wider than the operator allows, on a tool it may
            # not cover, with a condition that does not compile, or another scope than shown.
            raise ApproverRefusal(400, "bad_request", sanitize(str(refused))) from None
        except (ApprovalError, RunStateError) as exc:
            # Decided, expired or replaced between the check and the write: say which.
            self._refuse_unless_decidable(approval_id, shown_hash)
            raise ApproverRefusal(409, "approval_changed", sanitize(str(exc))) from None

    def approve(
        self, approval_id: str, shown_hash: str, *, by: str, note: str = "",
        grant: GrantRequest | None = None,
    ) -> Decided:  # fmt: skip
        """Grant `approval_id` if it is still the pending request that hashes to `shown_hash`;
        with `grant`, give the standing grant whose scope hash it names in the same write."""
        return Decided(
            self._decide("approve", approval_id, shown_hash, by, note, grant), _NEXT_STEP
        )

    def grant_scope(self, approval_id: str, asked: GrantRequest) -> GrantScope:
        """The scope (and its hash) a standing grant asked with `approval_id` would have: what
        a person is shown before giving it.  Refused as a decision would be."""
        approval = self._approval(approval_id)
        try:
            return grant_scope(self.store, approval, asked)
        except GrantRefused as refused:
            raise ApproverRefusal(400, "bad_request", sanitize(str(refused))) from None

    def reject(self, approval_id: str, shown_hash: str, *, by: str, note: str = "") -> Decided:
        """Reject `approval_id` (the run is cancelled; `note` is what the model is told)."""
        return Decided(
            self._decide("reject", approval_id, shown_hash, by, note), "the run is cancelled"
        )

    def cancel(self, *, by: str) -> RunRecord:
        """End the run (its open approvals are superseded)."""
        run = self.run()
        if run.status.terminal:
            raise ApproverRefusal(
                409, "run_finished", f"run {sanitize(self.run_id)} already ended ({run.status})"
            )
        try:
            return approvals.cancel(self.store, self.run_id, by=by)
        except RunStateError as exc:
            raise ApproverRefusal(409, "run_finished", sanitize(str(exc))) from None
