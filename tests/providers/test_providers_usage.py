"""Usage and stop reasons of the OpenAI-compatible and Ollama adapters, recorded per attempt."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from api_formats import ollama_chat, openai_completion

from agentrt import Driver, Gate, RunStatus, open_store
from agentrt.accounting import AttemptOutcome, PriceTable, list_attempts
from agentrt.providers import OllamaAgent, OpenAIAgent, RetryPolicy
from agentrt.tools import SideEffect, ToolCall, ToolResult, ToolSpec

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

FAST = RetryPolicy(max_attempts=3, initial_delay=0.05, max_delay=0.1)


class Echo:
    spec = ToolSpec(
        name="echo",
        description="Say it back.",
        input_schema={"type": "object", "properties": {"text": {"type": "string"}}},
        side_effect=SideEffect.READ_ONLY,
        timeout=5.0,
    )

    def __init__(self) -> None:
        self.calls: list[ToolCall] = []

    async def call(self, call: ToolCall) -> ToolResult:
        self.calls.append(call)
        return ToolResult('{"said":"hi"}', "said")


async def drive(database: str | Path, agent: Any) -> tuple[Any, Any, Echo]:
    """One metered run on `database` (each test runs on SQLite and on PostgreSQL)."""
    store = open_store(database)
    tool = Echo()
    driver = Driver(Gate(store, [tool]), agent, prices=PriceTable(unknown_is_free=True))
    return await driver.run("Say hi."), store, tool


def openai_call(arguments: str, **kwargs: Any) -> dict[str, Any]:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "echo", "arguments": arguments},
    }
    return openai_completion({"content": None, "tool_calls": [call]}, **kwargs)


async def test_openai_usage_is_read_with_cached_prompt_tokens_apart(
    database: str | Path, model_server: Any
) -> None:
    usage = {
        "prompt_tokens": 100,
        "completion_tokens": 20,
        "total_tokens": 120,
        "prompt_tokens_details": {"cached_tokens": 40},
    }
    model_server.answer(openai_completion({"content": "hi"}, usage=usage))

    result, store, _ = await drive(database, OpenAIAgent("m", base_url=model_server.url))

    assert result.status is RunStatus.COMPLETED
    (attempt,) = list_attempts(store, result.run_id)
    assert attempt.usage is not None
    assert (attempt.usage.input_tokens, attempt.usage.output_tokens) == (60, 20)
    assert attempt.usage.cache_read_input_tokens == 40
    assert (attempt.stop_reason, attempt.charged_tokens) == ("stop", 120)
    assert model_server.requests[0].json()["max_tokens"] == 4096


async def test_openai_length_cut_is_never_acted_on(database: str | Path, model_server: Any) -> None:
    usage = {"prompt_tokens": 10, "completion_tokens": 5}
    # Complete, schema-valid arguments — still not run, because the reply was cut off.
    model_server.answer(openai_call('{"text":"hi"}', finish_reason="length", usage=usage))
    model_server.answer(openai_completion({"content": "done"}, usage=usage))

    result, store, tool = await drive(database, OpenAIAgent("m", base_url=model_server.url))

    assert result.status is RunStatus.COMPLETED
    assert tool.calls == []
    told = model_server.requests[1].json()["messages"][-1]
    assert told["role"] == "user" and "cut off at the token limit" in told["content"]
    assert [a.stop_reason for a in list_attempts(store, result.run_id)] == ["length", "stop"]


async def test_openai_missing_usage_is_flagged_and_charged_in_full(
    database: str | Path, model_server: Any
) -> None:
    model_server.answer(openai_completion({"content": "hi"}))
    agent = OpenAIAgent("m", base_url=model_server.url, extra_body={"max_completion_tokens": 50})

    result, store, _ = await drive(database, agent)

    body = model_server.requests[0].json()
    assert body["max_completion_tokens"] == 50 and "max_tokens" not in body
    (attempt,) = list_attempts(store, result.run_id)
    assert attempt.usage is None and "reported no usage object" in attempt.note
    assert attempt.charged_tokens == len(model_server.requests[0].body) + 50


async def test_openai_cached_tokens_above_the_prompt_are_flagged(
    database: str | Path, model_server: Any
) -> None:
    usage = {
        "prompt_tokens": 5,
        "completion_tokens": 1,
        "prompt_tokens_details": {"cached_tokens": 9},
    }
    model_server.answer(openai_completion({"content": "hi"}, usage=usage))

    result, store, _ = await drive(database, OpenAIAgent("m", base_url=model_server.url))

    (attempt,) = list_attempts(store, result.run_id)
    assert attempt.usage is None and "more cached tokens than prompt tokens" in attempt.note


async def test_openai_500_then_success_is_retried(database: str | Path, model_server: Any) -> None:
    model_server.answer({"error": {"message": "upstream"}}, status=502)
    usage = {"prompt_tokens": 1, "completion_tokens": 1}
    model_server.answer(openai_completion({"content": "hi"}, usage=usage))

    result, store, _ = await drive(
        database, OpenAIAgent("m", base_url=model_server.url, retry=FAST)
    )

    assert result.status is RunStatus.COMPLETED
    outcomes = [a.outcome for a in list_attempts(store, result.run_id)]
    assert outcomes == [AttemptOutcome.TRANSIENT_ERROR, AttemptOutcome.OK]


async def test_ollama_counters_and_done_reason_are_read(
    database: str | Path, model_server: Any
) -> None:
    model_server.answer(ollama_chat({"content": "hi"}, prompt_eval_count=26, eval_count=7))

    result, store, _ = await drive(database, OllamaAgent("m", base_url=model_server.url))

    (attempt,) = list_attempts(store, result.run_id)
    assert attempt.usage is not None
    assert (attempt.usage.input_tokens, attempt.usage.output_tokens) == (26, 7)
    assert attempt.stop_reason == "stop"
    assert model_server.requests[0].json()["options"]["num_predict"] == 4096


async def test_ollama_cached_prompt_without_prompt_eval_count_is_trusted(
    database: str | Path, model_server: Any
) -> None:
    # Ollama leaves prompt_eval_count out when the prompt came from its cache.
    model_server.answer(ollama_chat({"content": "hi"}, eval_count=7))

    result, store, _ = await drive(database, OllamaAgent("m", base_url=model_server.url))

    (attempt,) = list_attempts(store, result.run_id)
    assert attempt.usage is not None and attempt.charged_tokens == 7


async def test_ollama_negative_counter_is_flagged(database: str | Path, model_server: Any) -> None:
    model_server.answer(ollama_chat({"content": "hi"}, prompt_eval_count=-1, eval_count=7))

    result, store, _ = await drive(database, OllamaAgent("m", base_url=model_server.url))

    (attempt,) = list_attempts(store, result.run_id)
    assert attempt.usage is None and "prompt_eval_count = -1" in attempt.note


async def test_ollama_length_cut_is_never_acted_on(database: str | Path, model_server: Any) -> None:
    cut = {
        "content": "",
        "tool_calls": [{"function": {"name": "echo", "arguments": {"text": "h"}}}],
    }
    model_server.answer(ollama_chat(cut, done_reason="length", prompt_eval_count=3, eval_count=4))
    model_server.answer(ollama_chat({"content": "done"}, prompt_eval_count=3, eval_count=1))

    result, store, tool = await drive(database, OllamaAgent("m", base_url=model_server.url))

    assert result.status is RunStatus.COMPLETED
    assert tool.calls == []
    assert [a.stop_reason for a in list_attempts(store, result.run_id)] == ["length", "stop"]
