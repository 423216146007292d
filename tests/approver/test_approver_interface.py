"""The approver interface over one run: what it shows, what it decides, what it refuses."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from approver_support import waiting_run

from agentrt.approver import Approver, ApproverRefusal
from agentrt.store import ApprovalStatus, RunStatus, open_store

pytestmark = pytest.mark.anyio

HOSTILE = "\u202eexe.txt \x1b[31mred\x1b[0m <b>bold</b>"


def _refusal(call: object, *args: object, **kwargs: object) -> ApproverRefusal:
    with pytest.raises(ApproverRefusal) as caught:
        call(*args, **kwargs)  # type: ignore[operator]
    return caught.value


async def test_a_run_lists_only_its_own_pending_approval(database: str | Path) -> None:
    with open_store(database) as store:
        first = await waiting_run(store)
        second = await waiting_run(store)
        listed = Approver(store, first.run_id).pending()
        assert [view.approval.approval_id for view in listed] == [first.approval_id]
        assert listed[0].shown_hash == first.approval_hash
        assert Approver(store, second.run_id).pending()[0].approval.approval_id == (
            second.approval_id
        )
        assert Approver(store, first.run_id).pending(limit=0) == []


async def test_another_runs_approval_is_not_found_exactly_as_a_missing_one(
    database: str | Path,
) -> None:
    with open_store(database) as store:
        first = await waiting_run(store)
        second = await waiting_run(store)
        approver = Approver(store, first.run_id)
        foreign = _refusal(approver.view, second.approval_id)
        missing = _refusal(approver.view, "no-such-approval")
        assert (
            (foreign.status, foreign.code, str(foreign))
            == (
                missing.status,
                missing.code,
                str(missing),
            )
            == (404, "not_found", "no such run or approval")
        )
        # Deciding another run's approval through this run changes nothing.
        refused = _refusal(approver.approve, second.approval_id, second.approval_hash, by="x")
        assert refused.status == 404
        assert store.get_approval(second.approval_id).status is ApprovalStatus.PENDING
        assert _refusal(Approver(store, "no-such-run").pending).status == 404


async def test_the_text_view_carries_no_control_or_bidi_character(database: str | Path) -> None:
    with open_store(database) as store:
        waiting = await waiting_run(store, content=HOSTILE)
        view = Approver(store, waiting.run_id).view(waiting.approval_id)
        text = view.text()
        assert "\u202e" not in text and "\x1b" not in text
        assert "\\u202e" in text or "U+202E" in text.upper()
        assert waiting.approval_hash in text
        shown = view.json()
        assert shown["hash"] == waiting.approval_hash and shown["text"] == text
        assert shown["path"] == f"/runs/{waiting.run_id}/approvals/{waiting.approval_id}"


async def test_approve_is_bound_to_the_hash_shown(database: str | Path) -> None:
    with open_store(database) as store:
        waiting = await waiting_run(store)
        approver = Approver(store, waiting.run_id)
        head = store.head()
        wrong = _refusal(approver.approve, waiting.approval_id, "0" * 64, by="alice")
        assert (wrong.status, wrong.code) == (409, "approval_hash")
        assert store.head() == head
        assert store.get_approval(waiting.approval_id).status is ApprovalStatus.PENDING
        decided = approver.approve(waiting.approval_id, waiting.approval_hash, by="alice")
        assert decided.approval.status is ApprovalStatus.APPROVED
        assert decided.approval.decided_by == "alice"
        again = _refusal(approver.approve, waiting.approval_id, waiting.approval_hash, by="bob")
        assert (again.status, again.code) == (409, "not_pending")
        assert store.verify_chain().ok and store.verify_state().ok


async def test_reject_cancels_the_run_and_cancel_of_an_ended_run_is_refused(
    database: str | Path,
) -> None:
    with open_store(database) as store:
        waiting = await waiting_run(store)
        approver = Approver(store, waiting.run_id)
        approver.reject(waiting.approval_id, waiting.approval_hash, by="bob", note="no")
        assert store.get_run(waiting.run_id).status is RunStatus.CANCELLED
        finished = _refusal(approver.cancel, by="bob")
        assert (finished.status, finished.code) == (409, "run_finished")
        other = await waiting_run(store)
        cancelled = Approver(store, other.run_id).cancel(by="carol")
        assert cancelled.status is RunStatus.CANCELLED
        assert store.get_approval(other.approval_id).status is ApprovalStatus.SUPERSEDED
        replaced = _refusal(
            Approver(store, other.run_id).approve, other.approval_id, other.approval_hash, by="x"
        )
        assert (replaced.status, replaced.code) == (409, "approval_changed")


async def test_an_expired_approval_is_refused_as_gone_and_its_expiry_recorded(
    database: str | Path,
) -> None:
    with open_store(database) as store:
        waiting = await waiting_run(store, approval_ttl=0.5)
        other = await waiting_run(store, approval_ttl=0.5)
        time.sleep(0.8)
        approver = Approver(store, waiting.run_id)
        refused = _refusal(approver.approve, waiting.approval_id, waiting.approval_hash, by="a")
        assert (refused.status, refused.code) == (410, "expired")
        assert store.get_approval(waiting.approval_id).status is ApprovalStatus.EXPIRED
        assert store.get_run(waiting.run_id).status is RunStatus.CANCELLED
        rejected = _refusal(
            Approver(store, other.run_id).reject, other.approval_id, other.approval_hash, by="a"
        )
        assert (rejected.status, rejected.code) == (410, "expired")
        # A reject never grants, nor writes, a due approval.
        assert store.get_approval(other.approval_id).status is ApprovalStatus.PENDING
        again = _refusal(approver.approve, waiting.approval_id, waiting.approval_hash, by="a")
        assert (again.status, again.code) == (410, "expired")
        assert store.verify_chain().ok and store.verify_state().ok
