"""The operator's read commands on a PostgreSQL database the real Gate wrote (the decision
commands run on both backends in test_cli_decide.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cli_support import Produced, produce
from click.testing import CliRunner

from agentrt.cli import cli


def test_runs_show_events_export_and_verify_read_a_postgresql_database(
    postgres_server: Any, tmp_path: Path
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
    assert report["ok"] and report["checked"] == len(exported) and report["anchor_seq"] is None
    assert report["reason"] == "intact"
    # The text says what was not checked, rather than "nothing lost since its anchor".
    assert (
        run("verify")
        .output.rstrip()
        .endswith(
            "; no head anchor on PostgreSQL (a restored older backup is not detected);"
            " every row matches its events"
        )
    )
