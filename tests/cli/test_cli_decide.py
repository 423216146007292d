"""`approve`, `reject`, `cancel` on a run the real Gate paused, decided against what was printed."""

from __future__ import annotations

import getpass
import json
import sqlite3
import time

import anyio
from cli_support import POLICY, Produced, ReadNote, WriteNote, produce

from agentrt.gate import Gate
from agentrt.store import ApprovalStatus, RunStatus, approval_hash, open_store


def _state(produced: Produced) -> tuple[str, str, int]:
    with open_store(produced.database, read_only=True, create=False) as store:
        approval = store.get_approval(produced.approval_id)
        run = store.get_run(produced.waiting_run)
        return str(approval.status), str(run.status), store.count_events(produced.waiting_run)


def test_approve_without_a_terminal_or_yes_or_approval_refuses_and_changes_nothing(
    produced: Produced, run_cli
) -> None:
    before = _state(produced)
    result = run_cli("approve", produced.waiting_run)
    assert result.exit_code == 1
    assert (
        "no terminal to ask at: to approve this request, name it with "
        f"--approval {produced.approval_id}"
    ) in result.output
    assert _state(produced) == before == ("pending", "waiting_for_approval", before[2])


def test_reject_without_a_terminal_or_yes_or_approval_refuses_and_changes_nothing(
    produced: Produced, run_cli
) -> None:
    before = _state(produced)
    result = run_cli("reject", produced.waiting_run, "--note", "no")
    assert result.exit_code == 1
    assert "no terminal to ask at" in result.output
    assert _state(produced) == before


def test_approve_prints_the_request_one_field_a_line_with_sizes(
    produced: Produced, run_cli
) -> None:
    result = run_cli("approve", produced.waiting_run)
    lines = result.output.splitlines()
    names = [line.split()[0] for line in lines[:-1]]
    assert names[:4] == ["approval", "run", "step", "status"]
    assert "presentation.path" in names and "arguments" in names and names[-1] == "hash"
    arguments = next(line for line in lines if line.startswith("arguments"))
    assert arguments.endswith(f"({len(produced.write_args)} characters)")


def test_long_values_are_bounded_head_and_tail(tmp_path, run_cli) -> None:
    content = "HEAD" + "m" * 5000 + "TAIL"
    produced = produce(tmp_path / "long.db", tmp_path / "sandbox", long_content=content)
    result = run_cli("approve", produced.waiting_run, database=produced.database)
    arguments = next(line for line in result.output.splitlines() if line.startswith("arguments"))
    assert '"content": "HEAD' in arguments and 'TAIL"}' in arguments
    assert "characters not shown" in arguments
    assert len(arguments) < 400
    assert arguments.endswith(f"({len(produced.write_args)} characters)")


def test_approve_with_the_approval_id_records_the_decision_and_the_label(
    produced: Produced, run_cli
) -> None:
    result = run_cli(
        "approve", produced.waiting_run, "--approval", produced.approval_id,
        "--by", "alice", "--note", "looks right",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert f"approved {produced.approval_id}" in result.output
    with open_store(produced.database, read_only=True, create=False) as store:
        approval = store.get_approval(produced.approval_id)
        events = store.list_events(produced.waiting_run)
    assert approval.status is ApprovalStatus.APPROVED
    assert (approval.decided_by, approval.note) == ("alice", "looks right")
    granted = events[-1]
    assert granted.type == "approval_granted"
    assert granted.payload["by"] == "alice"
    assert granted.payload["approval_hash"] == produced.approval_hash


def test_by_defaults_to_the_login_name(produced: Produced, run_cli) -> None:
    result = run_cli("approve", produced.waiting_run, "--yes")
    assert result.exit_code == 0, result.output
    with open_store(produced.database, read_only=True, create=False) as store:
        assert store.get_approval(produced.approval_id).decided_by == getpass.getuser()


def test_an_approved_request_executes_exactly_as_printed_on_resume(
    produced: Produced, run_cli
) -> None:
    assert run_cli("approve", produced.waiting_run, "--yes").exit_code == 0

    async def resume() -> RunStatus:
        store = open_store(produced.database)
        try:
            gate = Gate(
                store, [ReadNote(produced.sandbox), WriteNote(produced.sandbox)], policy=POLICY
            )
            outcome = await gate.resume(produced.waiting_run)
            return outcome.status
        finally:
            store.close()

    assert anyio.run(resume) is RunStatus.RUNNING
    written = json.loads(produced.write_args)
    assert (produced.sandbox / "done.txt").read_text() == written["content"]


def test_reject_note_is_what_the_model_is_shown(produced: Produced, run_cli) -> None:
    note = "write it to notes/ instead"
    result = run_cli(
        "reject", produced.waiting_run, "--approval", produced.approval_id, "--note", note
    )
    assert result.exit_code == 0, result.output
    assert f"the model will be told: {note}" in result.output
    with open_store(produced.database) as store:
        run = store.get_run(produced.waiting_run)
        gate = Gate(store, [ReadNote(produced.sandbox), WriteNote(produced.sandbox)], policy=POLICY)
        history = gate.history(produced.waiting_run)
    assert (run.status, run.reason) == (RunStatus.CANCELLED, "approval_rejected")
    assert history[-1].content == note
    assert not (produced.sandbox / "done.txt").exists()


def test_an_approval_id_that_does_not_exist_is_refused(produced: Produced, run_cli) -> None:
    before = _state(produced)
    result = run_cli("approve", produced.waiting_run, "--approval", "0000000000000000")
    assert result.exit_code == 1
    assert "no approval 0000000000000000" in result.output
    assert _state(produced) == before


def test_an_approval_of_another_run_is_refused(produced: Produced, run_cli) -> None:
    before = _state(produced)
    result = run_cli("approve", produced.completed_run, "--approval", produced.approval_id, "--yes")
    assert result.exit_code == 1
    assert f"belongs to run {produced.waiting_run}, not {produced.completed_run}" in result.output
    assert _state(produced) == before


def test_a_run_that_waits_for_nothing_is_refused(produced: Produced, run_cli) -> None:
    result = run_cli("approve", produced.completed_run, "--yes")
    assert result.exit_code == 1
    assert "is not waiting for a decision (it is completed)" in result.output


def test_a_decided_approval_cannot_be_decided_again(produced: Produced, run_cli) -> None:
    assert run_cli("approve", produced.waiting_run, "--yes").exit_code == 0
    again = run_cli("reject", produced.waiting_run, "--approval", produced.approval_id)
    assert again.exit_code == 1
    assert "is approved, not waiting for a decision" in again.output


def test_an_approval_changed_in_the_database_is_refused(produced: Produced, run_cli) -> None:
    with sqlite3.connect(produced.database) as connection:
        connection.execute(
            "UPDATE approvals SET args = ? WHERE approval_id = ?",
            ('{"path": "../../.bashrc", "content": "evil"}', produced.approval_id),
        )
    result = run_cli("approve", produced.waiting_run, "--yes")
    assert result.exit_code == 1
    assert "no longer matches its hash" in result.output
    with open_store(produced.database, read_only=True, create=False) as store:
        assert store.get_approval(produced.approval_id).status is ApprovalStatus.PENDING


def test_approve_json_prints_the_request_and_the_decision(produced: Produced, run_cli) -> None:
    result = run_cli("--json", "approve", produced.waiting_run, "--approval", produced.approval_id)
    assert result.exit_code == 0, result.output
    request, decision = (json.loads(line) for line in result.output.splitlines())
    assert request["record"] == "approval" and request["status"] == "pending"
    assert request["args"] == produced.write_args
    assert request["approval_hash"] == approval_hash(
        request["kind"], request["capability"], request["presentation"], request["tool"],
        request["args"],
    )  # fmt: skip
    assert decision["record"] == "decision" and decision["status"] == "approved"


def test_cancel_ends_a_waiting_run_as_operator_cancelled(produced: Produced, run_cli) -> None:
    result = run_cli("cancel", produced.waiting_run, "--by", "bob")
    assert result.exit_code == 0, result.output
    assert f"run {produced.waiting_run} is cancelled (operator_cancelled)" in result.output
    with open_store(produced.database, read_only=True, create=False) as store:
        assert store.get_approval(produced.approval_id).status is ApprovalStatus.SUPERSEDED
        events = store.list_events(produced.waiting_run)
    assert [event.type for event in events[-2:]] == ["operator_cancelled", "run_cancelled"]
    assert events[-2].payload == {"by": "bob"}


def test_cancel_of_an_ended_run_is_refused(produced: Produced, run_cli) -> None:
    result = run_cli("cancel", produced.completed_run)
    assert result.exit_code == 1
    assert "already ended" in result.output


def test_an_approved_request_waiting_for_its_program_is_shown_without_decision_commands(
    produced: Produced, run_cli
) -> None:
    assert run_cli("approve", produced.waiting_run, "--yes", "--by", "carol").exit_code == 0
    shown = run_cli("show", produced.waiting_run)
    assert shown.exit_code == 0, shown.output
    assert "approved, waiting for its program to resume it:" in shown.output
    assert "decided by" in shown.output and "carol" in shown.output
    assert "--approval" not in shown.output
    again = run_cli("approve", produced.waiting_run, "--yes")
    assert again.exit_code == 1
    assert f"its approval {produced.approval_id} is approved" in again.output


def test_an_expired_approval_is_refused_and_its_run_cancelled(tmp_path, run_cli) -> None:
    produced = produce(tmp_path / "ttl.db", tmp_path / "sandbox", approval_ttl=0.05)
    time.sleep(0.2)
    result = run_cli("approve", produced.waiting_run, "--yes", database=produced.database)
    assert result.exit_code == 1
    assert "expired before it was decided; the run is cancelled" in result.output
    with open_store(produced.database, read_only=True, create=False) as store:
        assert store.get_approval(produced.approval_id).status is ApprovalStatus.EXPIRED
        run = store.get_run(produced.waiting_run)
    assert (run.status, run.reason) == (RunStatus.CANCELLED, "approval_expired")
    assert not (produced.sandbox / "done.txt").exists()
