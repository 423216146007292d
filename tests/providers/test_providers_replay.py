"""A recorded run's model answers replayed byte for byte: the same decisions, the same usage,
no model; an altered recording refused; a replay that runs out told so."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from api_formats import anthropic_text, anthropic_tool_use, openai_completion

from agentrt import Driver, Gate, RunStatus, open_store
from agentrt.accounting import PriceTable, list_attempts, recorded_replies
from agentrt.providers import (
    AnthropicAgent,
    OpenAIAgent,
    ProviderError,
    RetryPolicy,
    replay_client,
)
from agentrt.tools import SideEffect, ToolCall, ToolResult, ToolSpec

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

FAST = RetryPolicy(max_attempts=3, initial_delay=0.05, max_delay=0.1)
FREE = PriceTable(unknown_is_free=True)
NOWHERE = "http://127.0.0.1:9"  # a replay reaches no endpoint


class Counter:
    spec = ToolSpec(
        name="count",
        description="Count the words of a text.",
        input_schema={"type": "object", "properties": {"text": {"type": "string"}}},
        side_effect=SideEffect.READ_ONLY,
        timeout=5.0,
    )

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def call(self, call: ToolCall) -> ToolResult:
        self.calls.append(call.args)
        words = len(json.loads(call.args).get("text", "").split())
        return ToolResult(json.dumps({"words": words}), "counted")


async def _record(database: Path, model_server: Any) -> tuple[str, list[bytes], Counter]:
    answers = [
        anthropic_tool_use("count", {"text": "one two three"}),
        anthropic_tool_use("count", {"text": "four five"}),
        anthropic_text("5 words in all"),
    ]
    model_server.answer({"error": {"type": "overloaded_error", "message": "busy"}}, status=529)
    for answer in answers:
        model_server.answer(answer)
    agent = AnthropicAgent(
        "claude-fake", base_url=model_server.url, api_key="k", retry=FAST, record_replies=True
    )
    tool = Counter()
    with open_store(database) as store:
        result = await Driver(Gate(store, [tool]), agent, prices=FREE).run("Count the words.")
    assert result.status is RunStatus.COMPLETED
    return result.run_id, [json.dumps(answer).encode() for answer in answers], tool


async def test_a_recorded_run_replays_byte_for_byte_without_a_model(
    tmp_path: Path, model_server: Any
) -> None:
    recorded = tmp_path / "recorded.db"
    run_id, sent, tool = await _record(recorded, model_server)
    with open_store(recorded) as store:
        bodies = [reply.body for reply in recorded_replies(store, run_id)]
        original = list_attempts(store, run_id)
        factory = replay_client(store, run_id)
    # Kept exactly as the endpoint sent them (the failed attempt has no body to keep).
    assert bodies == sent
    model_server.close()  # from here on, no model is reachable

    replayed_tool = Counter()
    agent = AnthropicAgent(
        "claude-fake", base_url="http://127.0.0.1:9", http_client_factory=factory
    )
    with open_store(tmp_path / "replayed.db") as store:
        replayed = await Driver(Gate(store, [replayed_tool]), agent, prices=FREE).run(
            "Count the words."
        )
        attempts = list_attempts(store, replayed.run_id)
        result = store.get_run(replayed.run_id).result
    assert replayed.status is RunStatus.COMPLETED
    assert result == "5 words in all"
    # The same steps, with the same arguments, and the same books for every answer.
    assert replayed_tool.calls == tool.calls == ['{"text":"one two three"}', '{"text":"four five"}']
    answered = [attempt for attempt in original if attempt.outcome == "ok"]
    assert [(a.step, a.usage, a.stop_reason) for a in attempts] == [
        (a.step, a.usage, a.stop_reason) for a in answered
    ]


async def test_without_record_replies_nothing_is_kept_and_replay_is_refused(
    tmp_path: Path, model_server: Any
) -> None:
    model_server.answer(openai_completion({"content": "nothing to count"}))
    agent = OpenAIAgent("m", base_url=model_server.url, retry=FAST)
    with open_store(tmp_path / "runs.db") as store:
        result = await Driver(Gate(store, [Counter()]), agent, prices=FREE).run("Count.")
        assert recorded_replies(store, result.run_id) == []
        with pytest.raises(ProviderError, match="has no recorded model answers to replay"):
            replay_client(store, result.run_id)
        events = store.list_events(result.run_id, limit=100)
    assert all("reply_sha256" not in event.payload for event in events)


async def test_an_altered_recording_is_refused_before_anything_is_replayed(
    tmp_path: Path, model_server: Any
) -> None:
    recorded = tmp_path / "recorded.db"
    run_id, sent, _ = await _record(recorded, model_server)
    forged = sent[1].replace(b"four five", b"rm -rf /")
    with open_store(recorded) as store:
        with store.transaction() as connection:
            connection.execute(
                "UPDATE model_attempts SET reply = ? WHERE run_id = ? AND step = 2 AND reply"
                " IS NOT NULL",
                (forged.decode(), run_id),
            )
        with pytest.raises(ProviderError) as refused:
            replay_client(store, run_id)
    assert str(refused.value) == (
        f"the recorded answer of run {run_id} step 2 attempt 1 does not match the hash its "
        "event holds; the recording was altered and is not replayed"
    )
    assert hashlib.sha256(sent[1]).hexdigest() != hashlib.sha256(forged).hexdigest()


async def test_a_replay_that_runs_out_of_answers_says_so_and_runs_nothing_more(
    tmp_path: Path, model_server: Any
) -> None:
    recorded = tmp_path / "recorded.db"
    run_id, _, _ = await _record(recorded, model_server)
    with open_store(recorded) as store:
        factory = replay_client(store, run_id)
    agent = AnthropicAgent(
        "claude-fake", base_url="http://127.0.0.1:9", http_client_factory=factory
    )
    tool = Counter()
    with open_store(tmp_path / "replayed.db") as store:
        driver = Driver(Gate(store, [tool]), agent, prices=FREE)
        first = await driver.run("Count the words.")
        assert first.status is RunStatus.COMPLETED
        with pytest.raises(ProviderError, match="has no answer left for request 4"):
            await driver.run("Count again.")
    assert len(tool.calls) == 2
