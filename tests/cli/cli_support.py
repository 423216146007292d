"""What the operator command's tests run against: databases the real Gate wrote to real files."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import anyio

from agentrt import ClassPolicy, Decision, Outcome, SideEffect, ToolCall, ToolResult, ToolSpec
from agentrt.gate import Gate, Limits
from agentrt.store import open_store

HOSTILE_GOAL = "tidy \x1b[31mred\x1b[0m notes \u202eexe.txt"
"""A goal carrying an ANSI colour escape and a right-to-left override."""


class WriteNote:
    """A real local mutation: writes `content` to a file under `directory`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.spec = ToolSpec(
            name="write_note",
            description="Write a note file.",
            input_schema={
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["path", "content"],
                "additionalProperties": False,
            },
            side_effect=SideEffect.LOCAL_MUTATION,
            timeout=5.0,
        )

    async def call(self, call: ToolCall) -> ToolResult:
        arguments = json.loads(call.args)
        (self.directory / arguments["path"]).write_text(arguments["content"])
        return ToolResult(content=json.dumps({"written": arguments["path"]}), summary="written")


class ReadNote:
    """A real read: returns a file's text."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.spec = ToolSpec(
            name="read_note",
            description="Read a note file.",
            input_schema={
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
            side_effect=SideEffect.READ_ONLY,
            timeout=5.0,
        )

    async def call(self, call: ToolCall) -> ToolResult:
        path = json.loads(call.args)["path"]
        return ToolResult(content=json.dumps((self.directory / path).read_text()), summary="read")


POLICY = ClassPolicy(
    {SideEffect.READ_ONLY: Outcome.ALLOW, SideEffect.LOCAL_MUTATION: Outcome.REQUIRE_APPROVAL}
)


@dataclass(frozen=True)
class Produced:
    """A database the real Gate wrote, and what is in it."""

    database: Path | str  # a file, or a postgresql:// URL
    sandbox: Path
    waiting_run: str
    approval_id: str
    approval_hash: str
    completed_run: str
    hostile_run: str
    write_args: str


def produce(
    database: Path | str,
    sandbox: Path,
    *,
    long_content: str = "",
    approval_ttl: float | None = None,
) -> Produced:
    """Three runs through the real Gate: one completed, one with a hostile goal that
    completed, and one paused on a write that needs approval (created last)."""
    sandbox.mkdir(exist_ok=True)
    (sandbox / "todo.txt").write_text("buy milk\n")
    content = long_content or "line one\nline two\n"
    write_args = json.dumps({"path": "done.txt", "content": content})

    async def scenario() -> Produced:
        store = open_store(database)
        try:
            gate = Gate(
                store,
                [ReadNote(sandbox), WriteNote(sandbox)],
                policy=POLICY,
                limits=Limits(approval_ttl=approval_ttl),
            )
            completed = await gate.start("read the todo list")
            await gate.step(completed, Decision.tool_call("read_note", '{"path": "todo.txt"}'))
            await gate.step(completed, Decision.complete("the list says: buy milk"))
            hostile = await gate.start(HOSTILE_GOAL)
            await gate.step(hostile, Decision.complete("done"))
            waiting = await gate.start("write the done list")
            await gate.step(waiting, Decision.tool_call("read_note", '{"path": "todo.txt"}'))
            outcome = await gate.step(waiting, Decision.tool_call("write_note", write_args))
            assert outcome.approval is not None
            return Produced(
                database=database,
                sandbox=sandbox,
                waiting_run=waiting,
                approval_id=outcome.approval.approval_id,
                approval_hash=outcome.approval.approval_hash,
                completed_run=completed,
                hostile_run=hostile,
                write_args=write_args,
            )
        finally:
            store.close()

    return anyio.run(scenario)


def file_bytes_and_mode(path: Path) -> tuple[bytes, int]:
    return path.read_bytes(), os.stat(path).st_mode
