"""A tool's own quorum: `"approvals": {"require": N}` inside a tool's rule in proxy.json asks N
distinct approvers' passkeys for that tool's approvals, over its side-effect class's quorum;
refused in one sentence when N is not 1 to 16 or passkey mode is off."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from inbox_support import RULES, notes_setup
from passkey_support import ORIGIN, SoftAuthenticator, registry_of, waiting_runs
from proxy_helpers import host, text_of

from agentrt.passkeys import QuorumRule, audit_decisions, decide, decision_challenge
from agentrt.proxy import ConfigError, load_config
from agentrt.store import ApprovalStatus, open_store

ALICE, BOB = SoftAuthenticator(), SoftAuthenticator()
PASSKEYS: dict[str, Any] = {"approval_auth": "passkey", "inbox": {}}


def _config(tmp_path: Path, rules: dict[str, Any], **top: Any) -> Path:
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir(exist_ok=True)
    document: dict[str, Any] = {
        "database": "state/proxy.db",
        "session": "desk-1",
        "servers": [{"name": "fs", "command": ["node", "server.js", str(sandbox)],
                     "manifest": "fs.manifest.json", "rules": rules}],
        **top,
    }  # fmt: skip
    path = tmp_path / "proxy.json"
    path.write_text(json.dumps(document))
    path.chmod(0o600)
    return path


def test_a_tool_rules_quorum_is_read_by_the_tools_final_name_and_wins_over_its_class(
    tmp_path: Path,
) -> None:
    rules = {
        "write_file": {"side_effect": "destructive", "approvals": {"require": 2}},
        "move_file": {"side_effect": "destructive", "rename": "relocate",
                      "approvals": {"require": 4}},
        "delete_file": {"side_effect": "destructive"},
    }  # fmt: skip
    config = load_config(
        _config(tmp_path, rules, **PASSKEYS, approvals={"destructive": {"require": 3}})
    )
    assert config.passkeys is not None
    assert dict(config.passkeys.quorum.by_tool) == {"fs_write_file": 2, "relocate": 4}
    assert dict(config.passkeys.quorum.by_class) == {"destructive": 3}
    rule = config.servers[0].tool_rules["write_file"]
    assert rule.require == 2 and rule.outcome is None


@pytest.mark.parametrize(
    ("approvals", "sentence"),
    [
        ({"require": 0}, "approvals.require must be a whole number from 1 to 16"),
        ({"require": 17}, "approvals.require must be a whole number from 1 to 16"),
        ({"require": True}, "approvals.require must be a whole number from 1 to 16"),
        ({"require": "2"}, "approvals.require must be a whole number from 1 to 16"),
        ({"require": 2, "of": "admins"}, 'approvals must be {"require": N}'),
        (2, 'approvals must be {"require": N}'),
    ],
)
def test_a_tool_rules_quorum_outside_1_to_16_is_refused_naming_the_rule(
    tmp_path: Path, approvals: Any, sentence: str
) -> None:
    rules = {"write_file": {"side_effect": "destructive", "approvals": approvals}}
    with pytest.raises(ConfigError) as refused:
        load_config(_config(tmp_path, rules, **PASSKEYS))
    message = str(refused.value)
    assert 'the rule for "write_file"' in message and sentence in message
    assert message.count(".") <= 3 + str(tmp_path).count(".")  # one sentence, the path's dots


def test_a_tool_rules_quorum_without_passkey_mode_is_refused(tmp_path: Path) -> None:
    rules = {"write_file": {"side_effect": "destructive", "approvals": {"require": 2}}}
    with pytest.raises(ConfigError) as refused:
        load_config(_config(tmp_path, rules))
    assert (
        'server "fs" rule "write_file" approvals counts approvers\' passkeys: it needs '
        '"approval_auth": "passkey"'
    ) in str(refused.value)


def test_a_tools_quorum_decides_how_many_people_approve_over_its_class(
    database: Any, tmp_path: Path
) -> None:
    registry = registry_of(
        tmp_path / "approvers.json", ALICE.approver("alice", "alice@example.com"),
        BOB.approver("bob", "bob@example.com"),
    )  # fmt: skip
    # The class alone would need 3; the tool's rule asks 2, and wins.
    quorum = QuorumRule({"local_mutation": 3}, by_tool={"write_note": 2})
    (waiting,) = waiting_runs(database, tmp_path / "notes", 1)
    with open_store(database) as store:
        assert quorum.required(store.get_approval(waiting.approval_id)) == 2
        for authenticator, left in ((ALICE, 1), (BOB, 0)):
            challenge = decision_challenge(
                waiting.approval_id, waiting.approval_hash, "approve", None, 2
            )
            outcome = decide(
                store, registry, waiting.run_id, approval_id=waiting.approval_id,
                approval_hash=waiting.approval_hash, verdict="approve",
                assertion=authenticator.sign(challenge), origin=ORIGIN, quorum=quorum,
            )  # fmt: skip
            assert outcome.waiting_for == left
        approval = store.get_approval(waiting.approval_id)
        assert approval.status is ApprovalStatus.APPROVED
        assert approval.decided_by == "alice, bob"
        assert audit_decisions(store, registry) == []
        assert store.verify_chain().ok and store.verify_state().ok


@pytest.mark.anyio
@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_the_proxy_runs_a_call_only_once_its_tools_quorum_of_people_approved(
    tmp_path: Path,
) -> None:
    setup, notes = await notes_setup(tmp_path)
    registry = registry_of(
        setup.root / "conf" / "approvers.json", ALICE.approver("alice", "alice@example.com"),
        BOB.approver("bob", "bob@example.com"),
    )  # fmt: skip
    rules = {**RULES, "write_note": {"side_effect": "local_mutation", "approvals": {"require": 2}}}
    servers = [{**setup.document["servers"][0], "rules": rules}]
    setup.rewrite(approval_auth="passkey", servers=servers)
    config = load_config(setup.config_path)
    assert config.passkeys is not None
    quorum = config.passkeys.quorum
    one = {"path": "one.md", "content": "one person said yes"}
    two = {"path": "two.md", "content": "two people said yes"}
    async with host(setup) as session:
        assert text_of(await session.call_tool("notes_write_note", one)).startswith(
            "PENDING_APPROVAL: "
        )
        run_id, approval_id = setup.waiting_commands()[-1]
        with open_store(setup.database, create=False) as store:
            shown = store.get_approval(approval_id)
            assert quorum.required(shown) == 2
            # Granted by one real approver under a quorum of one: the proxy, which reads the
            # tool's quorum of two, does not run it.
            challenge = decision_challenge(approval_id, shown.approval_hash, "approve", None, 1)
            decide(
                store, registry, run_id, approval_id=approval_id,
                approval_hash=shown.approval_hash, verdict="approve",
                assertion=ALICE.sign(challenge), origin=ORIGIN, quorum=QuorumRule({}),
            )  # fmt: skip
        refused = await session.call_tool("notes_write_note", one)
        assert "not proven by an approver's passkey; the call did not run" in text_of(refused)
        assert "where its quorum needs 2" in setup.stderr()
        assert setup.executions("write_note") == []

        assert text_of(await session.call_tool("notes_write_note", two)).startswith(
            "PENDING_APPROVAL: "
        )
        run_id, approval_id = setup.waiting_commands()[-1]
        with open_store(setup.database, create=False) as store:
            shown = store.get_approval(approval_id)
            for authenticator in (ALICE, BOB):
                challenge = decision_challenge(approval_id, shown.approval_hash, "approve", None, 2)
                decide(
                    store, registry, run_id, approval_id=approval_id,
                    approval_hash=shown.approval_hash, verdict="approve",
                    assertion=authenticator.sign(challenge), origin=ORIGIN, quorum=quorum,
                )  # fmt: skip
        ran = await session.call_tool("notes_write_note", two)
        assert not ran.is_error, text_of(ran)
        assert len(setup.executions("write_note")) == 1
    assert (notes / "two.md").read_text() == "two people said yes"
