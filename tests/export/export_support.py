"""Databases for the export and telemetry tests: real Gate runs in a real SQLite file."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import anyio

from agentrt import ClassPolicy, Decision, Outcome, SideEffect, ToolCall, ToolResult, ToolSpec
from agentrt.approvals import approve
from agentrt.gate import Gate
from agentrt.store import open_store

AGENTRT = Path(sys.executable).with_name("agentrt")

SECRET_ARGUMENT = "the-argument-text-nobody-may-see"
"""Written into every tool call's arguments; no span may carry it unless content is on."""
SECRET_RESULT = "the-result-text-nobody-may-see"
"""Returned by every tool; no span may carry it unless content is on."""


class Note:
    """A real tool over a directory: `read_note` returns a file, `write_note` writes one."""

    def __init__(self, directory: Path, name: str, side_effect: SideEffect) -> None:
        self.directory = directory
        self.spec = ToolSpec(
            name=name,
            description=f"{name} in the sandbox.",
            input_schema={
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["path"],
            },
            side_effect=side_effect,
            timeout=5.0,
        )

    async def call(self, call: ToolCall) -> ToolResult:
        arguments = json.loads(call.args)
        target = self.directory / arguments["path"]
        if "content" in arguments:
            target.write_text(arguments["content"])
        return ToolResult(content=json.dumps({"note": SECRET_RESULT}), summary="done")


POLICY = ClassPolicy(
    {SideEffect.READ_ONLY: Outcome.ALLOW, SideEffect.LOCAL_MUTATION: Outcome.REQUIRE_APPROVAL}
)


def tools(sandbox: Path) -> list[Note]:
    return [
        Note(sandbox, "read_note", SideEffect.READ_ONLY),
        Note(sandbox, "write_note", SideEffect.LOCAL_MUTATION),
    ]


@dataclass(frozen=True)
class Runs:
    database: Path
    run_ids: list[str]


async def approved_write_run(gate: Gate, metadata: dict[str, str] | None = None) -> str:
    """A run that reads, asks to write (held for approval), is approved, writes and completes."""
    store = gate.store
    run_id = await gate.start("read then write a note", metadata=metadata)
    read_args = json.dumps({"path": "todo.txt", "content": SECRET_ARGUMENT})
    await gate.step(run_id, Decision.tool_call("read_note", read_args))
    write_args = json.dumps({"path": "done.txt", "content": SECRET_ARGUMENT})
    outcome = await gate.step(run_id, Decision.tool_call("write_note", write_args))
    assert outcome.approval is not None
    approve(
        store,
        run_id,
        approval_hash=outcome.approval.approval_hash,
        approval_id=outcome.approval.approval_id,
        by="tester",
    )
    await gate.resume(run_id)
    await gate.step(run_id, Decision.complete("wrote the note"))
    return run_id


def produce_runs(database: Path, sandbox: Path, count: int = 2) -> Runs:
    """`count` approved-write runs through the real Gate."""
    sandbox.mkdir(exist_ok=True)

    async def scenario() -> list[str]:
        store = open_store(database)
        try:
            gate = Gate(store, tools(sandbox), policy=POLICY)
            return [await approved_write_run(gate) for _ in range(count)]
        finally:
            store.close()

    return Runs(database, anyio.run(scenario))


def append_filler(database: Path, count: int, run_id: str = "filler") -> None:
    """Append `count` chained events the way the store appends any event."""
    store = open_store(database)
    try:
        for start in range(0, count, 200):
            with store.transaction() as connection:
                for number in range(start, min(start + 200, count)):
                    store.append_event(connection, run_id, "filler", {"n": number, "text": "é"})
    finally:
        store.close()
