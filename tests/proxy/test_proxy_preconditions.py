"""A rule's precondition through a real `agentrt proxy` in front of the stock filesystem
server, driven by the official SDK's client: an approval binds the file it was decided
against, a changed file answers STALE and keeps the other edit, a fresh approval shows
the new state and writes once.  Both backends."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from proxy_helpers import AGENTRT, FILESYSTEM_SERVER, ProxySetup, host, text_of, write_private

from agentrt.cli._review import review_lines
from agentrt.mcp import Server, pin
from agentrt.proxy.config import ConfigError, load_config
from agentrt.store import ApprovalStatus, open_store

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120), pytest.mark.slow]

READ = {"tool": "read_text_file", "arguments": {"path": "$.path"}, "absent_when": "ENOENT"}


def _rules(precondition: dict[str, Any] | None = READ) -> dict[str, Any]:
    write: dict[str, Any] = {"side_effect": "local_mutation", "allow_hint_mismatch": True}
    edit: dict[str, Any] = {"side_effect": "local_mutation", "allow_hint_mismatch": True}
    if precondition is not None:
        write["precondition"] = precondition
        edit["precondition"] = {"tool": "read_text_file", "arguments": {"path": "$.path"}}
    return {
        "read_text_file": {"side_effect": "read_only"},
        "list_directory": {"side_effect": "read_only"},
        "write_file": write,
        "edit_file": edit,
    }


async def _filesystem(
    root: Path, database: str | Path, rules: dict[str, Any] | None = None
) -> tuple[ProxySetup, Path]:
    sandbox = (root / "sandbox").resolve()
    sandbox.mkdir()
    conf = root / "conf"
    command = ["node", str(FILESYSTEM_SERVER), str(sandbox)]
    manifest = await pin(Server(name="fs", command=command, connect_timeout=30.0))
    write_private(conf / "fs.manifest.json", manifest.to_json())
    on_postgres = str(database).startswith("postgresql://")
    document: dict[str, Any] = {
        "database": str(database) if on_postgres else "proxy.db",
        "session": "fs-session",
        "hold": "300ms",
        "policy": {"read_only": "allow", "local_mutation": "require_approval"},
        "servers": [
            {
                "name": "fs",
                "command": command,
                "default_timeout": "10s",
                "manifest": "fs.manifest.json",
                "rules": rules if rules is not None else _rules(),
            }
        ],
    }
    config_path = write_private(conf / "proxy.json", json.dumps(document))
    setup = ProxySetup(
        root=root, config_path=config_path,
        database=str(database) if on_postgres else conf / "proxy.db",
        upstream_log=root / "none.log", stderr_path=root / "proxy.stderr", document=document,
    )  # fmt: skip
    return setup, sandbox


def _state_of(setup: ProxySetup) -> dict[str, Any]:
    _run_id, approval_id = setup.waiting_commands()[-1]
    state = setup.approval(approval_id).presentation["state"]
    assert isinstance(state, dict)
    return state


async def test_a_write_approved_against_a_file_that_changed_is_stale_and_keeps_the_edit(
    tmp_path: Path, database: str | Path
) -> None:
    setup, sandbox = await _filesystem(tmp_path, database)
    notes = sandbox / "notes.md"
    notes.write_text("first line\n")
    write = {"path": str(notes), "content": "first line\nmodel's line\n"}
    async with host(setup) as session:
        asked = await session.call_tool("fs_write_file", write)
        assert text_of(asked).startswith("PENDING_APPROVAL: ")
        assert _state_of(setup)["content"] == "first line\n"
        setup.approve_latest()
        notes.write_text("first line\nsomeone else's line\n")
        stale = await session.call_tool("fs_write_file", write)
        assert text_of(stale).startswith("STALE: "), text_of(stale)
        assert (
            "the state changed after it was approved; nothing ran; calling again asks for a "
            "new approval" in text_of(stale)
        )
        assert notes.read_text() == "first line\nsomeone else's line\n"
        stale_id = setup.waiting_commands()[-1][1]
        status = await session.call_tool("gate_status", {"approval_id": stale_id})
        assert "changed before it ran; it did not run" in text_of(status), text_of(status)
        asked_again = await session.call_tool("fs_write_file", write)
        assert text_of(asked_again).startswith("PENDING_APPROVAL: ")
        assert _state_of(setup)["content"] == "first line\nsomeone else's line\n"
        setup.approve_latest()
        written = await session.call_tool("fs_write_file", write)
        assert written.is_error is False, text_of(written)
        duplicate = await session.call_tool("fs_write_file", write)
    assert notes.read_text() == "first line\nmodel's line\n"
    assert text_of(duplicate).startswith("DUPLICATE: ")
    with open_store(setup.database, create=False) as store:
        stale_runs = [run for run in store.list_runs() if run.reason == "stale"]
        assert len(stale_runs) == 1
        assert store.verify_chain().ok and store.verify_state().ok
    assert "changed after it was approved" in setup.stderr()
    shown = _agentrt("--db", str(setup.database), "show", stale_runs[0].run_id)
    assert shown.returncode == 0, shown.stderr
    assert "step 1: its state read with fs_read_text_file: sha256 " in shown.stdout
    assert "went stale: the state changed after it was approved" in shown.stdout
    verified = _agentrt("--db", str(setup.database), "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    # Reads now denied: recheck names the precondition reads that would fail closed.
    setup.document["policy"] = {"read_only": "deny", "local_mutation": "require_approval"}
    setup.rewrite()
    rechecked = _agentrt("recheck", "--config", str(setup.config_path), "--json")
    assert rechecked.returncode == 0, rechecked.stderr
    records = [json.loads(line) for line in rechecked.stdout.splitlines()]
    differences = [record for record in records if record["record"] == "difference"]
    assert {record["tool"] for record in differences} == {"fs_read_text_file"}
    assert len(differences) == 4  # each run read its state when asked and before it ran


async def test_a_write_to_a_file_that_does_not_exist_binds_its_absence(
    tmp_path: Path, database: str | Path
) -> None:
    setup, sandbox = await _filesystem(tmp_path, database)
    fresh, appearing = sandbox / "fresh.md", sandbox / "appearing.md"
    async with host(setup) as session:
        asked = await session.call_tool("fs_write_file", {"path": str(fresh), "content": "a\n"})
        assert text_of(asked).startswith("PENDING_APPROVAL: ")
        assert _state_of(setup)["absent"] is True
        setup.approve_latest()
        written = await session.call_tool("fs_write_file", {"path": str(fresh), "content": "a\n"})
        assert written.is_error is False, text_of(written)
        # A file that appears between the approval and the execution.
        await session.call_tool("fs_write_file", {"path": str(appearing), "content": "mine\n"})
        setup.approve_latest()
        appearing.write_text("theirs\n")
        stale = await session.call_tool(
            "fs_write_file", {"path": str(appearing), "content": "mine\n"}
        )
    assert fresh.read_text() == "a\n"
    assert text_of(stale).startswith("STALE: ")
    assert appearing.read_text() == "theirs\n"


async def test_a_precondition_that_fails_offers_no_approval_and_names_its_error(
    tmp_path: Path, database: str | Path
) -> None:
    # Without absent_when, the missing file's ENOENT is an error: it fails closed.
    rules = _rules({"tool": "read_text_file", "arguments": {"path": "$.path"}})
    setup, sandbox = await _filesystem(tmp_path, database, rules)
    target = sandbox / "missing.md"
    async with host(setup) as session:
        answer = await session.call_tool("fs_write_file", {"path": str(target), "content": "x"})
        listing = await session.call_tool("fs_list_directory", {"path": str(sandbox)})
    assert text_of(answer).startswith("UNAVAILABLE: "), text_of(answer)
    assert "fs_write_file" in text_of(answer) and "Nothing ran." in text_of(answer)
    assert listing.is_error is False
    assert not target.exists()
    assert setup.waiting_commands() == []
    assert "fs_read_text_file" in setup.stderr() and "ENOENT" in setup.stderr()
    with open_store(setup.database, create=False) as store:
        (run,) = [run for run in store.list_runs() if run.reason == "precondition_unavailable"]
        shown = _agentrt("--db", str(setup.database), "show", run.run_id)
        assert "step 1: its precondition failed: " in shown.stdout
        assert "fs_read_text_file" in shown.stdout and "ENOENT" in shown.stdout
        assert store.latest_approval(run.run_id) is None
        errors = [e.payload["error"] for e in store.list_events(run.run_id)
                  if e.type == "state_read"]  # fmt: skip
        assert len(errors) == 1 and "fs_read_text_file" in errors[0]
        assert store.verify_chain().ok


async def test_an_edit_binds_the_real_file(tmp_path: Path, database: str | Path) -> None:
    setup, sandbox = await _filesystem(tmp_path, database)
    notes = sandbox / "notes.md"
    notes.write_text("alpha\nbeta\n")
    edit = {"path": str(notes), "edits": [{"oldText": "beta", "newText": "gamma"}]}
    async with host(setup) as session:
        await session.call_tool("fs_edit_file", edit)
        assert _state_of(setup)["content"] == "alpha\nbeta\n"
        setup.approve_latest()
        edited = await session.call_tool("fs_edit_file", edit)
    assert edited.is_error is False, text_of(edited)
    assert notes.read_text() == "alpha\ngamma\n"
    with open_store(setup.database, create=False) as store:
        assert [a.status for a in _approvals(store)] == [ApprovalStatus.USED]


def _approvals(store: Any) -> list[Any]:
    return [
        approval
        for run in store.list_runs()
        if (approval := store.latest_approval(run.run_id)) is not None
    ]


@pytest.mark.parametrize(
    ("precondition", "refusal"),
    [
        ({"tool": "write_file", "arguments": {"path": "$.path"}}, "classified read_only"),
        ({"tool": "no_such_tool"}, "classified read_only"),
        ({"tool": "read_text_file", "arguments": {"path": "$path"}}, 'not a path such as "$.path"'),
        ({"tool": "read_text_file", "extra": 1}, 'unknown field "extra"'),
        ({"arguments": {}}, "needs the name of a read-only tool"),
    ],
)
async def test_a_precondition_that_is_not_a_read_of_this_server_is_refused_at_load(
    tmp_path: Path, precondition: dict[str, Any], refusal: str
) -> None:
    setup, _sandbox = await _filesystem(tmp_path, tmp_path / "unused.db", _rules(precondition))
    with pytest.raises(ConfigError) as refused:
        load_config(setup.config_path)
    assert refusal in str(refused.value)
    assert "\n" not in str(refused.value)


def _agentrt(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(AGENTRT), *arguments], capture_output=True, text=True, timeout=60,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


def _show(setup: ProxySetup) -> str:
    run_id, _approval_id = setup.waiting_commands()[-1]
    shown = subprocess.run(
        [str(AGENTRT), "--db", str(setup.database), "show", run_id],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    return shown.stdout


async def test_the_approval_shows_a_write_as_a_diff_against_the_file_read(
    tmp_path: Path,
) -> None:
    setup, sandbox = await _filesystem(tmp_path, tmp_path / "conf" / "proxy.db")
    notes, fresh = sandbox / "notes.md", sandbox / "fresh.md"
    notes.write_text("".join(f"line {n}\n" for n in range(1, 2001)))
    new = notes.read_text().replace("line 1500\n", "line fifteen hundred\n")
    edit = {"path": str(notes), "edits": [{"oldText": "line 7\n", "newText": "line seven\n"}]}
    async with host(setup) as session:
        await session.call_tool("fs_write_file", {"path": str(notes), "content": new})
        write_view = _show(setup)
        await session.call_tool("fs_write_file", {"path": str(fresh), "content": "hello\n"})
        absent_view = _show(setup)
        await session.call_tool("fs_edit_file", edit)
        edit_view = _show(setup)
        _run_id, approval_id = setup.waiting_commands()[-1]
        inbox = approval_view_of(setup, approval_id)
    # A large file: its change, with line numbers, not the file.
    assert "@@ -1497,7 +1497,7 @@" in write_view
    assert "- line 1500" in write_view and "+ line fifteen hundred" in write_view
    assert "line 1000" not in write_view.split("change")[-1]
    assert "the file does not exist yet" in absent_view and "+ hello" in absent_view
    assert "- line 7" in edit_view and "+ line seven" in edit_view
    assert "@@ -4,7 +4,7 @@" in edit_view
    (change,) = [block for block in inbox["edits"] if "against the state read" in block["label"]]
    assert {"sign": "+", "text": "line seven"} in change["diff"]
    # The whole file read stays one flag away.
    assert not [line for line in edit_view.splitlines() if line.startswith("state read ")]
    with open_store(setup.database, create=False) as store:
        full = "\n".join(review_lines(store.get_approval(approval_id), full=True))
    (row,) = [line for line in full.splitlines() if line.startswith("state read ")]
    assert "2000 lines" in row and "line 1999" in full


def approval_view_of(setup: ProxySetup, approval_id: str) -> dict[str, Any]:
    from agentrt.inbox._views import approval_view

    with open_store(setup.database, create=False) as store:
        return approval_view(store, store.get_approval(approval_id), {})


SLOW_FILES = Path(__file__).parent / "servers" / "slow_files.py"


async def _slow_files(
    root: Path, database: str | Path, *, reconcile: bool, read_seconds: float = 0
) -> tuple[ProxySetup, Path]:
    """A proxy in front of `slow_files.py`, whose write takes effect and then outlasts the
    rule's one-second timeout the first time: an unknown outcome that did happen."""
    sandbox = (root / "sandbox").resolve()
    sandbox.mkdir()
    conf = root / "conf"
    log = root / "writes.log"
    command = [sys.executable, str(SLOW_FILES)]
    environment = [f"SLOW_FILES_LOG={log}"]
    manifest = await pin(
        Server(name="files", command=command, env=environment, connect_timeout=30.0)
    )
    write_private(conf / "files.manifest.json", manifest.to_json())
    write: dict[str, Any] = {
        "side_effect": "local_mutation", "allow_hint_mismatch": True, "timeout": "1s",
        "precondition": {"tool": "read_file", "absent_when": "ENOENT",
                         "arguments": {"path": "$.path", "seconds": read_seconds}},
    }  # fmt: skip
    if reconcile:
        write["reconcile"] = True
    on_postgres = str(database).startswith("postgresql://")
    document: dict[str, Any] = {
        "database": str(database) if on_postgres else "proxy.db",
        "session": "files-session",
        "hold": "300ms",
        "policy": {"read_only": "allow", "local_mutation": "require_approval"},
        "servers": [
            {
                "name": "files",
                "command": command,
                "env": environment,
                "manifest": "files.manifest.json",
                "rules": {
                    "read_file": {"side_effect": "read_only", "timeout": "1s"},
                    "write_file": write,
                },
            }
        ],
    }
    config_path = write_private(conf / "proxy.json", json.dumps(document))
    setup = ProxySetup(
        root=root, config_path=config_path,
        database=str(database) if on_postgres else conf / "proxy.db",
        upstream_log=log, stderr_path=root / "proxy.stderr", document=document,
    )  # fmt: skip
    return setup, sandbox


async def test_a_cut_off_write_that_took_effect_is_reconciled_and_never_run_again(
    tmp_path: Path, database: str | Path
) -> None:
    setup, sandbox = await _slow_files(tmp_path, database, reconcile=True)
    notes = sandbox / "notes.md"
    notes.write_text("old\n")
    write = {"path": str(notes), "content": "new\n", "seconds": 3}
    async with host(setup) as session:
        asked = await session.call_tool("files_write_file", write)
        assert text_of(asked).startswith("PENDING_APPROVAL: ")
        setup.approve_latest()
        reconciled = await session.call_tool("files_write_file", write)
        again = await session.call_tool("files_write_file", write)
    assert reconciled.is_error is False, text_of(reconciled)
    assert text_of(reconciled).startswith("reconciled: ")
    assert text_of(again).startswith("DUPLICATE: ")
    assert setup.executions("write_file") == ["write_file notes.md"]
    assert notes.read_text() == "new\n"
    with open_store(setup.database, create=False) as store:
        (run,) = store.list_runs()
        events = [event.type for event in store.list_events(run.run_id)]
        assert "step_reconciled" in events and events.count("tool_started") == 1
        assert store.verify_chain().ok and store.verify_state().ok


async def test_a_cut_off_write_without_reconcile_shows_it_took_effect_and_waits(
    tmp_path: Path,
) -> None:
    setup, sandbox = await _slow_files(tmp_path, tmp_path / "conf" / "proxy.db", reconcile=False)
    notes = sandbox / "notes.md"
    notes.write_text("old\n")
    write = {"path": str(notes), "content": "new\n", "seconds": 3}
    async with host(setup) as session:
        await session.call_tool("files_write_file", write)
        setup.approve_latest()
        unknown = await session.call_tool("files_write_file", write)
    assert text_of(unknown).startswith("UNKNOWN_OUTCOME: "), text_of(unknown)
    shown = _show(setup)
    assert "the state changed since it was approved before" in shown
    assert "already holds the intended result" in shown
    assert setup.executions("write_file") == ["write_file notes.md"]


@pytest.mark.parametrize(
    ("rule", "refusal"),
    [
        ({"reconcile": True}, "reconcile needs a precondition"),
        ({"reconcile": "yes", "precondition": READ}, "reconcile must be true or false"),
    ],
)
async def test_a_reconcile_without_a_precondition_or_not_a_flag_is_refused_at_load(
    tmp_path: Path, rule: dict[str, Any], refusal: str
) -> None:
    rules = _rules(None)
    rules["write_file"].update(rule)
    setup, _sandbox = await _filesystem(tmp_path, tmp_path / "unused.db", rules)
    with pytest.raises(ConfigError) as refused:
        load_config(setup.config_path)
    assert refusal in str(refused.value) and '"write_file"' in str(refused.value)
    assert "\n" not in str(refused.value)


async def test_a_precondition_that_hangs_offers_no_approval_and_runs_nothing(
    tmp_path: Path, database: str | Path
) -> None:
    setup, sandbox = await _slow_files(tmp_path, database, reconcile=False, read_seconds=30)
    notes = sandbox / "notes.md"
    async with host(setup) as session:
        answer = await session.call_tool("files_write_file", {"path": str(notes), "content": "x\n"})
        read = await session.call_tool("files_read_file", {"path": str(sandbox / "none")})
    assert text_of(answer).startswith("UNAVAILABLE: "), text_of(answer)
    assert "Nothing ran." in text_of(answer)
    # The server answers other calls meanwhile (here the missing file's own error).
    assert "ENOENT" in text_of(read)
    assert not notes.exists() and setup.executions("write_file") == []
    assert "files_read_file did not answer within 1s" in setup.stderr()
    assert setup.waiting_commands() == []


async def test_a_precondition_that_fails_before_the_run_keeps_the_grant_and_runs_nothing(
    tmp_path: Path, database: str | Path
) -> None:
    setup, sandbox = await _filesystem(tmp_path, database)
    notes = sandbox / "notes.md"
    notes.write_text("first\n")
    write = {"path": str(notes), "content": "second\n"}
    async with host(setup) as session:
        await session.call_tool("fs_write_file", write)
        approval = setup.approve_latest()
        # The file is swapped for a directory: the re-read errors (not ENOENT).
        notes.unlink()
        notes.mkdir()
        unavailable = await session.call_tool("fs_write_file", write)
        assert text_of(unavailable).startswith("UNAVAILABLE: "), text_of(unavailable)
        assert notes.is_dir()
        assert setup.approval(approval.approval_id).status is ApprovalStatus.APPROVED
        # The same state back: the grant still holds, and the write runs once.
        notes.rmdir()
        notes.write_text("first\n")
        written = await session.call_tool("fs_write_file", write)
    assert written.is_error is False, text_of(written)
    assert notes.read_text() == "second\n"
    assert "fs_read_text_file" in setup.stderr()
