"""Anthropic as the reference supports it: extended thinking kept with its signatures and sent
back with the tool call it led to (also after a resume in another process), and strict tool
schemas where the API's subset allows them, refused in one sentence where it does not."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from api_formats import anthropic_message, anthropic_text

from agentrt import (
    ClassPolicy,
    Driver,
    Gate,
    Outcome,
    RunStatus,
    approve,
    open_store,
)
from agentrt.accounting import PriceTable, list_attempts
from agentrt.providers import AnthropicAgent, ProviderError, RetryPolicy
from agentrt.providers._strict import strict_refusal
from agentrt.tools import SideEffect, ToolCall, ToolResult, ToolSpec

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

FAST = RetryPolicy(max_attempts=2, initial_delay=0.05, max_delay=0.1)
STRICT_SCHEMA = {
    "type": "object",
    "properties": {
        "path": {"type": "string", "description": "where"},
        "mode": {"enum": ["a", "b", None]},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "when": {"type": "string", "format": "date-time"},
        "owner": {"$ref": "#/$defs/person"},
    },
    "required": ["path"],
    "additionalProperties": False,
    "$defs": {
        "person": {
            "type": "object",
            "properties": {"name": {"type": "string"}},
            "additionalProperties": False,
        }
    },
}
THINKING = {
    "type": "thinking",
    "thinking": "The user wants a note; write it.",
    "signature": "c2ln==",
}
REDACTED = {"type": "redacted_thinking", "data": "ZW5jcnlwdGVk"}


class Write:
    def __init__(self, schema: dict[str, Any] | None = None) -> None:
        self.spec = ToolSpec(
            name="write",
            description="Write a note.",
            input_schema=schema or STRICT_SCHEMA,
            side_effect=SideEffect.LOCAL_MUTATION,
            timeout=5.0,
        )
        self.calls: list[ToolCall] = []

    async def call(self, call: ToolCall) -> ToolResult:
        self.calls.append(call)
        return ToolResult('{"written":true}', "written")


ASKING = ClassPolicy({SideEffect.LOCAL_MUTATION: Outcome.REQUIRE_APPROVAL})


def _thinking_then_call(*blocks: dict[str, Any]) -> dict[str, Any]:
    return anthropic_message(
        [
            *blocks,
            {"type": "text", "text": "Writing it."},
            {"type": "tool_use", "id": "toolu_9", "name": "write", "input": {"path": "n.md"}},
        ],
        stop_reason="tool_use",
    )


def _agent(server: Any, **kwargs: Any) -> AnthropicAgent:
    kwargs.setdefault("retry", FAST)
    kwargs.setdefault("max_tokens", 4096)
    return AnthropicAgent("claude-fake", base_url=server.url, api_key="k", **kwargs)


async def test_thinking_blocks_go_back_with_their_tool_call_after_a_resume_elsewhere(
    tmp_path: Path, model_server: Any
) -> None:
    model_server.answer(_thinking_then_call(THINKING, REDACTED))
    model_server.answer(anthropic_text("The note is written."))
    database = tmp_path / "runs.db"
    prices = PriceTable(unknown_is_free=True)

    # One process: the model thinks, then asks to write; the policy holds the write.
    with open_store(database) as store:
        driver = Driver(Gate(store, [Write()], policy=ASKING),
                        _agent(model_server, thinking_budget=2048), prices=prices)  # fmt: skip
        paused = await driver.run("Write a note.")
        assert paused.status is RunStatus.WAITING_FOR_APPROVAL and paused.approval is not None
        approve(store, paused.run_id, approval_hash=paused.approval.approval_hash, by="op")

    # Another process (new store, new agent): resume, run the write, ask the model again.
    tool = Write()
    with open_store(database) as store:
        driver = Driver(Gate(store, [tool], policy=ASKING),
                        _agent(model_server, thinking_budget=2048), prices=prices)  # fmt: skip
        finished = await driver.resume(paused.run_id)
        attempts = list_attempts(store, paused.run_id)
        store.verify_chain()
    assert finished.status is RunStatus.COMPLETED
    assert len(tool.calls) == 1

    first, second = (request.json() for request in model_server.requests)
    assert first["thinking"] == second["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    # The assistant turn of the call carries the thinking exactly as it came, before the call.
    assistant = second["messages"][1]
    assert assistant["role"] == "assistant"
    assert assistant["content"][:2] == [THINKING, REDACTED]
    assert assistant["content"][2]["type"] == "tool_use"
    # What was sent back is what the chain recorded for that attempt.
    assert json.loads(attempts[0].carry or "null") == [THINKING, REDACTED]
    assert attempts[1].carry is None


async def test_without_thinking_nothing_is_kept_or_sent(tmp_path: Path, model_server: Any) -> None:
    model_server.answer(_thinking_then_call())
    model_server.answer(anthropic_text("done"))
    with open_store(tmp_path / "runs.db") as store:
        agent = _agent(model_server)
        assert agent.carries_context is False
        driver = Driver(Gate(store, [Write()]), agent, prices=PriceTable(unknown_is_free=True))
        result = await driver.run("Write a note.")
        attempts = list_attempts(store, result.run_id)
    assert result.status is RunStatus.COMPLETED
    assert all(attempt.carry is None for attempt in attempts)
    for request in model_server.requests:
        assert "thinking" not in request.json()


async def test_a_thinking_block_without_its_signature_is_refused_and_nothing_runs(
    tmp_path: Path, model_server: Any
) -> None:
    unsigned = {"type": "thinking", "thinking": "no signature here"}
    model_server.answer(_thinking_then_call(unsigned))
    tool = Write()
    with open_store(tmp_path / "runs.db") as store:
        driver = Driver(Gate(store, [tool]), _agent(model_server, thinking_budget=2048),
                        prices=PriceTable(unknown_is_free=True))  # fmt: skip
        with pytest.raises(ProviderError, match="thinking block without its signature"):
            await driver.run("Write a note.")
        store.verify_chain()
    assert tool.calls == []


@pytest.mark.parametrize("budget", [0, 1023, 4096, 10_000, True, 2048.5])
def test_a_thinking_budget_outside_the_apis_range_is_refused_in_one_sentence(
    budget: Any, model_server: Any
) -> None:
    with pytest.raises(ProviderError, match="thinking_budget must be a whole number of tokens"):
        _agent(model_server, thinking_budget=budget, max_tokens=4096)
    assert model_server.requests == []


async def test_strict_tools_mark_every_tool_whose_schema_fits(
    tmp_path: Path, model_server: Any
) -> None:
    model_server.answer(anthropic_text("nothing to do"))
    with open_store(tmp_path / "runs.db") as store:
        driver = Driver(Gate(store, [Write()]), _agent(model_server, strict_tools=True),
                        prices=PriceTable(unknown_is_free=True))  # fmt: skip
        await driver.run("Write a note.")
    (tool,) = model_server.requests[0].json()["tools"]
    assert tool["strict"] is True
    assert tool["input_schema"] == STRICT_SCHEMA


async def test_strict_tools_refuse_a_schema_outside_the_subset_before_any_request(
    tmp_path: Path, model_server: Any
) -> None:
    schema = {
        "type": "object",
        "properties": {"size": {"type": "integer", "minimum": 1}},
        "additionalProperties": False,
    }
    with open_store(tmp_path / "runs.db") as store:
        driver = Driver(Gate(store, [Write(schema)]), _agent(model_server, strict_tools=True),
                        prices=PriceTable(unknown_is_free=True))  # fmt: skip
        with pytest.raises(ProviderError) as refused:
            await driver.run("Write a note.")
        store.verify_chain()
    assert str(refused.value) == (
        "the tool write cannot use Anthropic's strict tool use: its input schema uses "
        '"minimum" at /properties/size, which it does not support; turn strict_tools off '
        "or change the schema"
    )
    assert model_server.requests == []


@pytest.mark.parametrize(
    ("schema", "said"),
    [
        ({"type": "object", "properties": {}}, "does not set additionalProperties to false"),
        (
            {"type": "object", "additionalProperties": {"type": "string"}},
            "does not set additionalProperties to false",
        ),
        ({"type": "string", "maxLength": 3}, 'uses "maxLength" at its top'),
        ({"type": "array", "items": {"type": "string"}, "minItems": 2}, "minItems"),
        ({"enum": [{"a": 1}]}, "enum of values that are not all primitive"),
        ({"oneOf": [{"type": "string"}]}, 'uses "oneOf"'),
        ({"$ref": "https://example.com/s.json"}, "reference that is not local"),
        ({"$ref": "#/$defs/missing"}, "does not resolve"),
        (
            {
                "$ref": "#/$defs/node",
                "$defs": {
                    "node": {
                        "type": "object",
                        "properties": {"next": {"$ref": "#/$defs/node"}},
                        "additionalProperties": False,
                    }
                },
            },
            'is recursive (through "node")',
        ),
        ({"type": "string", "format": "hex"}, 'uses the format "hex"'),
        (True, "has a boolean schema at /items"),
        (3, "something other than a schema at /items"),
    ],
)
def test_each_thing_outside_the_strict_subset_is_named(schema: Any, said: str) -> None:
    # A bare value (True, 3) is put where a schema belongs, under "items".
    refusal = strict_refusal("t", schema if isinstance(schema, dict) else {"items": schema})
    assert refusal is not None and said in refusal, refusal
    assert refusal.count(".") <= 1  # one sentence


def test_a_schema_inside_the_subset_is_taken() -> None:
    assert strict_refusal("t", STRICT_SCHEMA) is None
