"""Decisions in passkey mode, through `agentrt.passkeys.decide` on both backends: a verified
assertion decides, every refusal decides nothing (no event, the approval still pending, the
chain intact), separation of duties and quorums hold, and each decision is proven again by
`audit_decisions` (what `agentrt verify --approvers` runs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from passkey_support import ORIGIN, SoftAuthenticator, Waiting, registry_of, waiting_runs

from agentrt.errors import AgentrtError
from agentrt.passkeys import (
    PasskeyRefused,
    QuorumRule,
    Registry,
    audit_decisions,
    decide,
    decision_challenge,
)
from agentrt.store import ApprovalStatus, Principal, Store, open_store

ALICE, BOB, MALLORY = SoftAuthenticator(), SoftAuthenticator(), SoftAuthenticator()


@pytest.fixture
def registry(tmp_path: Path) -> Registry:
    return registry_of(
        tmp_path / "approvers.json", ALICE.approver("alice", "alice@example.com"),
        BOB.approver("bob", "bob@example.com"),
    )  # fmt: skip


@pytest.fixture
def store(database: Path | str) -> Any:
    opened = open_store(database)
    try:
        yield opened
    finally:
        opened.close()


def decided_by(
    store: Store,
    registry: Registry,
    authenticator: SoftAuthenticator,
    waiting: Waiting,
    verdict: str = "approve",
    *,
    signed_for: Waiting | None = None,
    quorum: QuorumRule | None = None,
    **signing: Any,
) -> Any:
    shown = signed_for or waiting
    required = (quorum or QuorumRule({})).by_class.get("local_mutation", 1)
    challenge = decision_challenge(shown.approval_id, shown.approval_hash, verdict, None, required)
    return decide(
        store, registry, waiting.run_id, approval_id=waiting.approval_id,
        approval_hash=waiting.approval_hash, verdict=verdict,
        assertion=authenticator.sign(challenge, **signing), origin=ORIGIN,
        quorum=quorum or QuorumRule({}),
    )  # fmt: skip


def assert_nothing_decided(store: Store, waiting: Waiting, head: int) -> None:
    assert store.get_approval(waiting.approval_id).status is ApprovalStatus.PENDING
    assert store.head_seq() == head
    assert store.verify_chain().ok
    assert store.verify_state().ok


def test_a_passkey_approval_is_granted_recorded_and_proven(
    store: Store, registry: Registry, database: Any, tmp_path: Path
) -> None:
    (waiting,) = waiting_runs(database, tmp_path / "notes", 1)
    outcome = decided_by(store, registry, ALICE, waiting)
    assert outcome.waiting_for == 0
    approval = store.get_approval(waiting.approval_id)
    assert approval.status is ApprovalStatus.APPROVED
    assert approval.decided_by == "alice"
    types = [event.type for event in store.list_events(waiting.run_id)]
    assert types[-3:] == ["approver_decided", "approval_quorum_reached", "approval_granted"]
    recorded = next(e for e in store.list_events(waiting.run_id) if e.type == "approver_decided")
    assert recorded.payload["subject"] == "alice@example.com"
    assert set(recorded.payload["assertion"]) == {
        "credential_id", "authenticator_data", "client_data", "signature"
    }  # fmt: skip
    assert audit_decisions(store, registry) == []
    assert store.verify_chain().ok and store.verify_state().ok


def test_a_passkey_reject_cancels_the_run_and_is_proven(
    store: Store, registry: Registry, database: Any, tmp_path: Path
) -> None:
    (waiting,) = waiting_runs(database, tmp_path / "notes", 1)
    decided_by(store, registry, BOB, waiting, "reject")
    assert store.get_approval(waiting.approval_id).status is ApprovalStatus.REJECTED
    assert store.get_run(waiting.run_id).status.terminal
    assert audit_decisions(store, registry) == []


def test_an_assertion_without_user_verification_is_refused(
    store: Store, registry: Registry, database: Any, tmp_path: Path
) -> None:
    (waiting,) = waiting_runs(database, tmp_path / "notes", 1)
    head = store.head_seq()
    with pytest.raises(
        PasskeyRefused,
        match=r"^the passkey assertion of approver alice was made without user verification",
    ):
        decided_by(store, registry, ALICE, waiting, user_verified=False)
    assert_nothing_decided(store, waiting, head)


def test_an_assertion_for_another_approvals_hash_is_refused(
    store: Store, registry: Registry, database: Any, tmp_path: Path
) -> None:
    first, second = waiting_runs(database, tmp_path / "notes", 2)
    head = store.head_seq()
    with pytest.raises(PasskeyRefused, match="was made for another decision"):
        decided_by(store, registry, ALICE, first, signed_for=second)
    assert_nothing_decided(store, first, head)
    # A reject's assertion is no approval either: the verdict is in the challenge.
    challenge = decision_challenge(first.approval_id, first.approval_hash, "reject", None)
    with pytest.raises(PasskeyRefused, match="was made for another decision"):
        decide(
            store, registry, first.run_id, approval_id=first.approval_id,
            approval_hash=first.approval_hash, verdict="approve",
            assertion=ALICE.sign(challenge), origin=ORIGIN, quorum=QuorumRule({}),
        )  # fmt: skip
    assert_nothing_decided(store, first, head)
    decided_by(store, registry, ALICE, second)  # the other approval is still decidable
    assert store.get_approval(second.approval_id).status is ApprovalStatus.APPROVED


def test_a_replayed_assertion_is_refused(
    store: Store, registry: Registry, database: Any, tmp_path: Path
) -> None:
    (waiting,) = waiting_runs(database, tmp_path / "notes", 1)
    quorum = QuorumRule({"local_mutation": 2})
    challenge = decision_challenge(waiting.approval_id, waiting.approval_hash, "approve", None, 2)
    assertion = ALICE.sign(challenge)

    def submit() -> Any:
        return decide(
            store, registry, waiting.run_id, approval_id=waiting.approval_id,
            approval_hash=waiting.approval_hash, verdict="approve", assertion=assertion,
            origin=ORIGIN, quorum=quorum,
        )  # fmt: skip

    assert submit().waiting_for == 1
    head = store.head_seq()
    with pytest.raises(PasskeyRefused, match=r"does not verify|already approved"):
        submit()  # the same assertion again: its sign count is not newer, and alice counted
    assert_nothing_decided(store, waiting, head)
    decided_by(store, registry, BOB, waiting, quorum=quorum)
    head = store.head_seq()
    with pytest.raises(AgentrtError, match="has no pending approval"):
        submit()  # after the decision: recorded once
    assert store.head_seq() == head
    assert audit_decisions(store, registry) == []


def test_an_unregistered_credential_is_refused(
    store: Store, registry: Registry, database: Any, tmp_path: Path
) -> None:
    (waiting,) = waiting_runs(database, tmp_path / "notes", 1)
    head = store.head_seq()
    with pytest.raises(PasskeyRefused, match="is not registered to any approver"):
        decided_by(store, registry, MALLORY, waiting)
    assert_nothing_decided(store, waiting, head)


def test_a_principal_cannot_approve_its_own_call(
    store: Store, registry: Registry, database: Any, tmp_path: Path
) -> None:
    alice = Principal(issuer="https://id.example.com", subject="alice@example.com")
    (waiting,) = waiting_runs(database, tmp_path / "notes", 1, principal=alice)
    head = store.head_seq()
    with pytest.raises(PasskeyRefused, match=r"a principal can never approve its own call$"):
        decided_by(store, registry, ALICE, waiting)
    assert_nothing_decided(store, waiting, head)
    decided_by(store, registry, BOB, waiting)
    assert store.get_approval(waiting.approval_id).status is ApprovalStatus.APPROVED
    assert audit_decisions(store, registry) == []


def test_a_quorum_needs_distinct_people_and_one_person_twice_counts_once(
    store: Store, database: Any, tmp_path: Path
) -> None:
    alices_second_key = SoftAuthenticator()
    registry = registry_of(
        tmp_path / "approvers.json", ALICE.approver("alice", "alice@example.com"),
        alices_second_key.approver("alice-laptop", "alice@example.com"),
        BOB.approver("bob", "bob@example.com"),
    )  # fmt: skip
    quorum = QuorumRule({"local_mutation": 2})
    (waiting,) = waiting_runs(database, tmp_path / "notes", 1)
    assert decided_by(store, registry, ALICE, waiting, quorum=quorum).waiting_for == 1
    assert store.get_approval(waiting.approval_id).status is ApprovalStatus.PENDING
    head = store.head_seq()
    for again in (ALICE, alices_second_key):  # a fresh assertion, or her other passkey
        with pytest.raises(PasskeyRefused, match=r"a quorum counts each person once$"):
            decided_by(store, registry, again, waiting, quorum=quorum)
        assert_nothing_decided(store, waiting, head)
    assert decided_by(store, registry, BOB, waiting, quorum=quorum).waiting_for == 0
    approval = store.get_approval(waiting.approval_id)
    assert approval.status is ApprovalStatus.APPROVED
    assert approval.decided_by == "alice, bob"
    reached = [e for e in store.list_events(waiting.run_id) if e.type == "approval_quorum_reached"]
    assert [event.payload["approvers"] for event in reached] == [["alice", "bob"]]
    assert reached[0].payload["required"] == 2
    assert audit_decisions(store, registry) == []


def test_an_assertion_signed_for_a_quorum_of_one_is_refused_where_two_are_required(
    store: Store, registry: Registry, database: Any, tmp_path: Path
) -> None:
    (waiting,) = waiting_runs(database, tmp_path / "notes", 1)
    head = store.head_seq()
    with pytest.raises(PasskeyRefused, match="was made for another decision"):
        decide(
            store, registry, waiting.run_id, approval_id=waiting.approval_id,
            approval_hash=waiting.approval_hash, verdict="approve",
            assertion=ALICE.sign(
                decision_challenge(waiting.approval_id, waiting.approval_hash, "approve", None, 1)
            ),
            origin=ORIGIN, quorum=QuorumRule({"local_mutation": 2}),
        )  # fmt: skip
    assert_nothing_decided(store, waiting, head)
