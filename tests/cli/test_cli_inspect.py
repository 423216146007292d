"""`runs`, `show`, `events`: read-only, paged, escaped views of a database the real Gate wrote."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
from pathlib import Path

import anyio
from cli_support import HOSTILE_GOAL, POLICY, Produced, ReadNote, WriteNote, produce

from agentrt import Decision
from agentrt.gate import Gate
from agentrt.store import open_store
from agentrt.trace import event_json


def _data_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.strip()]


def test_runs_lists_newest_first_with_the_waiting_run_in_front(produced: Produced, run_cli) -> None:
    result = run_cli("runs")
    assert result.exit_code == 0, result.output
    lines = _data_lines(result.output)
    assert lines[0].split()[:2] == ["RUN", "STATUS"]
    # The waiting run was created last, but the order must hold even when it is not:
    # the hostile run is newer than the completed one, and both follow the waiting run.
    order = [line.split()[0] for line in lines[1:4]]
    assert order == [produced.waiting_run, produced.hostile_run, produced.completed_run]
    assert produced.approval_id in lines[1]
    assert lines[-1] == "runs 1-3 of 3"


def test_runs_puts_a_waiting_run_in_front_of_newer_runs(tmp_path: Path, run_cli) -> None:
    produced = produce(tmp_path / "front.db", tmp_path / "sandbox")

    async def newer_run() -> str:
        store = open_store(produced.database)
        try:
            gate = Gate(
                store, [ReadNote(produced.sandbox), WriteNote(produced.sandbox)], policy=POLICY
            )
            run_id = await gate.start("a newer run")
            await gate.step(run_id, Decision.complete("ok"))
            return run_id
        finally:
            store.close()

    newer = anyio.run(newer_run)
    result = run_cli("runs", database=produced.database)
    order = [line.split()[0] for line in _data_lines(result.output)[1:5]]
    assert order == [produced.waiting_run, newer, produced.hostile_run, produced.completed_run]


def test_runs_pages_with_limit_and_offset_and_counts_the_total(produced: Produced, run_cli) -> None:
    result = run_cli("runs", "--limit", "1", "--offset", "1")
    assert result.exit_code == 0, result.output
    lines = _data_lines(result.output)
    assert [line.split()[0] for line in lines[1:-1]] == [produced.hostile_run]
    assert lines[-1] == "runs 2-2 of 3"


def test_runs_offset_past_the_end_prints_an_empty_page(run_cli) -> None:
    result = run_cli("runs", "--offset", "10")
    assert result.exit_code == 0, result.output
    assert result.output.strip() == "no runs on this page (3 in all)"


def test_runs_json_is_one_object_a_line_with_the_page_total(produced: Produced, run_cli) -> None:
    result = run_cli("--json", "runs", "--limit", "2")
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in result.output.splitlines()]
    assert [record["record"] for record in records] == ["run", "run", "page"]
    assert records[0]["run_id"] == produced.waiting_run
    assert records[0]["waiting_approval"] == produced.approval_id
    assert records[1]["waiting_approval"] is None
    assert records[2] == {"record": "page", "offset": 0, "shown": 2, "total": 3}


def test_hostile_goal_prints_escaped_in_runs_show_and_events(produced: Produced, run_cli) -> None:
    for args in (("runs",), ("show", produced.hostile_run), ("events", produced.hostile_run)):
        result = run_cli(*args)
        assert result.exit_code == 0, result.output
        assert "\x1b" not in result.output
        assert "\u202e" not in result.output
        assert "tidy \\x1b[31mred\\x1b[0m notes \\u202eexe.txt" in result.output


def test_hostile_goal_in_json_is_ascii_and_decodes_to_the_exact_goal(
    produced: Produced, run_cli
) -> None:
    result = run_cli("--json", "show", produced.hostile_run)
    assert result.exit_code == 0, result.output
    assert result.output.isascii()
    assert "\x1b" not in result.output
    run = json.loads(result.output.splitlines()[0])
    assert run["goal"] == HOSTILE_GOAL


def test_show_prints_the_run_its_steps_and_the_waiting_approval(
    produced: Produced, run_cli
) -> None:
    result = run_cli("show", produced.waiting_run)
    assert result.exit_code == 0, result.output
    out = result.output
    assert f"run                {produced.waiting_run}" in out
    assert "status             waiting_for_approval" in out
    assert "steps 1-2 of 2" in out
    assert "waiting for an approval:" in out
    assert "presentation.path" in out and "done.txt" in out
    assert "presentation.lines        2" in out
    assert f"hash                      {produced.approval_hash}" in out
    assert (
        f"agentrt --db {produced.database} approve {produced.waiting_run} "
        f"--approval {produced.approval_id}"
    ) in out


def test_show_pages_the_steps(produced: Produced, run_cli) -> None:
    result = run_cli("show", produced.waiting_run, "--limit", "1", "--offset", "1")
    assert result.exit_code == 0, result.output
    step_lines = [line for line in result.output.splitlines() if line[:1].isdigit()]
    assert len(step_lines) == 1 and step_lines[0].split()[:3] == ["2", "write_note", "waiting"]
    assert "steps 2-2 of 2" in result.output


def test_show_of_an_unknown_run_is_refused_with_exit_1(run_cli) -> None:
    result = run_cli("show", "no-such-run")
    assert result.exit_code == 1
    assert "no run no-such-run" in result.output


def test_events_print_the_audit_trail_of_one_run_in_order(produced: Produced, run_cli) -> None:
    result = run_cli("events", produced.waiting_run)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    types = [line.split()[3] for line in lines[:-1]]
    assert types[0] == "run_started"
    assert types[-1] == "approval_requested"
    assert all(produced.waiting_run in line for line in lines[:-1])
    assert lines[-1] == f"events 1-{len(lines) - 1} of {len(lines) - 1}"


def test_events_json_is_one_json_object_a_line_as_the_trace_writes_it(
    produced: Produced, run_cli
) -> None:
    result = run_cli("--json", "events", produced.hostile_run)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines and result.output.isascii()
    decoded = [json.loads(line) for line in lines]
    assert all(isinstance(event, dict) for event in decoded)
    with open_store(produced.database, read_only=True, create=False) as store:
        stored = store.list_events(produced.hostile_run)
    assert decoded == [json.loads(event_json(event)) for event in stored]
    assert decoded[0]["payload"]["goal"] == HOSTILE_GOAL


def test_events_page_with_limit_and_offset(produced: Produced, run_cli) -> None:
    full = [
        json.loads(line)
        for line in run_cli("--json", "events", produced.waiting_run).output.splitlines()
    ]
    page = run_cli("--json", "events", produced.waiting_run, "--limit", "2", "--offset", "3")
    assert [json.loads(line) for line in page.output.splitlines()] == full[3:5]


def test_reading_commands_never_write_the_database(produced: Produced, run_cli) -> None:
    before = produced.database.read_bytes()
    for args in (
        ("runs",),
        ("show", produced.waiting_run),
        ("events", produced.waiting_run),
        ("verify",),
        ("--json", "runs"),
    ):
        assert run_cli(*args).exit_code == 0
    assert produced.database.read_bytes() == before
    # SQLite may leave the shared-memory index of a WAL database beside it;
    # a reader must never put a page in the log, and whatever it leaves is owner-only.
    wal = Path(f"{produced.database}-wal")
    if wal.exists():
        assert wal.stat().st_size == 0
    for sidecar in (wal, Path(f"{produced.database}-shm")):
        if sidecar.exists():
            assert stat.S_IMODE(os.stat(sidecar).st_mode) & 0o077 == 0


def test_an_expiry_no_clock_can_show_is_printed_as_stored(produced: Produced, run_cli) -> None:
    with sqlite3.connect(produced.database) as connection:
        connection.execute(
            "UPDATE approvals SET expires_at = 1e300 WHERE approval_id = ?", (produced.approval_id,)
        )
    result = run_cli("show", produced.waiting_run)
    assert result.exit_code == 0, result.output
    assert "expires                   1e+300" in result.output
