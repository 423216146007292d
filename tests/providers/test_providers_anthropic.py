"""AnthropicAgent against a real HTTP server on 127.0.0.1 playing the Messages API."""

from __future__ import annotations

import json
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from api_formats import anthropic_error, anthropic_text, anthropic_tool_use

from agentrt import Driver, Gate, RunStatus, open_store
from agentrt.accounting import AttemptOutcome, PriceTable, list_attempts
from agentrt.agent import Decision, Observation, StepInput
from agentrt.canonical import canonical_json
from agentrt.providers import (
    NO_RETRY,
    AnthropicAgent,
    ProviderError,
    RetryPolicy,
    agent_for,
)
from agentrt.tools import SideEffect, ToolCall, ToolResult, ToolSpec

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

FAST = RetryPolicy(max_attempts=3, initial_delay=0.05, max_delay=0.1)

LOOKUP = ToolSpec(
    name="lookup",
    description="Look a word up.",
    input_schema={
        "type": "object",
        "properties": {"word": {"type": "string"}, "n": {"type": "number"}},
        "required": ["word"],
    },
    side_effect=SideEffect.READ_ONLY,
    timeout=5.0,
)


class Lookup:
    spec = LOOKUP

    def __init__(self) -> None:
        self.calls: list[ToolCall] = []

    async def call(self, call: ToolCall) -> ToolResult:
        self.calls.append(call)
        return ToolResult('{"meaning":"a greeting"}', "looked up")


def step_input(history: list[Observation] | None = None) -> StepInput:
    return StepInput(run_id="run-1", goal="Look up hello.", tools=[LOOKUP], history=history or [])


def agent(server: Any, **kwargs: Any) -> AnthropicAgent:
    kwargs.setdefault("retry", FAST)
    return AnthropicAgent("claude-fake", base_url=server.url, **kwargs)


async def drive(tmp_path: Path, the_agent: Any, **driver_kwargs: Any) -> tuple[Any, Any, Lookup]:
    """A Driver run over a real SQLite file; returns (result, store, tool)."""
    store = open_store(tmp_path / "agentrt.db")
    tool = Lookup()
    gate = Gate(store, [tool])
    driver_kwargs.setdefault("prices", PriceTable(unknown_is_free=True))
    result = await Driver(gate, the_agent, **driver_kwargs).run("Look up hello.")
    return result, store, tool


async def test_anthropic_tool_use_becomes_a_tool_call_with_its_input_as_canonical_json(
    model_server: Any,
) -> None:
    # The body's own text, so the literal 1.50 reaches the adapter as written.
    body = json.dumps(anthropic_tool_use("lookup", {"word": "hello", "n": "N"}))
    model_server.answer(raw=body.replace('"n": "N"', '"n": 1.50').encode())

    decision = await agent(model_server, api_key="sk-ant-1").decide(step_input())

    # Every literal kept (1.50 is not 1.5), keys in canonical order.
    assert decision == Decision.tool_call("lookup", '{"n":1.50,"word":"hello"}')
    (request,) = model_server.requests
    assert request.path == "/v1/messages"
    assert request.headers["x-api-key"] == "sk-ant-1"
    assert request.headers["anthropic-version"] == "2023-06-01"
    assert "Authorization" not in request.headers
    body = request.json()
    assert body["model"] == "claude-fake"
    assert body["max_tokens"] == 4096
    assert body["tools"] == [
        {"name": "lookup", "description": "Look a word up.", "input_schema": LOOKUP.input_schema}
    ]
    assert body["messages"][0] == {
        "role": "user",
        "content": [{"type": "text", "text": "Look up hello."}],
    }


async def test_anthropic_text_reply_completes_the_run(model_server: Any) -> None:
    model_server.answer(anthropic_text("Hello means a greeting."))

    assert await agent(model_server).decide(step_input()) == Decision.complete(
        "Hello means a greeting."
    )


async def test_anthropic_history_sends_tool_results_and_errors_with_is_error(
    model_server: Any,
) -> None:
    model_server.answer(anthropic_text("ok"))
    history = [
        Observation(1, "lookup", '{"word":"hello"}', "result", '{"meaning":"a greeting"}'),
        Observation(2, "lookup", '{"word":"x"}', "denied", "not today"),
        Observation(3, "lookup", '{"word":', "invalid", "not valid JSON"),
    ]

    await agent(model_server).decide(step_input(history))

    messages = model_server.requests[0].json()["messages"]
    assert [m["role"] for m in messages] == ["user"] + ["assistant", "user"] * 3
    use = messages[1]["content"][0]
    assert use == {
        "type": "tool_use",
        "id": "toolu_agentrt_1",
        "name": "lookup",
        "input": {"word": "hello"},
    }
    assert messages[2]["content"] == [
        {
            "type": "tool_result",
            "tool_use_id": "toolu_agentrt_1",
            "content": '{"meaning":"a greeting"}',
        }
    ]
    denied = messages[4]["content"][0]
    assert denied["is_error"] is True
    assert denied["content"] == "The call was denied by the operator's policy: not today"
    # Arguments that were not an object cannot be a tool_use: told back as text, verbatim.
    assert messages[5]["content"][0]["text"] == '(called lookup with arguments {"word":)'
    assert messages[6]["content"][0]["text"].startswith(
        "The call was not run because it was invalid"
    )


async def test_anthropic_max_tokens_cut_is_never_acted_on_and_the_model_is_told(
    tmp_path: Path, model_server: Any
) -> None:
    # The cut reply carries a complete-looking tool call: it must still not run.
    model_server.answer(
        anthropic_tool_use("lookup", {"word": "hel"}, stop_reason="max_tokens"),
    )
    model_server.answer(anthropic_text("Hello is a greeting."))

    result, store, tool = await drive(tmp_path, agent(model_server))

    assert result.status is RunStatus.COMPLETED
    assert tool.calls == []
    assert store.list_steps(result.run_id) == []
    told = model_server.requests[1].json()["messages"][-1]["content"][-1]["text"]
    assert "cut off at the token limit (4096 tokens)" in told
    first, second = list_attempts(store, result.run_id)
    assert (first.outcome, first.stop_reason) == (AttemptOutcome.OK, "max_tokens")
    assert "not acted on" in first.note
    assert second.stop_reason == "end_turn"


async def test_anthropic_context_window_cut_is_never_acted_on(
    tmp_path: Path, model_server: Any
) -> None:
    # The Messages API's other cut: the reply ran into the context window, not max_tokens.
    model_server.answer(
        anthropic_tool_use("lookup", {"word": "hel"}, stop_reason="model_context_window_exceeded"),
    )
    model_server.answer(anthropic_text("Hello is a greeting."))

    result, store, tool = await drive(tmp_path, agent(model_server))

    assert result.status is RunStatus.COMPLETED
    assert tool.calls == []
    assert store.list_steps(result.run_id) == []
    first, second = list_attempts(store, result.run_id)
    assert first.stop_reason == "model_context_window_exceeded"
    assert "not acted on" in first.note
    assert second.stop_reason == "end_turn"


async def test_anthropic_cut_off_twice_fails_the_run_without_acting(
    tmp_path: Path, model_server: Any
) -> None:
    for _ in range(2):
        model_server.answer(anthropic_tool_use("lookup", {"word": "x"}, stop_reason="max_tokens"))

    result, _store, tool = await drive(tmp_path, agent(model_server, max_tokens=16))

    assert result.status is RunStatus.FAILED
    assert result.reason.startswith("model_cut_off:")
    assert tool.calls == []
    assert len(model_server.requests) == 2
    assert model_server.requests[0].json()["max_tokens"] == 16


async def test_anthropic_usage_is_recorded_with_cache_tokens_and_priced(
    tmp_path: Path, model_server: Any
) -> None:
    usage = {
        "input_tokens": 1000,
        "output_tokens": 200,
        "cache_creation_input_tokens": 300,
        "cache_read_input_tokens": 4000,
    }
    model_server.answer(anthropic_tool_use("lookup", {"word": "hello"}, usage=usage))
    model_server.answer(anthropic_text("done", usage=usage))
    the_agent = AnthropicAgent("claude-sonnet-4-5-20250929", base_url=model_server.url)

    result, store, tool = await drive(tmp_path, the_agent, prices=PriceTable())

    assert result.status is RunStatus.COMPLETED
    assert len(tool.calls) == 1
    attempts = list_attempts(store, result.run_id)
    assert [a.step for a in attempts] == [1, 2]
    first = attempts[0]
    assert first.usage is not None
    assert (first.usage.input_tokens, first.usage.cache_read_input_tokens) == (1000, 4000)
    assert first.charged_tokens == 5500
    # $3 in, $15 out, $3.75 cache write, $0.30 cache read per million tokens.
    assert first.cost == Decimal("0.003") + Decimal("0.003") + Decimal("0.001125") + Decimal(
        "0.0012"
    )
    events = [e for e in store.list_events(result.run_id) if e.type == "model_attempt"]
    assert [e.payload["attempt"] for e in events] == [1, 1]
    assert events[0].payload["usage"]["cache_creation_input_tokens"] == 300


@pytest.mark.parametrize(
    ("usage", "flag"),
    [
        ({"output_tokens": 5}, "reported no input_tokens"),
        ({"input_tokens": -3, "output_tokens": 5}, "input_tokens = -3"),
        ({"input_tokens": "12", "output_tokens": 5}, 'input_tokens = "12"'),
    ],
)
async def test_anthropic_implausible_usage_is_flagged_and_charged_in_full(
    tmp_path: Path, model_server: Any, usage: dict[str, Any], flag: str
) -> None:
    model_server.answer(anthropic_text("done", usage=usage))

    result, store, _ = await drive(tmp_path, agent(model_server, max_tokens=100))

    (attempt,) = list_attempts(store, result.run_id)
    assert attempt.usage is None
    assert flag in attempt.note and "usage not trusted" in attempt.note
    request_bytes = len(model_server.requests[0].body)
    assert attempt.charged_tokens == request_bytes + 100


async def test_anthropic_429_with_retry_after_is_retried_after_it_and_both_attempts_recorded(
    tmp_path: Path, model_server: Any
) -> None:
    model_server.answer(
        anthropic_error("rate_limit_error", "slow down"), status=429, headers={"Retry-After": "1"}
    )
    model_server.answer(anthropic_text("done"))
    started = time.monotonic()

    result, store, _ = await drive(tmp_path, agent(model_server))

    assert result.status is RunStatus.COMPLETED
    assert time.monotonic() - started >= 1.0
    first, second = list_attempts(store, result.run_id)
    assert (first.outcome, first.charged_tokens) == (AttemptOutcome.TRANSIENT_ERROR, 0)
    assert "answered 429: slow down" in first.error
    assert (second.step, second.attempt, second.outcome) == (1, 2, AttemptOutcome.OK)


async def test_anthropic_500_then_success_is_retried(tmp_path: Path, model_server: Any) -> None:
    model_server.answer(anthropic_error("api_error", "boom"), status=500)
    model_server.answer(anthropic_error("overloaded_error", "busy"), status=529)
    model_server.answer(anthropic_text("done"))

    result, store, _ = await drive(tmp_path, agent(model_server))

    assert result.status is RunStatus.COMPLETED
    outcomes = [a.outcome for a in list_attempts(store, result.run_id)]
    assert outcomes == [AttemptOutcome.TRANSIENT_ERROR] * 2 + [AttemptOutcome.OK]


async def test_anthropic_connection_dropped_after_sending_is_ambiguous_charged_in_full_and_retried(
    tmp_path: Path, model_server: Any
) -> None:
    model_server.answer(drop=True)
    model_server.answer(anthropic_text("done"))

    result, store, _ = await drive(tmp_path, agent(model_server, max_tokens=500))

    assert result.status is RunStatus.COMPLETED
    dropped, answered = list_attempts(store, result.run_id)
    assert dropped.outcome is AttemptOutcome.AMBIGUOUS
    # The provider may have billed it: its request bytes as input, its whole output budget.
    assert dropped.charged_tokens == len(model_server.requests[0].body) + 500
    assert "full budget" in dropped.note
    assert answered.outcome is AttemptOutcome.OK


@pytest.mark.parametrize("status", [400, 401, 403, 404])
async def test_anthropic_permanent_errors_are_not_retried(
    tmp_path: Path, model_server: Any, status: int
) -> None:
    model_server.answer(anthropic_error("invalid_request_error", "no such model"), status=status)
    model_server.answer(anthropic_text("never asked"))
    store = open_store(tmp_path / "agentrt.db")
    driver = Driver(Gate(store, [Lookup()]), agent(model_server))

    with pytest.raises(ProviderError, match=f"answered {status}: no such model"):
        await driver.run("Look up hello.")

    assert len(model_server.requests) == 1
    (run,) = store.list_runs()
    assert run.status is RunStatus.RUNNING  # resumable once the request is fixed
    (attempt,) = list_attempts(store, run.run_id)
    assert attempt.outcome is AttemptOutcome.PERMANENT_ERROR


async def test_anthropic_retries_stop_at_the_attempt_bound(model_server: Any) -> None:
    for _ in range(3):
        model_server.answer(anthropic_error("api_error", "down"), status=503)

    with pytest.raises(ProviderError, match=r"answered 503: down \(3 attempts, no more allowed\)"):
        await agent(model_server).decide(step_input())

    assert len(model_server.requests) == 3


async def test_anthropic_retry_after_longer_than_allowed_is_not_waited_for(
    model_server: Any,
) -> None:
    model_server.answer(anthropic_error("rate_limit_error", "later"), status=429,
                        headers={"Retry-After": "3600"})  # fmt: skip

    with pytest.raises(ProviderError, match="asks to wait 3600 s"):
        await agent(model_server).decide(step_input())

    assert len(model_server.requests) == 1


async def test_anthropic_redirect_is_refused_and_never_followed(
    model_server: Any, other_server: Any
) -> None:
    model_server.answer({}, status=307, headers={"Location": f"{other_server.url}/v1/messages"})

    with pytest.raises(ProviderError, match="redirect \\(307\\)"):
        await agent(model_server, api_key="sk-ant-secret").decide(step_input())

    assert len(model_server.requests) == 1
    assert other_server.requests == []


async def test_anthropic_key_is_never_sent_to_a_non_loopback_http_url(
    model_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ProviderError, match="refusing to send an API key over plain http"):
        AnthropicAgent("m", base_url="http://api.example.com", api_key="sk-ant-secret")
    # The environment's key belongs to the default host only: another URL never gets it.
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-from-env")
    model_server.answer(anthropic_text("ok"))
    await AnthropicAgent("m", base_url=model_server.url, retry=NO_RETRY).decide(step_input())
    assert "x-api-key" not in {name.lower() for name in model_server.requests[0].headers}
    assert AnthropicAgent("m").endpoint.api_key == "sk-ant-from-env"
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    with pytest.raises(ProviderError, match="ANTHROPIC_API_KEY is not set"):
        AnthropicAgent("m")


async def test_anthropic_base_url_ending_in_v1_is_taken_as_meant(model_server: Any) -> None:
    model_server.answer(anthropic_text("ok"))

    await AnthropicAgent("m", base_url=model_server.url + "/v1/").decide(step_input())

    assert model_server.requests[0].path == "/v1/messages"


def test_agent_for_builds_an_anthropic_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    built = agent_for("anthropic:claude-fake", base_url="http://127.0.0.1:9")
    assert isinstance(built, AnthropicAgent)
    assert (built.model, built.endpoint.api_key) == ("claude-fake", None)
    with pytest.raises(ProviderError, match="--model"):
        agent_for("anthropic:")


async def test_anthropic_answer_without_content_is_refused_and_charged(
    tmp_path: Path, model_server: Any
) -> None:
    model_server.answer({"type": "message", "usage": {"input_tokens": 1, "output_tokens": 1}})
    store = open_store(tmp_path / "agentrt.db")

    with pytest.raises(ProviderError, match="without a content list"):
        await Driver(Gate(store, [Lookup()]), agent(model_server)).run("Look up hello.")

    (run,) = store.list_runs()
    (attempt,) = list_attempts(store, run.run_id)
    assert attempt.outcome is AttemptOutcome.PERMANENT_ERROR
    assert attempt.charged_tokens > 4096
    assert len(model_server.requests) == 1


async def test_anthropic_tool_use_reaches_the_gate_and_runs(
    tmp_path: Path, model_server: Any
) -> None:
    model_server.answer(anthropic_tool_use("lookup", {"word": "hello"}))
    model_server.answer(anthropic_text("Hello is a greeting."))

    result, _store, tool = await drive(tmp_path, agent(model_server))

    assert result.status is RunStatus.COMPLETED
    assert [call.args for call in tool.calls] == [canonical_json({"word": "hello"})]
    second = model_server.requests[1].json()["messages"]
    assert second[-1]["content"][0]["type"] == "tool_result"
