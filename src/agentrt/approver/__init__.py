"""The approver: one run's approvals shown and decided where the person already is.

- `Approver(store, run_id)`: a run's pending approval, one approval's view (JSON and
  sanitized plain text), approve / reject bound to the hash shown, cancel; never across
  runs.
"""

from __future__ import annotations

from ._interface import ApprovalView, Approver, ApproverRefusal, Decided, approval_path

__all__ = ["ApprovalView", "Approver", "ApproverRefusal", "Decided", "approval_path"]
