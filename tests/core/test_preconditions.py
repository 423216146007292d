"""Preconditions in the library: a tool's `fingerprint(call)` binds the state an
approval was decided against; a different state at execution time runs nothing and
ends the run `stale`; a read that fails or hangs fails closed.  Both backends."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from agentrt import Decision, Gate
from agentrt.approvals import approve
from agentrt.errors import RunLeased
from agentrt.store import ApprovalStatus, RunStatus, StepStatus, open_store
from agentrt.tools import SideEffect, StateRead, ToolCall, ToolResult, ToolSpec

from .helpers import RecordingTool, approval_policy

pytestmark = pytest.mark.anyio

WRITE = '{"path": "notes.txt", "content": "new\\n"}'


class FileTool(RecordingTool):
    """A write whose state is one entry of `files`: `fingerprint` reads it, `call` writes it."""

    def __init__(self, files: dict[str, str], **options: Any) -> None:
        super().__init__("write", SideEffect.LOCAL_MUTATION, **options)
        self.files = files
        self.reads = 0
        self.read_error: Exception | None = None
        self.read_delay = 0.0

    async def fingerprint(self, call: ToolCall) -> StateRead:
        self.reads += 1
        if self.read_delay:
            await anyio.sleep(self.read_delay)
        if self.read_error is not None:
            raise self.read_error
        return StateRead(self.files.get("notes.txt"), "read", '{"path":"notes.txt"}')


async def _waiting(database: str | Path, files: dict[str, str], **options: Any) -> Any:
    store = open_store(database)
    tool = FileTool(files, **options)
    gate = Gate(store, [tool], policy=approval_policy())
    run_id = await gate.start("write a note")
    outcome = await gate.step(run_id, Decision.tool_call("write", WRITE))
    return store, tool, gate, run_id, outcome


async def test_an_approval_binds_the_state_read_and_runs_once_when_it_is_unchanged(
    database: str | Path,
) -> None:
    store, tool, gate, run_id, outcome = await _waiting(database, {"notes.txt": "old\n"})
    try:
        approval = outcome.approval
        assert approval is not None and isinstance(approval.capability, dict)
        assert len(approval.capability["state"]) == 64
        assert approval.presentation["state"]["content"] == "old\n"
        approve(store, run_id, approval_hash=approval.approval_hash, by="alice")
        resumed = await gate.resume(run_id)
        assert resumed.observation is not None and resumed.observation.kind == "result"
        assert len(tool.calls) == 1 and tool.reads == 2
        reads = [e for e in store.list_events(run_id) if e.type == "state_read"]
        assert [e.payload["state"] for e in reads] == [approval.capability["state"]] * 2
        assert store.verify_chain().ok and store.verify_state().ok
    finally:
        store.close()


async def test_a_changed_state_runs_nothing_and_ends_the_run_stale(database: str | Path) -> None:
    files = {"notes.txt": "old\n"}
    store, tool, gate, run_id, outcome = await _waiting(database, files)
    try:
        assert outcome.approval is not None
        approve(store, run_id, approval_hash=outcome.approval.approval_hash, by="alice")
        files["notes.txt"] = "someone else's edit\n"
        resumed = await gate.resume(run_id)
        assert tool.calls == []
        assert (resumed.status, resumed.reason) == (RunStatus.CANCELLED, "stale")
        assert resumed.observation is not None
        assert resumed.observation.content.startswith("STALE: ")
        run = store.get_run(run_id)
        assert (run.status, run.reason) == (RunStatus.CANCELLED, "stale")
        assert store.get_approval(outcome.approval.approval_id).status is ApprovalStatus.STALE
        (step,) = store.list_steps(run_id)
        assert step.status is StepStatus.DENIED
        assert "approval_stale" in [e.type for e in store.list_events(run_id)]
        assert store.verify_chain().ok and store.verify_state().ok
    finally:
        store.close()


async def test_a_file_that_appears_after_the_approval_makes_it_stale(
    database: str | Path,
) -> None:
    files: dict[str, str] = {}
    store, tool, gate, run_id, outcome = await _waiting(database, files)
    try:
        assert outcome.approval is not None
        assert outcome.approval.presentation["state"]["absent"] is True
        approve(store, run_id, approval_hash=outcome.approval.approval_hash, by="alice")
        files["notes.txt"] = "appeared\n"
        resumed = await gate.resume(run_id)
        assert resumed.reason == "stale" and tool.calls == []
    finally:
        store.close()


async def test_a_precondition_that_fails_offers_no_approval_and_runs_nothing(
    database: str | Path,
) -> None:
    store = open_store(database)
    try:
        tool = FileTool({})
        tool.read_error = OSError("disk unreadable")
        gate = Gate(store, [tool], policy=approval_policy())
        run_id = await gate.start("write a note")
        outcome = await gate.step(run_id, Decision.tool_call("write", WRITE))
        assert outcome.approval is None and outcome.reason == "precondition_unavailable"
        assert outcome.observation is not None
        assert outcome.observation.content.startswith("UNAVAILABLE: ")
        assert "disk unreadable" in outcome.observation.content
        assert store.waiting_approval(run_id) is None and tool.calls == []
        (read,) = [e for e in store.list_events(run_id) if e.type == "state_read"]
        assert "disk unreadable" in read.payload["error"]
        assert store.verify_chain().ok and store.verify_state().ok
    finally:
        store.close()


async def test_a_precondition_that_hangs_fails_closed_at_its_timeout(
    database: str | Path,
) -> None:
    files = {"notes.txt": "old\n"}
    store, tool, gate, run_id, outcome = await _waiting(database, files, timeout=0.5)
    try:
        assert outcome.approval is not None
        approve(store, run_id, approval_hash=outcome.approval.approval_hash, by="alice")
        tool.read_delay = 5.0
        resumed = await gate.resume(run_id)
        assert resumed.reason == "precondition_unavailable" and tool.calls == []
        assert resumed.observation is not None
        assert "did not answer within 0.5s" in resumed.observation.content
        # Still granted: once the state can be read again (and is unchanged), it runs once.
        assert store.get_approval(outcome.approval.approval_id).status is ApprovalStatus.APPROVED
        tool.read_delay = 0.0
        again = await gate.resume(run_id)
        assert again.observation is not None and again.observation.kind == "result"
        assert len(tool.calls) == 1
    finally:
        store.close()


async def test_a_tool_without_a_precondition_hashes_its_approval_as_before(
    database: str | Path,
) -> None:
    store = open_store(database)
    try:
        tool = RecordingTool("write", SideEffect.LOCAL_MUTATION)
        gate = Gate(store, [tool], policy=approval_policy())
        run_id = await gate.start("write a note")
        outcome = await gate.step(run_id, Decision.tool_call("write", WRITE))
        assert outcome.approval is not None
        assert "state" not in outcome.approval.capability
        assert not [e for e in store.list_events(run_id) if e.type == "state_read"]
    finally:
        store.close()


class CutOffWrite(FileTool):
    """Writes, then fails as a call cut off after it took effect; may judge a retry done."""

    def __init__(self, files: dict[str, str], *, reconcile: bool) -> None:
        super().__init__(files)
        self.reconcile = reconcile

    async def call(self, call: ToolCall) -> Any:
        self.calls.append(call)
        self.files["notes.txt"] = json.loads(call.args)["content"]
        raise TimeoutError("cut off")

    def reconciled(self, call: ToolCall, current: StateRead, approved: str | None) -> bool:
        return self.reconcile and current.content == json.loads(call.args)["content"]


async def _cut_off_retry(database: str | Path, *, reconcile: bool) -> Any:
    store = open_store(database)
    tool = CutOffWrite({"notes.txt": "old\n"}, reconcile=reconcile)
    gate = Gate(store, [tool], policy=approval_policy())
    run_id = await gate.start("write a note")
    asked = await gate.step(run_id, Decision.tool_call("write", WRITE))
    assert asked.approval is not None
    approve(store, run_id, approval_hash=asked.approval.approval_hash, by="alice")
    failed = await gate.resume(run_id)
    assert failed.observation is not None and failed.observation.kind == "tool_error"
    retried = await gate.step(run_id, Decision.tool_call("write", WRITE))
    return store, tool, run_id, retried


async def test_a_retry_whose_state_already_is_its_result_is_reconciled_not_run(
    database: str | Path,
) -> None:
    store, tool, run_id, retried = await _cut_off_retry(database, reconcile=True)
    try:
        assert len(tool.calls) == 1
        assert retried.reason == "reconciled" and retried.approval is None
        assert retried.observation is not None and retried.observation.kind == "result"
        assert retried.observation.content.startswith('"reconciled: ')
        step = store.get_step(run_id, 2)
        assert step is not None and step.status is StepStatus.SUCCEEDED
        assert "step_reconciled" in [e.type for e in store.list_events(run_id)]
        assert store.verify_chain().ok and store.verify_state().ok
    finally:
        store.close()


async def test_a_retry_without_reconcile_asks_and_shows_the_state_against_the_approved(
    database: str | Path,
) -> None:
    from agentrt.cli._review import review_lines

    store, tool, _run_id, retried = await _cut_off_retry(database, reconcile=False)
    try:
        assert retried.approval is not None and len(tool.calls) == 1
        shown = "\n".join(review_lines(retried.approval))
        assert "the state changed since it was approved before" in shown
        assert "already holds the intended result" in shown
    finally:
        store.close()


# A process that writes the file, then dies before its call returns (killed by the test).
DYING_WRITER = textwrap.dedent(
    """
    import json, sys, anyio
    from pathlib import Path
    from agentrt import (ClassPolicy, Decision, Gate, Outcome, SideEffect, StateRead,
                         ToolResult, ToolSpec, open_store)

    FILE = Path(sys.argv[2])

    class Write:
        spec = ToolSpec("write", "writes", {"type": "object"}, SideEffect.LOCAL_MUTATION, 60.0)
        async def fingerprint(self, call):
            return StateRead(FILE.read_text() if FILE.exists() else None, "read", "{}")
        async def call(self, call):
            FILE.write_text(json.loads(call.args)["content"])
            print("started", flush=True)
            await anyio.sleep(60)
            return ToolResult("{}")

    async def main():
        policy = ClassPolicy({SideEffect.LOCAL_MUTATION: Outcome.ALLOW})
        gate = Gate(open_store(sys.argv[1]), [Write()], policy=policy, lease_ttl=1.0)
        await gate.start("dies", run_id="dying")
        await gate.step("dying", Decision.tool_call("write", sys.argv[3]))

    anyio.run(main)
    """
)


class DiskWrite:
    """The same write, in this process: its state is the file on disk."""

    def __init__(self, path: Path) -> None:
        self.spec = ToolSpec("write", "writes", {"type": "object"}, SideEffect.LOCAL_MUTATION, 5.0)
        self.path = path
        self.calls: list[ToolCall] = []

    async def fingerprint(self, call: ToolCall) -> StateRead:
        return StateRead(self.path.read_text() if self.path.exists() else None, "read", "{}")

    async def call(self, call: ToolCall) -> ToolResult:
        self.calls.append(call)
        self.path.write_text(json.loads(call.args)["content"])
        return ToolResult('{"ok":true}')


@pytest.mark.timeout(60)
async def test_an_interrupted_write_is_asked_again_bound_to_the_state_it_left(
    database: str | Path, tmp_path: Path
) -> None:
    from agentrt.cli._review import review_lines

    notes = tmp_path / "notes.txt"
    notes.write_text("old\n")
    child = subprocess.Popen(
        [sys.executable, "-c", DYING_WRITER, str(database), str(notes), WRITE],
        stdout=subprocess.PIPE, cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert child.stdout is not None
    assert child.stdout.readline().strip() == b"started"
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=10)
    store = open_store(database)
    try:
        tool = DiskWrite(notes)
        heir = Gate(store, [tool], policy=approval_policy())
        deadline = time.monotonic() + 10
        while True:
            try:
                taken = await heir.resume("dying")
                break
            except RunLeased:
                assert time.monotonic() < deadline
                await anyio.sleep(0.2)
        approval = taken.approval
        assert approval is not None and approval.kind == "interrupted_side_effect"
        assert approval.presentation["state"]["content"] == "new\n"
        assert "may have taken effect" in approval.presentation["warning"]
        shown = "\n".join(review_lines(approval))
        assert "no change: the new content is the content read" in shown
        # Someone edits the file before the person decides: running it again is stale.
        approve(store, "dying", approval_hash=approval.approval_hash, by="alice")
        notes.write_text("their edit\n")
        resumed = await heir.resume("dying")
        assert resumed.reason == "stale" and tool.calls == []
        assert notes.read_text() == "their edit\n"
        assert store.verify_chain().ok and store.verify_state().ok
    finally:
        store.close()
