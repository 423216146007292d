"""A standing grant decided with a passkey, through a real proxy and MCP host: the approver's
assertion signs the grant's scope hash with the approval, so the grant is given only with an
assertion made for that scope; an assertion for the approval alone does not give a scope, and
one made for a scope does not approve without it (each refused, nothing decided)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from inbox_support import notes_setup
from passkey_support import ORIGIN, SoftAuthenticator, registry_of
from proxy_helpers import host, text_of

from agentrt import grants
from agentrt.grants import GrantRequest
from agentrt.passkeys import (
    PasskeyRefused,
    QuorumRule,
    Registry,
    audit_decisions,
    decide,
    decision_challenge,
)
from agentrt.passkeys._decide import decisions_of
from agentrt.store import ApprovalStatus, Store, list_standing_grants, open_store

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.timeout(120)]

ALICE = SoftAuthenticator()
OTHER_DECISION = (
    r"^the passkey assertion of approver alice was made for another decision "
    r"\(another approval, verdict or grant\)$"
)
_LIMITS: dict[str, Any] = {"max_for": "1h", "max_calls": 10}


def _decide(
    store: Store,
    registry: Registry,
    run_id: str,
    approval_id: str,
    *,
    signed_scope: str | None,
    grant: GrantRequest | None,
) -> Any:
    shown = store.get_approval(approval_id)
    challenge = decision_challenge(approval_id, shown.approval_hash, "approve", signed_scope)
    return decide(
        store, registry, run_id, approval_id=approval_id, approval_hash=shown.approval_hash,
        verdict="approve", assertion=ALICE.sign(challenge), origin=ORIGIN,
        quorum=QuorumRule({}), grant=grant,
    )  # fmt: skip


def _nothing_decided(store: Store, approval_id: str, head: int) -> None:
    approval = store.get_approval(approval_id)
    assert approval.status is ApprovalStatus.PENDING
    assert decisions_of(store, approval) == []
    assert list_standing_grants(store) == []
    assert store.head_seq() == head
    assert store.verify_chain().ok and store.verify_state().ok


async def test_a_standing_grant_is_given_only_with_an_assertion_over_its_scope_hash(
    tmp_path: Path,
) -> None:
    setup, notes = await notes_setup(tmp_path)
    registry = registry_of(
        setup.root / "conf" / "approvers.json", ALICE.approver("alice", "alice@example.com")
    )
    setup.rewrite(approval_auth="passkey", standing_grants=_LIMITS)
    async with host(setup) as session:
        first = {"path": "first.md", "content": "alice granted this"}
        pending = await session.call_tool("notes_write_note", first)
        assert text_of(pending).startswith("PENDING_APPROVAL: ")
        with anyio.fail_after(30):
            while "agentrt proxy: inbox at http://localhost:" not in setup.stderr():
                await anyio.sleep(0.1)
        run_id, approval_id = setup.waiting_commands()[-1]
        with open_store(setup.database, create=False) as store:
            scope = grants.grant_scope(
                store, store.get_approval(approval_id), GrantRequest(calls=2)
            )
            asked = GrantRequest(calls=2, scope_hash=scope.scope_hash)
            head = store.head_seq()
            # An assertion for the approval alone, used to give a scope: refused.
            with pytest.raises(PasskeyRefused, match=OTHER_DECISION):
                _decide(store, registry, run_id, approval_id, signed_scope=None, grant=asked)
            _nothing_decided(store, approval_id, head)
            # An assertion made for the scope, used to approve without it: refused.
            with pytest.raises(PasskeyRefused, match=OTHER_DECISION):
                _decide(
                    store, registry, run_id, approval_id, signed_scope=scope.scope_hash,
                    grant=None,
                )  # fmt: skip
            _nothing_decided(store, approval_id, head)
            # The assertion over the scope's hash approves and gives the grant.
            outcome = _decide(
                store, registry, run_id, approval_id, signed_scope=scope.scope_hash, grant=asked
            )
            assert outcome.waiting_for == 0
            approval = store.get_approval(approval_id)
            assert approval.status is ApprovalStatus.APPROVED
            (decision,) = decisions_of(store, approval)
            assert decision["scope_hash"] == scope.scope_hash
            (given,) = list_standing_grants(store)
            assert given.scope_hash == scope.scope_hash and given.calls_given == 2
            assert given.approval_id == approval_id
            assert audit_decisions(store, registry) == []
        ran = await session.call_tool("notes_write_note", first)
        assert not ran.is_error, text_of(ran)
        # The grant lets the next write through without asking anyone.
        second = await session.call_tool(
            "notes_write_note", {"path": "second.md", "content": "under the grant"}
        )
        assert not second.is_error, text_of(second)
        assert not text_of(second).startswith("PENDING_APPROVAL: ")
        assert len(setup.executions("write_note")) == 2
    assert (notes / "second.md").read_text() == "under the grant"
    with open_store(setup.database, create=False) as store:
        assert audit_decisions(store, registry) == []
        assert store.verify_chain().ok and store.verify_state().ok
