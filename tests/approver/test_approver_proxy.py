"""`agentrt approver serve` as a real process deciding what a real MCP host waits on."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx2 as httpx
import pytest
from approver_support import SECRET, secret_file
from inbox_support import AGENTRT, notes_setup
from proxy_helpers import host, text_of

from agentrt.approver import signed_request
from agentrt.store import ApprovalStatus, open_store

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]


@contextmanager
def approver_process(database: Path, secret: Path, root: Path) -> Iterator[str]:
    """`agentrt --db DATABASE approver serve`, its base address from its first line."""
    errors = (root / "approver.stderr").open("w")
    process = subprocess.Popen(
        [str(AGENTRT), "--db", str(database), "approver", "serve", "--listen", "127.0.0.1:0",
         "--secret-file", str(secret)],
        stdout=subprocess.PIPE, stderr=errors, text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        first = process.stdout.readline().strip()
        assert first.startswith("approver: http://127.0.0.1:"), (
            root / "approver.stderr"
        ).read_text()
        yield first.removeprefix("approver: ")
    finally:
        process.terminate()
        process.wait(timeout=10)
        errors.close()


@pytest.mark.slow
async def test_the_channel_approves_what_a_real_host_waits_on_and_the_call_then_runs(
    tmp_path: Path,
) -> None:
    setup, notes = await notes_setup(tmp_path)
    document = dict(setup.document)
    del document["inbox"]
    setup.document.clear()
    setup.rewrite(**document)
    secret = secret_file(tmp_path)
    arguments = {"path": "a.md", "content": "from the channel\n"}
    async with host(setup) as session:
        held = await session.call_tool("notes_write_note", arguments)
        assert text_of(held).startswith("PENDING_APPROVAL: ")
        ((run_id, approval_id),) = setup.waiting_commands()
        assert isinstance(setup.database, Path)
        with approver_process(setup.database, secret, tmp_path) as base:
            async with httpx.AsyncClient(timeout=10.0, trust_env=False) as client:
                listed = await client.send(
                    signed_request("GET", f"{base}/runs/{run_id}/approvals", secret=SECRET)
                )
                assert listed.status_code == 200, listed.text
                (shown,) = listed.json()["approvals"]
                assert shown["approval_id"] == approval_id and shown["tool"] == "notes_write_note"
                decision = {"run_id": run_id, "approval_id": approval_id, "hash": shown["hash"],
                            "by": "alice", "note": "ok"}  # fmt: skip
                unsigned = await client.post(f"{base}{shown['path']}/approve", json=decision)
                assert unsigned.status_code == 401
                assert setup.approval(approval_id).status is ApprovalStatus.PENDING
                approved = await client.send(
                    signed_request(
                        "POST", f"{base}{shown['path']}/approve", secret=SECRET, json=decision
                    )
                )
                assert approved.status_code == 202, approved.text
        ran = await session.call_tool("notes_write_note", arguments)
        assert not text_of(ran).startswith("PENDING_APPROVAL"), text_of(ran)
    assert (notes / "a.md").read_text() == "from the channel\n"
    with open_store(setup.database, read_only=True, create=False) as store:
        approval = store.get_approval(approval_id)
        assert (approval.status, approval.decided_by) == (ApprovalStatus.USED, "alice")
        assert store.verify_chain().ok and store.verify_state().ok


def test_the_command_refuses_a_secret_others_can_read_or_a_short_one(tmp_path: Path) -> None:
    database = tmp_path / "runs.db"
    open_store(database).close()
    shared = secret_file(tmp_path, mode=0o644)
    for secret, problem in (
        (shared, "can be read or written by others"),
        (
            secret_file(tmp_path, b"short", 0o600, "short.secret"),
            "holds 5 bytes; a secret is at least 32",
        ),
    ):
        finished = subprocess.run(
            [str(AGENTRT), "--db", str(database), "approver", "serve", "--listen",
             "127.0.0.1:0", "--secret-file", str(secret)],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert finished.returncode == 2 and problem in finished.stderr, finished.stderr
    missing = subprocess.run(
        [str(AGENTRT), "--db", str(database), "approver", "serve", "--listen", "127.0.0.1:0"],
        capture_output=True, text=True, timeout=30,
        env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert missing.returncode == 2 and "AGENTRT_APPROVER_SECRET_FILE" in missing.stderr


@pytest.mark.slow
async def test_the_channel_gives_a_standing_grant_against_the_scope_hash_it_showed(
    tmp_path: Path,
) -> None:
    setup, notes = await notes_setup(tmp_path)
    document = dict(setup.document)
    del document["inbox"]
    document["standing_grants"] = {"max_for": "1h", "max_calls": 5}
    setup.document.clear()
    setup.rewrite(**document)
    secret = secret_file(tmp_path)
    async with host(setup) as session:
        held = await session.call_tool("notes_write_note", {"path": "a.md", "content": "one\n"})
        assert text_of(held).startswith("PENDING_APPROVAL: ")
        ((run_id, approval_id),) = setup.waiting_commands()
        assert isinstance(setup.database, Path)
        with approver_process(setup.database, secret, tmp_path) as base:
            path = f"{base}/runs/{run_id}/approvals/{approval_id}"
            async with httpx.AsyncClient(timeout=10.0, trust_env=False) as client:

                async def post(suffix: str, body: dict[str, object]) -> httpx.Response:
                    return await client.send(
                        signed_request("POST", f"{path}/{suffix}", secret=SECRET, json=body)
                    )

                shown = (await client.send(signed_request("GET", path, secret=SECRET))).json()[
                    "hash"
                ]
                asked = {"calls": 2}
                scope = await post(
                    "grant-scope",
                    {"run_id": run_id, "approval_id": approval_id, "grant": asked},
                )
                assert scope.status_code == 200, scope.text
                assert any("2" in line for line in scope.json()["lines"])
                decision = {"run_id": run_id, "approval_id": approval_id, "hash": shown,
                            "by": "alice"}  # fmt: skip
                # Wider than the operator's maximum, or another scope than shown: refused,
                # nothing decided.
                wide = await post("approve", {**decision, "grant": {"calls": 50}})
                assert wide.status_code == 400, wide.text
                other = await post(
                    "approve", {**decision, "grant": {**asked, "scope_hash": "0" * 64}}
                )
                assert other.status_code == 400, other.text
                assert setup.approval(approval_id).status is ApprovalStatus.PENDING
                granted = await post(
                    "approve",
                    {**decision, "grant": {**asked, "scope_hash": scope.json()["scope_hash"]}},
                )
                assert granted.status_code == 202, granted.text
        ran = await session.call_tool("notes_write_note", {"path": "a.md", "content": "one\n"})
        assert not text_of(ran).startswith("PENDING_APPROVAL"), text_of(ran)
        # The grant covers the next two calls with other arguments, then asks again.
        for name in ("b.md", "c.md"):
            covered = await session.call_tool(
                "notes_write_note", {"path": name, "content": "covered\n"}
            )
            assert not text_of(covered).startswith("PENDING_APPROVAL"), text_of(covered)
        asked_again = await session.call_tool(
            "notes_write_note", {"path": "d.md", "content": "asks\n"}
        )
        assert text_of(asked_again).startswith("PENDING_APPROVAL: ")
    assert (notes / "c.md").read_text() == "covered\n"
    assert not (notes / "d.md").exists()
    with open_store(setup.database, read_only=True, create=False) as store:
        assert store.verify_chain().ok and store.verify_state().ok
