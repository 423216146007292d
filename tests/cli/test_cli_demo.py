"""The installed `agentrt` against the demo: the database it produced, and a decision made
with `agentrt approve` from another process while the demo waits."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

AGENTRT = Path(sys.executable).with_name("agentrt")
DEMO_SERVER = (
    Path(__file__).parents[2]
    / "examples/filesystem/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js"
)

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(
        shutil.which("node") is None or not DEMO_SERVER.exists(),
        reason="the demo's filesystem server is not installed (make demo installs it)",
    ),
]


def agentrt(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(AGENTRT), *args], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
    )


def _waiting_approval(database: Path) -> tuple[str, str] | None:
    if not database.exists():
        return None
    listing = agentrt("--db", str(database), "--json", "runs")
    if listing.returncode != 0:
        return None
    for line in listing.stdout.splitlines():
        record = json.loads(line)
        if record["record"] == "run" and record["waiting_approval"]:
            return record["run_id"], record["waiting_approval"]
    return None


def test_a_waiting_demo_is_approved_with_the_command_and_its_chain_verifies(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    database = state / "agentrt.db"
    demo = subprocess.Popen(
        [str(AGENTRT), "demo", "--interactive", "--state-dir", str(state)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        waiting = None
        while waiting is None:
            assert demo.poll() is None, demo.stdout.read() if demo.stdout else ""
            assert time.monotonic() < deadline, "the demo never paused for an approval"
            time.sleep(0.2)
            waiting = _waiting_approval(database)
        run_id, approval_id = waiting

        refused = agentrt("--db", str(database), "approve", run_id)
        assert refused.returncode == 1
        assert "no terminal to ask at" in refused.stderr

        shown = agentrt("--db", str(database), "show", run_id)
        assert shown.returncode == 0
        assert "presentation.path" in shown.stdout and "SUMMARY.md" in shown.stdout

        approved = agentrt(
            "--db", str(database), "approve", run_id, "--approval", approval_id, "--by", "tester"
        )
        assert approved.returncode == 0, approved.stderr
        output, _ = demo.communicate(timeout=60)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    assert demo.returncode == 0, output
    assert "approved by tester" in output
    assert (state / "sandbox" / "SUMMARY.md").exists()

    verified = agentrt("--db", str(database), "verify")
    assert verified.returncode == 0, verified.stderr
    assert verified.stdout.startswith("intact: ")

    events = agentrt("--db", str(database), "--json", "events", run_id)
    types = [json.loads(line)["type"] for line in events.stdout.splitlines()]
    assert "approval_granted" in types and types[-1] == "run_completed"

    with sqlite3.connect(database) as connection:
        connection.execute(
            "UPDATE events SET payload = ? WHERE seq = 2", ('{"args":"{}","step":1,"tool":"x"}',)
        )
    broken = agentrt("--db", str(database), "verify")
    assert broken.returncode == 1
    assert "the chain is broken at event 2" in broken.stderr
