"""The operator's read commands on a PostgreSQL database the real Gate wrote (the decision
commands run on both backends in test_cli_decide.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cli_support import Produced, produce
from click.testing import CliRunner

from agentrt.cli import cli


def test_runs_show_events_export_and_verify_read_a_postgresql_database(
    postgres_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = postgres_server.database()
    produced: Produced = produce(url, tmp_path / "sandbox")

    def run(*args: str) -> Any:
        result = CliRunner().invoke(cli, ["--db", url, *args])
        assert result.exit_code == 0, result.output
        return result

    runs = [json.loads(line) for line in run("--json", "runs").output.splitlines()]
    listed = [line["run_id"] for line in runs if line.get("record") == "run"]
    assert listed[0] == produced.waiting_run and len(listed) == 3
    shown = run("show", produced.waiting_run).output
    assert produced.approval_id in shown and f"agentrt --db {url} approve" in shown
    events = run("--json", "events", produced.completed_run).output.splitlines()
    types = [json.loads(line)["type"] for line in events]
    assert types[0] == "run_started" and types[-1] == "run_completed"
    exported = [json.loads(line) for line in run("export").output.splitlines()]
    assert [event["seq"] for event in exported] == list(range(1, len(exported) + 1))
    (report,) = [json.loads(line) for line in run("--json", "verify").output.splitlines()]
    # This host wrote the database, so its head anchor is here and the chain reaches it.
    assert report["ok"] and report["checked"] == len(exported)
    assert report["anchor_seq"] == exported[-1]["seq"] == report["head_seq"]
    assert report["reason"] == "intact"
    assert (
        run("verify")
        .output.rstrip()
        .endswith("; nothing lost since its anchor; every row matches its events")
    )
    # On a host that never wrote it there is no anchor: said, not counted as a fault.
    monkeypatch.setenv("AGENTRT_ANCHOR_DIR", str(tmp_path / "another host"))
    (elsewhere,) = [json.loads(line) for line in run("--json", "verify").output.splitlines()]
    assert elsewhere["ok"] and elsewhere["anchor_seq"] is None
    assert (
        run("verify")
        .output.rstrip()
        .endswith(
            "; no head anchor on this host (a restored older backup is not detected here);"
            " every row matches its events"
        )
    )
