"""`approve`, `reject`, `cancel` on a run the real Gate paused, decided against what was printed."""

from __future__ import annotations

import getpass
import json
import time
from pathlib import Path

import anyio
import pytest
from _postgres import raw_connect
from cli_support import POLICY, Produced, ReadNote, WriteNote, produce
from test_cli_terminal import Terminal

from agentrt import Decision, SideEffect, ToolCall, ToolResult, ToolSpec
from agentrt.gate import Gate
from agentrt.store import ApprovalStatus, RunStatus, approval_hash, open_store


class EditNote:
    """An `edit_file`-style tool: old/new replacements in a file (never run in these tests)."""

    spec = ToolSpec(
        name="edit_note",
        description="Replace text in a note.",
        input_schema={
            "type": "object",
            "properties": {"path": {"type": "string"}, "edits": {"type": "array"}},
            "required": ["path", "edits"],
        },
        side_effect=SideEffect.LOCAL_MUTATION,
        timeout=5.0,
    )

    async def call(self, call: ToolCall) -> ToolResult:
        raise AssertionError("an edit waiting for approval never runs")


@pytest.fixture
def produced(database: str | Path, tmp_path: Path) -> Produced:
    """The produced database, once on SQLite and once on PostgreSQL: every decision
    command works the same on both."""
    return produce(database, tmp_path / "sandbox")


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
    names = [line.split()[0] for line in lines if not line.startswith(" ")]
    assert names[:4] == ["approval", "run", "step", "status"]
    assert "presentation.path" in names and "arguments.content" in names
    assert names[-2] == "hash" and names[-1] == "agentrt:"  # the refusal: no terminal
    arguments = next(line for line in lines if line.startswith("arguments "))
    assert arguments.endswith(f"{len(produced.write_args)} characters of JSON:")
    content = next(line for line in lines if line.startswith("arguments.content"))
    assert content.endswith("2 lines, 18 characters, ends with a newline:")


def test_short_values_are_printed_without_their_size(produced: Produced, run_cli) -> None:
    lines = run_cli("approve", produced.waiting_run).output.splitlines()
    path = next(line for line in lines if line.startswith("arguments.path"))
    assert path.split() == ["arguments.path", "done.txt"]
    tool = next(line for line in lines if line.startswith("tool "))
    assert tool.split() == ["tool", "write_note"]
    assert not any("(8 characters)" in line or "(10 characters)" in line for line in lines)


def test_approve_on_a_forty_line_write_prints_its_lines_not_escapes(tmp_path, run_cli) -> None:
    content_text = "".join(f"line {number} of forty\n" for number in range(1, 41))
    produced = produce(tmp_path / "forty.db", tmp_path / "sandbox", long_content=content_text)
    result = run_cli("approve", produced.waiting_run, database=produced.database)
    assert "\\x0a" not in result.output
    lines = result.output.splitlines()
    for number in range(1, 41):
        assert f"    {number:>2}  line {number} of forty" in lines
    content = next(line for line in lines if line.startswith("arguments.content"))
    assert (
        content.split(None, 1)[1]
        == f"40 lines, {len(content_text)} characters, ends with a newline:"
    )
    assert "lines not shown" not in result.output
    # The presentation's copy of the arguments and its preview are named, not printed again.
    assert result.output.count("line 17 of forty") == 1
    assert "(exactly the arguments printed below)" in result.output


def test_a_long_write_is_cut_head_and_tail_and_full_prints_every_line(tmp_path, run_cli) -> None:
    content = "".join(f"row {number}\n" for number in range(1, 201))
    produced = produce(tmp_path / "long.db", tmp_path / "sandbox", long_content=content)
    cut = run_cli("approve", produced.waiting_run, database=produced.database).output
    assert "    200  row 200" in cut.splitlines() and "      1  row 1" in cut.splitlines()
    assert "… 150 lines not shown (--full prints every line) …" in cut
    assert "row 100\n" not in cut
    full = run_cli("approve", produced.waiting_run, "--full", database=produced.database).output
    assert all(f"  row {number}" in full for number in range(1, 201))
    assert "lines not shown" not in full


def test_long_values_are_bounded_head_and_tail(tmp_path, run_cli) -> None:
    content = "HEAD" + "m" * 5000 + "TAIL"
    produced = produce(tmp_path / "long.db", tmp_path / "sandbox", long_content=content)
    result = run_cli("approve", produced.waiting_run, database=produced.database)
    line = next(line for line in result.output.splitlines() if line.startswith("arguments.content"))
    assert "HEAD" in line and line.endswith("TAIL  (5008 characters)")
    assert "characters not shown" in line
    assert len(line) < 400
    full = run_cli("approve", produced.waiting_run, "--full", database=produced.database)
    assert content in full.output


def test_escapes_inside_written_lines_stay_visible(tmp_path, run_cli) -> None:
    content = "plain\n\x1b[31mred\x1b[0m \u202eexe.txt\nlast\n"
    produced = produce(tmp_path / "hostile.db", tmp_path / "sandbox", long_content=content)
    result = run_cli("approve", produced.waiting_run, database=produced.database)
    assert "\x1b" not in result.output and "\u202e" not in result.output
    assert "    2  \\x1b[31mred\\x1b[0m \\u202eexe.txt" in result.output.splitlines()


def test_an_edit_is_printed_as_a_diff_of_old_and_new(tmp_path: Path, run_cli) -> None:
    database = tmp_path / "edit.db"

    async def scenario() -> str:
        with open_store(database) as store:
            gate = Gate(store, [EditNote()], policy=POLICY)
            run_id = await gate.start("fix a typo")
            edits = [{"oldText": "one\ntwo\nthree", "newText": "one\n2\nthree"}]
            await gate.step(
                run_id,
                Decision.tool_call("edit_note", json.dumps({"path": "n.txt", "edits": edits})),
            )
            return run_id

    run_id = anyio.run(scenario)
    lines = run_cli("approve", run_id, database=database).output.splitlines()
    assert any(line.startswith("edit 1 of 1 of n.txt") and "as a diff:" in line for line in lines)
    assert [line for line in lines if line.strip() in ("one", "- two", "+ 2", "three")] == [
        "      one",
        "    - two",
        "    + 2",
        "      three",
    ]


@pytest.mark.timeout(60)
def test_answering_no_says_nothing_was_decided(produced: Produced) -> None:
    terminal = Terminal("--db", str(produced.database), "approve", produced.waiting_run)
    terminal.read_until(b"[y/N]: ")
    terminal.answer("n\n")
    assert terminal.finish() == 1
    assert (
        f"nothing was decided; approval {produced.approval_id} still waits".encode()
        in terminal.seen
    )
    assert b"Aborted" not in terminal.seen
    assert _state(produced)[0] == "pending"


@pytest.mark.timeout(60)
def test_reject_at_a_terminal_asks_for_the_note(produced: Produced) -> None:
    terminal = Terminal("--db", str(produced.database), "reject", produced.waiting_run)
    terminal.read_until(b"[y/N]: ")
    terminal.answer("y\n")
    terminal.read_until(b"What should the model be told? (empty for nothing): ")
    terminal.answer("write it under notes/ instead\n")
    assert terminal.finish() == 0, terminal.seen
    assert b"the model is told: write it under notes/ instead" in terminal.seen
    with open_store(produced.database, read_only=True, create=False) as store:
        approval = store.get_approval(produced.approval_id)
    assert (approval.status, approval.note) == (
        ApprovalStatus.REJECTED,
        "write it under notes/ instead",
    )


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
    connection = raw_connect(produced.database)
    connection.execute(
        "UPDATE approvals SET args = ? WHERE approval_id = ?",
        ('{"path": "../../.bashrc", "content": "evil"}', produced.approval_id),
    )
    connection.close()
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


def test_show_prints_a_waiting_write_as_numbered_lines_not_escapes(tmp_path, run_cli) -> None:
    content_text = "".join(f"line {number} of forty\n" for number in range(1, 41))
    produced = produce(tmp_path / "forty.db", tmp_path / "sandbox", long_content=content_text)
    before = _state(produced)
    result = run_cli("show", produced.waiting_run, database=produced.database)
    assert result.exit_code == 0, result.output
    assert "\\x0a" not in result.output
    lines = result.output.splitlines()
    for number in range(1, 41):
        assert f"    {number:>2}  line {number} of forty" in lines
    assert any(line.startswith("hash ") for line in lines)
    assert _state(produced) == before  # showing decides nothing
