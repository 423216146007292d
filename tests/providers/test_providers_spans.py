"""Each model attempt becomes a span, as the GenAI semantic conventions name it: built from the
recorded `model_attempt` events of a real adapter's run against a fake Messages API."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from api_formats import anthropic_text, anthropic_tool_use

from agentrt import Driver, Gate, RunStatus, open_store
from agentrt.accounting import PriceTable
from agentrt.providers import AnthropicAgent, RetryPolicy
from agentrt.telemetry import SpanKind, TraceBuilder
from agentrt.tools import SideEffect, ToolCall, ToolResult, ToolSpec

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

FAST = RetryPolicy(max_attempts=3, initial_delay=0.05, max_delay=0.1)
SECRET_PROMPT = "the goal nobody may read in a span"


class Echo:
    spec = ToolSpec(
        name="echo",
        description="Say it back.",
        input_schema={"type": "object", "properties": {"text": {"type": "string"}}},
        side_effect=SideEffect.READ_ONLY,
        timeout=5.0,
    )

    async def call(self, call: ToolCall) -> ToolResult:
        return ToolResult('{"said":"hi"}', "said")


async def test_every_model_attempt_is_a_client_span_with_the_genai_attributes(
    tmp_path: Path, model_server: Any
) -> None:
    model_server.answer({"error": {"type": "overloaded_error", "message": "busy"}}, status=529)
    model_server.answer(anthropic_tool_use("echo", {"text": "hi"}))
    model_server.answer(
        anthropic_text(
            "done",
            usage={
                "input_tokens": 200,
                "output_tokens": 5,
                "cache_read_input_tokens": 50,
                "cache_creation_input_tokens": 0,
            },
        )
    )
    agent = AnthropicAgent("claude-fake", base_url=model_server.url, api_key="k", retry=FAST)
    with open_store(tmp_path / "runs.db") as store:
        driver = Driver(Gate(store, [Echo()]), agent, prices=PriceTable(unknown_is_free=True))
        result = await driver.run(SECRET_PROMPT)
        events = store.list_events(result.run_id, limit=1000)
    assert result.status is RunStatus.COMPLETED

    builder = TraceBuilder(content=True)
    spans = [span for event in events for span in builder.add(event)]
    models = [span for span in spans if span.kind is SpanKind.CLIENT]
    root = next(span for span in spans if span.name == "invoke_agent agentrt")
    assert [span.name for span in models] == ["chat claude-fake"] * 3
    assert {span.parent_span_id for span in models} == {root.span_id}
    assert len({span.span_id for span in spans}) == len(spans)

    failed, called, answered = (span.attributes for span in models)
    assert failed["gen_ai.operation.name"] == "chat"
    assert failed["gen_ai.system"] == failed["gen_ai.provider.name"] == "anthropic"
    assert failed["gen_ai.request.model"] == "claude-fake"
    assert failed["agentrt.outcome"] == "transient_error"
    assert models[0].error == "transient_error"
    assert (failed["agentrt.step"], failed["agentrt.model.attempt"]) == (1, 1)
    assert (called["agentrt.step"], called["agentrt.model.attempt"]) == (1, 2)
    assert called["gen_ai.response.finish_reasons"] == ("tool_use",)
    assert (called["gen_ai.usage.input_tokens"], called["gen_ai.usage.output_tokens"]) == (120, 30)
    assert models[1].error is None
    assert answered["gen_ai.response.finish_reasons"] == ("end_turn",)
    assert answered["gen_ai.usage.cache_read.input_tokens"] == 50
    # A span lasts from the request to its record, and never ends before it starts.
    assert all(span.start_ns <= span.end_ns for span in models)
    # Neither the prompt nor the reply is in any span, even with content on (neither is
    # recorded; content adds only a tool call's arguments and result).
    every_value = [str(v) for span in spans for v in span.attributes.values()]
    assert not any(SECRET_PROMPT in value or value == "done" for value in every_value)
