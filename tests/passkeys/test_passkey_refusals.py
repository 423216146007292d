"""Passkey mode's refusals outside the decision itself: the registry's file, the command's
`approve`/`reject`, the signed approver channel, proxy.json, and a shell-only attacker who
writes decisions straight into the database — each named, nothing else harmed."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx2 as httpx
import pytest
from passkey_support import ORIGIN, SoftAuthenticator, Waiting, registry_of, waiting_runs

from agentrt.approver import signed_request
from agentrt.approver._serve import running_approver
from agentrt.inbox import Listener
from agentrt.passkeys import (
    QuorumRule,
    RegistryError,
    decide,
    decision_challenge,
    read_registry,
)
from agentrt.proxy import ConfigError, load_config
from agentrt.store import ApprovalStatus, Store, enable_passkey_mode, open_store
from agentrt.store.events import EventType

AGENTRT = Path(sys.executable).with_name("agentrt")
ALICE, BOB = SoftAuthenticator(), SoftAuthenticator()
PASSKEY_SENTENCE = (
    "agentrt: this database is decided with approvers' passkeys (passkey mode): decide in the "
    "inbox at http://localhost:PORT, where your passkey signs the decision"
)


def agentrt(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(AGENTRT), *arguments], capture_output=True, text=True, timeout=60, check=False,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620, 0o602])
def test_a_registry_others_can_read_or_write_is_refused(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "approvers.json"
    registry_of(path, ALICE.approver("alice", "alice@example.com"))
    os.chmod(path, mode)
    with pytest.raises(
        RegistryError, match=f"can be read or written by others \\(mode {mode:04o}\\)"
    ):
        read_registry(path)
    listed = agentrt("approvers", "list", "--registry", str(path))
    assert listed.returncode == 2
    assert "whoever writes it can add a key of their own: chmod 600 it" in listed.stderr
    os.chmod(path, 0o600)
    assert [approver.name for approver in read_registry(path).approvers] == ["alice"]


def test_approvers_list_and_remove(tmp_path: Path) -> None:
    path = tmp_path / "approvers.json"
    registry_of(
        path, ALICE.approver("alice", "alice@example.com"), BOB.approver("bob", "bob@example.com")
    )
    listed = agentrt("--json", "approvers", "list", "--registry", str(path))
    assert [json.loads(line)["subject"] for line in listed.stdout.splitlines()] == [
        "alice@example.com", "bob@example.com"
    ]  # fmt: skip
    removed = agentrt("approvers", "remove", "bob", "--registry", str(path))
    assert removed.returncode == 0, removed.stderr
    assert [approver.name for approver in read_registry(path).approvers] == ["alice"]
    assert os.stat(path).st_mode & 0o077 == 0
    again = agentrt("approvers", "remove", "bob", "--registry", str(path))
    assert again.returncode == 1
    assert f"no approver bob is registered in {path}" in again.stderr


def test_approve_and_reject_in_a_terminal_are_refused_in_passkey_mode(tmp_path: Path) -> None:
    database = tmp_path / "runs.db"
    (waiting,) = waiting_runs(database, tmp_path / "notes", 1)
    with open_store(database) as store:
        enable_passkey_mode(store)
        head = store.head_seq()
    for verb in ("approve", "reject"):
        refused = agentrt(
            "--db", str(database), verb, waiting.run_id, "--approval", waiting.approval_id, "--yes"
        )
        assert refused.returncode == 1
        assert refused.stderr.strip() == PASSKEY_SENTENCE
    listing = agentrt("--db", str(database), "approve")
    assert listing.stderr.strip() == PASSKEY_SENTENCE
    with open_store(database) as store:
        assert store.get_approval(waiting.approval_id).status is ApprovalStatus.PENDING
        assert store.head_seq() == head
        assert store.verify_chain().ok


def test_the_approver_channel_refuses_decisions_in_passkey_mode(tmp_path: Path) -> None:
    secret = b"passkeys-secret-passkeys-secret-passkeys"
    database = tmp_path / "runs.db"
    (waiting,) = waiting_runs(database, tmp_path / "notes", 1)
    with open_store(database) as store:
        enable_passkey_mode(store)
        anyio.run(_ask_the_channel, store, secret, waiting)
        assert store.get_approval(waiting.approval_id).status is ApprovalStatus.PENDING
        assert store.verify_chain().ok and store.verify_state().ok


async def _ask_the_channel(store: Store, secret: bytes, waiting: Waiting) -> None:
    async with (
        running_approver(store, secret, Listener("127.0.0.1", 0)) as base,
        httpx.AsyncClient(timeout=10.0, trust_env=False) as client,
    ):
        path = f"/runs/{waiting.run_id}/approvals/{waiting.approval_id}"
        listed = await client.send(signed_request("GET", base + path, secret=secret))
        assert listed.status_code == 200  # reading stays open
        body = {"run_id": waiting.run_id, "approval_id": waiting.approval_id,
                    "hash": waiting.approval_hash, "by": "alice"}  # fmt: skip
        for verb in ("approve", "reject"):
            answer = await client.send(
                signed_request("POST", f"{base}{path}/{verb}", secret=secret, json=body)
            )
            assert answer.status_code == 403
            assert answer.json()["code"] == "passkey_mode"
            assert "decide in the inbox at http://localhost:PORT" in answer.json()["error"]


def _forge(database: Path, run_id: str, approval_id: str, decided: dict[str, Any]) -> None:
    """What a shell with the database can do: append events as the library does (a chain
    that stays consistent) and set the row, in one transaction of the store."""
    with open_store(database) as store, store.transaction() as connection:
        store.append_event(connection, run_id, EventType.APPROVER_DECIDED.value, decided)
        approval = store.get_approval(approval_id)
        store.append_event(
            connection, run_id, EventType.APPROVAL_GRANTED.value,
            {"approval_id": approval_id, "approval_hash": approval.approval_hash,
             "by": decided["approver"], "note": ""},
        )  # fmt: skip
        connection.execute(
            "UPDATE approvals SET status = 'approved', decided_by = ? WHERE approval_id = ?",
            (decided["approver"], approval_id),
        )


def test_verify_names_each_decision_a_shell_wrote_into_the_database(tmp_path: Path) -> None:
    registry_path = tmp_path / "approvers.json"
    registry = registry_of(
        registry_path, ALICE.approver("alice", "alice@example.com"),
        BOB.approver("bob", "bob@example.com"),
    )  # fmt: skip
    database = tmp_path / "runs.db"
    genuine, copied_onto, flipped = waiting_runs(database, tmp_path / "notes", 3)
    with open_store(database) as store:
        challenge = decision_challenge(genuine.approval_id, genuine.approval_hash, "approve", None)
        decide(
            store, registry, genuine.run_id, approval_id=genuine.approval_id,
            approval_hash=genuine.approval_hash, verdict="approve",
            assertion=ALICE.sign(challenge), origin=ORIGIN, quorum=QuorumRule({}),
        )  # fmt: skip
        real = next(
            event.payload for event in store.list_events(genuine.run_id)
            if event.type == "approver_decided"
        )  # fmt: skip
    proven = agentrt("--db", str(database), "verify", "--approvers", str(registry_path))
    assert proven.returncode == 0, proven.stderr

    # Alice's real assertion copied onto another approval, with a consistent chain.
    _forge(database, copied_onto.run_id, copied_onto.approval_id,
           {**real, "approval_id": copied_onto.approval_id,
            "approval_hash": copied_onto.approval_hash})  # fmt: skip
    plain = agentrt("--db", str(database), "verify")
    assert plain.returncode == 0, plain.stderr  # the chain and the tables agree
    exposed = agentrt("--db", str(database), "verify", "--approvers", str(registry_path))
    assert exposed.returncode == 1
    assert (
        f"approval {copied_onto.approval_id} of run {copied_onto.run_id} has a decision at event"
    ) in exposed.stderr
    # Its signature is already in the chain: a replay (and its challenge is another's).
    assert "fails: replays a passkey assertion already recorded for a decision" in exposed.stderr

    # A row flipped by hand, with no event at all: the tables disagree with the chain.
    with sqlite3.connect(database) as raw:
        raw.execute(
            "UPDATE approvals SET status = 'approved' WHERE approval_id = ?",
            (flipped.approval_id,),
        )
    flipped_verify = agentrt("--db", str(database), "verify", "--approvers", str(registry_path))
    assert flipped_verify.returncode == 1
    assert flipped.approval_id in flipped_verify.stderr or flipped.run_id in flipped_verify.stderr


def _config(tmp_path: Path, **top: Any) -> Path:
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir(exist_ok=True)
    document: dict[str, Any] = {
        "database": "state/proxy.db",
        "session": "desk-1",
        "servers": [{"name": "fs", "command": ["node", "server.js", str(sandbox)],
                     "manifest": "fs.manifest.json",
                     "rules": {"read_file": {"side_effect": "read_only"}}}],
        **top,
    }  # fmt: skip
    path = tmp_path / "proxy.json"
    path.write_text(json.dumps(document))
    path.chmod(0o600)
    return path


def test_proxy_json_reads_passkey_mode_and_protects_the_registry(tmp_path: Path) -> None:
    config = load_config(
        _config(tmp_path, approval_auth="passkey", inbox={},
                approvals={"destructive": {"require": 2}})
    )  # fmt: skip
    assert config.passkeys is not None
    assert config.passkeys.registry == tmp_path / "approvers.json"
    assert dict(config.passkeys.quorum.by_class) == {"destructive": 2}
    assert tmp_path / "approvers.json" in config.protected_paths()
    assert load_config(_config(tmp_path)).passkeys is None


@pytest.mark.parametrize(
    ("top", "sentence"),
    [
        ({"approval_auth": "webauthn"}, 'approval_auth must be "passkey" or "label"'),
        ({"approval_auth": "passkey"}, 'so decisions are made in the inbox: add "inbox"'),
        ({"approvals": {"destructive": {"require": 2}}}, 'needs "approval_auth": "passkey"'),
        ({"approval_auth": "passkey", "inbox": {}, "approve_in_host": {}},
         "a host's form is no approver's passkey"),
        ({"approval_auth": "passkey", "inbox": {}, "approvals": {"destructive": {"require": 0}}},
         "approvals.destructive.require must be a whole number from 1 to 16"),
        ({"approval_auth": "passkey", "inbox": {}, "approvals": {"risky": {"require": 2}}},
         "approvals.risky is not a side-effect class"),
    ],
)  # fmt: skip
def test_proxy_json_refuses_a_passkey_mode_it_cannot_keep(
    tmp_path: Path, top: dict[str, Any], sentence: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        load_config(_config(tmp_path, **top))
    assert sentence in str(refused.value)


def test_a_registry_installed_as_roots_is_read_only_where_nobody_else_can_write_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to make root's files")
    installed = tmp_path / "etc-agentrt"
    installed.mkdir(mode=0o755)
    path = installed / "approvers.json"
    registry_of(path, ALICE.approver("alice", "alice@example.com"))
    os.chmod(path, 0o644)  # public keys: readable, written by root only
    monkeypatch.setattr(os, "geteuid", lambda: 1000)  # the host's user reads root's file
    assert [approver.name for approver in read_registry(path).approvers] == ["alice"]
    os.chmod(path, 0o664)
    with pytest.raises(RegistryError, match="can be written by others than root"):
        read_registry(path)
    os.chmod(path, 0o644)
    os.chmod(installed, 0o777)
    with pytest.raises(RegistryError, match="in a directory others than root can write"):
        read_registry(path)
    os.chmod(installed, 0o755)
    os.chown(path, 1001, 1001)
    with pytest.raises(RegistryError, match="is owned by another user"):
        read_registry(path)


def test_verify_names_a_quorum_a_shell_completed_with_one_real_approver(tmp_path: Path) -> None:
    registry_path = tmp_path / "approvers.json"
    registry = registry_of(registry_path, ALICE.approver("alice", "alice@example.com"))
    database = tmp_path / "runs.db"
    (waiting,) = waiting_runs(database, tmp_path / "notes", 1)
    with open_store(database) as store:
        challenge = decision_challenge(
            waiting.approval_id, waiting.approval_hash, "approve", None, 2
        )
        outcome = decide(
            store, registry, waiting.run_id, approval_id=waiting.approval_id,
            approval_hash=waiting.approval_hash, verdict="approve",
            assertion=ALICE.sign(challenge), origin=ORIGIN,
            quorum=QuorumRule({"local_mutation": 2}),
        )  # fmt: skip
        assert outcome.waiting_for == 1
        # The shell writes the quorum as complete with one, and grants (a consistent chain).
        with store.transaction() as connection:
            store.append_event(
                connection, waiting.run_id, EventType.APPROVAL_QUORUM_REACHED.value,
                {"approval_id": waiting.approval_id, "approval_hash": waiting.approval_hash,
                 "approvers": ["alice"], "required": 1},
            )  # fmt: skip
    _forge_grant(database, waiting.run_id, waiting.approval_id, "alice")
    assert agentrt("--db", str(database), "verify").returncode == 0
    exposed = agentrt("--db", str(database), "verify", "--approvers", str(registry_path))
    assert exposed.returncode == 1
    assert (
        f"approval {waiting.approval_id} of run {waiting.run_id} was granted by 1 approver(s) "
        "where its quorum needs 2"
    ) in exposed.stderr


def _forge_grant(database: Path, run_id: str, approval_id: str, by: str) -> None:
    with open_store(database) as store, store.transaction() as connection:
        approval = store.get_approval(approval_id)
        store.append_event(
            connection, run_id, EventType.APPROVAL_GRANTED.value,
            {"approval_id": approval_id, "approval_hash": approval.approval_hash, "by": by,
             "note": ""},
        )  # fmt: skip
        connection.execute(
            "UPDATE approvals SET status = 'approved', decided_by = ? WHERE approval_id = ?",
            (by, approval_id),
        )


def test_verify_checks_a_passkey_database_with_the_configurations_registry(
    tmp_path: Path,
) -> None:
    home = tmp_path / "config"
    conf = home / "agentrt"
    conf.mkdir(parents=True)
    registry_path = conf / "approvers.json"
    registry_of(registry_path, ALICE.approver("alice", "alice@example.com"))
    database = conf / "runs.db"
    (waiting,) = waiting_runs(database, tmp_path / "notes", 1)
    with open_store(database) as store:
        enable_passkey_mode(store)
    _config(conf, database=str(database), approval_auth="passkey", inbox={})
    environment = {**os.environ, "XDG_CONFIG_HOME": str(home)}
    environment.pop("AGENTRT_DB", None)

    def verify_here() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(AGENTRT), "verify"], capture_output=True, text=True, timeout=60, check=False,
            env=environment,
        )  # fmt: skip

    proven = verify_here()
    assert proven.returncode == 0, proven.stderr
    assert "every decision is proven by an approver's passkey" in proven.stdout
    _forge_grant(database, waiting.run_id, waiting.approval_id, "alice")
    exposed = verify_here()
    assert exposed.returncode == 1
    assert f"approval {waiting.approval_id} of run {waiting.run_id} was granted without" in (
        exposed.stderr
    )


def test_passkeys_without_py_webauthn_are_refused_in_one_sentence(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from agentrt.passkeys import PasskeyRefused, check_assertion
    from agentrt.passkeys._registry import Registry

    monkeypatch.setitem(sys.modules, "webauthn", None)  # as if the extra were not installed
    authenticator = SoftAuthenticator()
    registry = Registry(Path("approvers.json"), (authenticator.approver("alice", "alice"),))
    challenge = decision_challenge("id", "0" * 64, "approve", None)
    with pytest.raises(PasskeyRefused, match=r"^passkeys need py_webauthn, which is not installed"):
        check_assertion(registry, authenticator.sign(challenge), challenge)
