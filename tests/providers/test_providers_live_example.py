"""examples/live end to end: a model (a fake Messages API) counts words in a sandbox through the
stock filesystem server; the first write waits for a person, the policy's grant covers the next,
the run resumes in a new process and ends with the terminal tool."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from api_formats import anthropic_message

from agentrt import RunStatus, approve, open_store

pytestmark = [pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[2]
LIVE = ROOT / "examples" / "live" / "live.py"


def _call(name: str, arguments: dict[str, Any], number: int) -> dict[str, Any]:
    return anthropic_message(
        [{"type": "tool_use", "id": f"toolu_{number}", "name": name, "input": arguments}],
        stop_reason="tool_use",
    )


def _live(model_server: Any, database: Path, sandbox: Path, *extra: str) -> str:
    done = subprocess.run(
        [sys.executable, str(LIVE), "--model", "anthropic:claude-fake", "--base-url",
         model_server.url, "--db", str(database), "--sandbox", str(sandbox), *extra],
        capture_output=True, text=True, timeout=90, stdin=subprocess.DEVNULL, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_live_example_asks_once_resumes_and_finishes(tmp_path: Path, model_server: Any) -> None:
    sandbox = (tmp_path / "sandbox").resolve()
    database = tmp_path / "live.db"
    model_server.answer(_call("fs_list_directory", {"path": str(sandbox)}, 1))
    model_server.answer(_call("fs_read_text_file", {"path": str(sandbox / "alpha.txt")}, 2))
    model_server.answer(
        _call("fs_write_file", {"path": str(sandbox / "counts/alpha.count"), "content": "3"}, 3)
    )

    # First process: reads run, the first write waits for a person.
    first = _live(model_server, database, sandbox)
    assert "waits for a person: fs_write_file" in first
    run_id = first.split()[1]
    assert not (sandbox / "counts" / "alpha.count").exists()
    with open_store(database) as store:
        waiting = store.waiting_approval(run_id)
        assert waiting is not None
        approve(store, run_id, approval_hash=waiting.approval_hash, by="person")

    # Second process: the approved write runs; the next one is covered by the policy's grant.
    model_server.answer(_call("fs_read_text_file", {"path": str(sandbox / "beta.txt")}, 4))
    model_server.answer(
        _call("fs_write_file", {"path": str(sandbox / "counts/beta.count"), "content": "4"}, 5)
    )
    model_server.answer(_call("finish", {"total": 7}, 6))
    second = _live(model_server, database, sandbox, "--resume", run_id)
    assert f"run {run_id} completed" in second

    assert (sandbox / "counts" / "alpha.count").read_text() == "3"
    assert (sandbox / "counts" / "beta.count").read_text() == "4"
    with open_store(database) as store:
        run = store.get_run(run_id)
        events = store.list_events(run_id, limit=1000)
        store.verify_chain()
    assert run.status is RunStatus.COMPLETED
    assert json.loads(run.result or "{}") == {"total": 7}
    asked = [e for e in events if e.type == "approval_requested"]
    assert len(asked) == 1
    decisions = [e.payload for e in events if e.type == "policy_decided"]
    granted = [d for d in decisions if "covered by approval" in str(d.get("reason", ""))]
    assert len(granted) == 1 and granted[0]["outcome"] == "allow"
    # Six model answers in all: the first process asked three times, the second three.
    assert len(model_server.requests) == 6
