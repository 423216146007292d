"""The proxy in passkey mode, driven by a real MCP host over stdio: an approval a shell wrote
through the library (a consistent chain, no authenticator) does not make the call run; an
approval an approver's passkey proves does, once."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from inbox_support import notes_setup
from passkey_support import ORIGIN, SoftAuthenticator, registry_of
from proxy_helpers import host, text_of

from agentrt.passkeys import QuorumRule, decide, decision_challenge
from agentrt.store import ApprovalStatus, open_store

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.timeout(120)]

ALICE = SoftAuthenticator()


async def test_an_approved_call_runs_only_when_an_approvers_passkey_proves_it(
    tmp_path: Path,
) -> None:
    setup, _notes = await notes_setup(tmp_path)
    registry = registry_of(
        setup.root / "conf" / "approvers.json", ALICE.approver("alice", "alice@example.com")
    )
    setup.rewrite(approval_auth="passkey")
    forged_args = {"path": "forged.md", "content": "a shell approved this"}
    real_args = {"path": "real.md", "content": "alice approved this"}
    async with host(setup) as session:
        pending = await session.call_tool("notes_write_note", forged_args)
        assert text_of(pending).startswith("PENDING_APPROVAL: ")
        with anyio.fail_after(30):
            while "agentrt proxy: inbox at http://localhost:" not in setup.stderr():
                await anyio.sleep(0.1)

        granted = setup.approve_latest()  # through the library: what a shell can do
        assert granted.status is ApprovalStatus.APPROVED
        refused = await session.call_tool("notes_write_note", forged_args)
        assert "not proven by an approver's passkey; the call did not run" in text_of(refused)
        assert setup.executions("write_note") == []
        assert (
            f"approval {granted.approval_id} is granted, but no approver's passkey assertion "
            "proves it; the call does not run"
        ) in setup.stderr()

        pending = await session.call_tool("notes_write_note", real_args)
        assert text_of(pending).startswith("PENDING_APPROVAL: ")
        run_id, approval_id = setup.waiting_commands()[-1]
        with open_store(setup.database, create=False) as store:
            shown = store.get_approval(approval_id)
            challenge = decision_challenge(approval_id, shown.approval_hash, "approve", None)
            decide(
                store, registry, run_id, approval_id=approval_id,
                approval_hash=shown.approval_hash, verdict="approve",
                assertion=ALICE.sign(challenge), origin=ORIGIN, quorum=QuorumRule({}),
            )  # fmt: skip
        ran = await session.call_tool("notes_write_note", real_args)
        assert not ran.is_error, text_of(ran)
        assert len(setup.executions("write_note")) == 1
