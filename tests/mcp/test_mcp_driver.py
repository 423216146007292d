"""End to end: a Driver run over the stock filesystem server, paused before a local mutation.

The approval names the prefixed tool (`fs_write_file`), the run outlives the
session that paused it, and resume executes exactly the approved call, once.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from agentrt import (
    ClassPolicy,
    Decision,
    Driver,
    Outcome,
    SideEffect,
    StepInput,
    approve,
    open_store,
)
from agentrt.gate import Gate
from agentrt.mcp import Rule, Server, load, pin
from agentrt.store import RunStatus

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]

FILESYSTEM = (
    Path(__file__).resolve().parents[1]
    / "npm/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js"
)

RULES = {
    "read_text_file": Rule(side_effect=SideEffect.READ_ONLY),
    "list_directory": Rule(side_effect=SideEffect.READ_ONLY),
    "write_file": Rule(side_effect=SideEffect.LOCAL_MUTATION, allow_hint_mismatch=True),
}
POLICY = ClassPolicy(
    {SideEffect.READ_ONLY: Outcome.ALLOW, SideEffect.LOCAL_MUTATION: Outcome.REQUIRE_APPROVAL}
)


class ScriptedAgent:
    """Answers with the next decision of a fixed script, and remembers what it was shown."""

    def __init__(self, decisions: Sequence[Decision]) -> None:
        self._decisions = list(decisions)
        self.seen: list[StepInput] = []

    async def decide(self, step_input: StepInput) -> Decision:
        self.seen.append(step_input)
        return self._decisions.pop(0)


async def test_driver_approval_names_the_prefixed_tool_and_resume_executes_it_once(
    tmp_path: Path,
) -> None:
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir()
    (sandbox / "README.md").write_text("# Notes\nfirst\nsecond\n")
    sandbox = sandbox.resolve()
    target = sandbox / "summary.txt"
    server = Server(name="fs", command=["node", str(FILESYSTEM), str(sandbox)], default_timeout=20)
    manifest = await pin(server)
    database = tmp_path / "runs.db"
    write_args = json.dumps({"path": str(target), "content": "two lines\nof summary\n"})

    # First process: read, then ask to write; the policy pauses the write.
    tools, report = await load(server, manifest, RULES)
    try:
        store = open_store(database)
        agent = ScriptedAgent(
            [
                Decision.tool_call(
                    "fs_read_text_file", json.dumps({"path": str(sandbox / "README.md")})
                ),
                Decision.tool_call("fs_write_file", write_args),
            ]
        )
        paused = await Driver(Gate(store, tools, policy=POLICY), agent).run("summarise")
        store.close()
    finally:
        assert report.connection is not None
        await report.connection.aclose()
    assert paused.status is RunStatus.WAITING_FOR_APPROVAL
    assert paused.approval is not None
    assert paused.approval.tool == "fs_write_file"
    assert paused.approval.args == write_args
    assert paused.approval.presentation["path"] == str(target)
    assert paused.approval.presentation["lines"] == 2
    assert not target.exists()
    # The agent saw the read's content and only the classified tools, by their prefixed names.
    assert "second" in agent.seen[1].history[0].content
    assert sorted(spec.name for spec in agent.seen[0].tools) == [
        "fs_list_directory",
        "fs_read_text_file",
        "fs_write_file",
    ]

    # The operator approves the hash they were shown.
    store = open_store(database)
    approve(store, paused.run_id, approval_hash=paused.approval.approval_hash, by="operator")
    store.close()

    # A new session resumes: exactly the recorded request runs, once.
    tools, report = await load(server, manifest, RULES)
    try:
        store = open_store(database)
        finisher = ScriptedAgent([Decision.complete("summary written")])
        finished = await Driver(Gate(store, tools, policy=POLICY), finisher).resume(paused.run_id)
        steps = store.list_steps(paused.run_id)
        store.close()
    finally:
        assert report.connection is not None
        await report.connection.aclose()
    assert finished.status is RunStatus.COMPLETED
    assert finished.result == "summary written"
    assert target.read_text() == "two lines\nof summary\n"
    writes = [step for step in steps if step.tool == "fs_write_file"]
    assert len(writes) == 1
    assert writes[0].args == write_args
    assert str(writes[0].status) == "succeeded"
