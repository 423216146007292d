"""Two of the seed's promises, kept through the gate rather than the tool alone.

- A result refused after the tool ran is not a failure that can be retried:
  structured content that breaks the tool's own `outputSchema` is recorded as
  executed, and the agent is told the tool ran and its result was withheld.
- Fixed values are injected after validation, outside the approval hash.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

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
from agentrt.store import RunStatus, StepStatus, approval_hash

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

HOSTILE = Path(__file__).parent / "servers" / "hostile_stdio.py"
POLICY = ClassPolicy(
    {SideEffect.READ_ONLY: Outcome.ALLOW, SideEffect.LOCAL_MUTATION: Outcome.ALLOW}
)
_NOTE_SCHEMA = {
    "type": "object",
    "properties": {"id": {"type": "integer"}, "title": {"type": "string", "pattern": "^[a-z]+$"}},
    "required": ["id"],
}


def _server(tmp_path: Path, tools: list[dict[str, Any]], calls: dict[str, Any]) -> Server:
    scenario = {
        "pages": {"": json.dumps({"tools": tools})},
        "calls": calls,
        "log": str(tmp_path / "received.log"),
    }
    return Server(
        name="notes",
        command=[sys.executable, str(HOSTILE), json.dumps(scenario)],
        default_timeout=5.0,
    )


def _calls_received(tmp_path: Path, tool: str) -> list[dict[str, Any]]:
    lines = (tmp_path / "received.log").read_bytes().splitlines()
    messages = [json.loads(line) for line in lines if line.strip()]
    return [
        message["params"]["arguments"]
        for message in messages
        if message.get("method") == "tools/call" and message["params"]["name"] == tool
    ]


class RetryOnFailure:
    """An agent as a model behaves: a failed write is tried again (up to three times);
    any other answer ends the run."""

    def __init__(self, tool: str, args: str) -> None:
        self._tool = tool
        self._args = args
        self.seen: list[StepInput] = []

    async def decide(self, step_input: StepInput) -> Decision:
        self.seen.append(step_input)
        history = step_input.history
        if not history or (history[-1].kind == "tool_error" and len(history) < 3):
            return Decision.tool_call(self._tool, self._args)
        return Decision.complete("done")


def _note_tool() -> dict[str, Any]:
    return {
        "name": "write_note",
        "description": "Writes a note.",
        "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}},
        "outputSchema": _NOTE_SCHEMA,
    }


_BROKEN_RESULTS: dict[str, str] = {
    "wrong type": (
        '{"content":[{"type":"text","text":"saved"}],"structuredContent":{"id":"seven"}}'
    ),
    "no structured content": '{"content":[{"type":"text","text":"saved"}]}',
}


@pytest.mark.parametrize("broken", sorted(_BROKEN_RESULTS))
async def test_a_result_refused_after_the_tool_ran_is_recorded_as_run_and_not_repeated(
    tmp_path: Path, broken: str
) -> None:
    server = _server(tmp_path, [_note_tool()], {"write_note": {"result": _BROKEN_RESULTS[broken]}})
    rules = {"write_note": Rule(side_effect=SideEffect.LOCAL_MUTATION)}
    tools, report = await load(server, await pin(server), rules)
    try:
        with open_store(tmp_path / "runs.db") as store:
            agent = RetryOnFailure("notes_write_note", '{"text": "buy milk"}')
            outcome = await Driver(Gate(store, tools, policy=POLICY), agent).run("note it")
            steps = store.list_steps(outcome.run_id)
            store.verify_chain()
    finally:
        assert report.connection is not None
        await report.connection.aclose()
    # The server executed the write once; the agent had no failure to retry.
    assert _calls_received(tmp_path, "write_note") == [{"text": "buy milk"}]
    assert outcome.status is RunStatus.COMPLETED
    assert [step.status for step in steps] == [StepStatus.SUCCEEDED]
    told = agent.seen[1].history[0]
    assert told.kind == "result"
    text = json.loads(told.content)
    assert text.startswith("RESULT_WITHHELD: the tool notes/write_note ran")
    assert "Do not call it again" in text
    assert "outputSchema" in text
    # The withheld result is not handed on as the tool's answer: the agent gets the notice.
    assert isinstance(text, str)
    assert steps[0].summary == "notes/write_note: result withheld"


async def test_a_result_that_keeps_its_output_schema_is_passed_on_as_it_came(
    tmp_path: Path,
) -> None:
    good = '{"content":[{"type":"text","text":"saved"}],"structuredContent":{"id":7}}'
    server = _server(tmp_path, [_note_tool()], {"write_note": {"result": good}})
    tools, report = await load(
        server, await pin(server), {"write_note": Rule(side_effect=SideEffect.LOCAL_MUTATION)}
    )
    try:
        with open_store(tmp_path / "runs.db") as store:
            gate = Gate(store, tools, policy=POLICY)
            run_id = await gate.start("note it")
            outcome = await gate.step(run_id, Decision.tool_call("notes_write_note", "{}"))
    finally:
        assert report.connection is not None
        await report.connection.aclose()
    assert outcome.observation is not None
    assert outcome.observation.kind == "result"
    assert json.loads(outcome.observation.content) == {"id": 7}


async def test_the_output_validator_is_built_once_per_tool_not_per_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import agentrt.schema

    compiled: list[object] = []
    real: Callable[..., Any] = agentrt.schema.compile_schema

    def counting(schema: Any) -> Any:
        compiled.append(schema)
        return real(schema)

    monkeypatch.setattr(agentrt.schema, "compile_schema", counting)
    good = '{"content":[{"type":"text","text":"saved"}],"structuredContent":{"id":7}}'
    server = _server(tmp_path, [_note_tool()], {"write_note": {"result": good}})
    tools, report = await load(
        server, await pin(server), {"write_note": Rule(side_effect=SideEffect.LOCAL_MUTATION)}
    )
    try:
        with open_store(tmp_path / "runs.db") as store:
            gate = Gate(store, tools, policy=POLICY)
            before = len(compiled)
            for _ in range(5):
                run_id = await gate.start("note it")
                done = await gate.step(run_id, Decision.tool_call("notes_write_note", "{}"))
                assert done.observation is not None
                assert json.loads(done.observation.content) == {"id": 7}
    finally:
        assert report.connection is not None
        await report.connection.aclose()
    assert [schema for schema in compiled[before:] if "id" in json.dumps(schema)] == [_NOTE_SCHEMA]


async def test_an_output_pattern_that_backtracks_forever_withholds_the_result_in_bounded_time(
    tmp_path: Path,
) -> None:
    tool = _note_tool()
    tool["outputSchema"] = {
        "type": "object",
        "properties": {"title": {"type": "string", "pattern": "^(.*?,){11}P"}},
    }
    evil = json.dumps(
        {"content": [], "structuredContent": {"title": "a," * 30}}, separators=(",", ":")
    )
    server = _server(tmp_path, [tool], {"write_note": {"result": evil}})
    tools, report = await load(
        server, await pin(server), {"write_note": Rule(side_effect=SideEffect.LOCAL_MUTATION)}
    )
    try:
        with open_store(tmp_path / "runs.db") as store:
            gate = Gate(store, tools, policy=POLICY)
            run_id = await gate.start("note it")
            outcome = await gate.step(run_id, Decision.tool_call("notes_write_note", "{}"))
    finally:
        assert report.connection is not None
        await report.connection.aclose()
    assert outcome.observation is not None
    assert outcome.observation.kind == "result"
    assert "took too long to check" in outcome.observation.content


async def test_a_fixed_value_is_injected_after_validation_and_is_outside_the_approval_hash(
    tmp_path: Path,
) -> None:
    tool = {
        "name": "save",
        "description": "Saves text.",
        "inputSchema": {
            "type": "object",
            "properties": {"text": {"type": "string"}, "encoding": {"type": "string"}},
            "required": ["text"],
        },
    }
    server = _server(tmp_path, [tool], {"save": {"result": '{"content":[]}'}})
    manifest = await pin(server)
    asking = ClassPolicy({SideEffect.LOCAL_MUTATION: Outcome.REQUIRE_APPROVAL})
    args = '{"text": "hello"}'
    hashes: list[str] = []
    database = tmp_path / "runs.db"
    for encoding in ('"utf-8"', '"latin-1"'):
        rules = {"save": Rule(side_effect=SideEffect.LOCAL_MUTATION, fixed={"encoding": encoding})}
        tools, report = await load(server, manifest, rules)
        try:
            with open_store(database) as store:
                gate = Gate(store, tools, policy=asking)
                # The model never sees the fixed parameter.
                (spec,) = [tool.spec for tool in tools]
                assert "encoding" not in spec.input_schema["properties"]
                run_id = await gate.start("save it")
                held = await gate.step(run_id, Decision.tool_call("notes_save", args))
                assert held.status is RunStatus.WAITING_FOR_APPROVAL
                approval = held.approval
                assert approval is not None
                hashes.append(approval.approval_hash)
                # What was hashed holds the request exactly as the model sent it...
                assert approval.args == args
                assert approval.approval_hash == approval_hash(
                    approval.kind,
                    approval.capability,
                    approval.presentation,
                    approval.tool,
                    approval.args,
                )
                # ...and nothing of the fixed value.
                hashed = json.dumps([approval.capability, approval.presentation])
                assert "encoding" not in hashed and encoding.strip('"') not in hashed
                if encoding == '"utf-8"':
                    approve(store, run_id, approval_hash=approval.approval_hash, by="op")
                    resumed = await gate.resume(run_id)
                    assert resumed.status is RunStatus.RUNNING
        finally:
            assert report.connection is not None
            await report.connection.aclose()
    # Another fixed value, the same approval hash: the value is outside it.
    assert hashes[0] == hashes[1]
    # And the server received it, injected after the model's arguments were validated.
    assert _calls_received(tmp_path, "save") == [{"text": "hello", "encoding": "utf-8"}]
