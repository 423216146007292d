"""A Driver run stops on each spending limit, checked before the model is asked again."""

from __future__ import annotations

import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import anyio
import pytest
from api_formats import anthropic_error, anthropic_text, anthropic_tool_use

from agentrt import Driver, Gate, Limits, RunStatus, approve, open_store
from agentrt.accounting import ModelLimits, Price, PriceTable, PriceUnknown, list_attempts
from agentrt.agent import Decision
from agentrt.policy import ClassPolicy, Outcome
from agentrt.providers import AnthropicAgent, RetryPolicy, ScriptedAgent
from agentrt.tools import SideEffect, ToolCall, ToolResult, ToolSpec

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(40)]

FAST = RetryPolicy(max_attempts=3, initial_delay=0.05, max_delay=0.1)
PRICED = PriceTable({"anthropic:claude-fake": Price(Decimal("3"), Decimal("15"))})


class Note:
    """A tool with a side effect class chosen by the test."""

    def __init__(self, side_effect: SideEffect = SideEffect.READ_ONLY) -> None:
        self.spec = ToolSpec(
            name="note",
            description="Take a note.",
            input_schema={"type": "object", "properties": {"n": {"type": "integer"}}},
            side_effect=side_effect,
            timeout=5.0,
        )
        self.calls: list[ToolCall] = []

    async def call(self, call: ToolCall) -> ToolResult:
        self.calls.append(call)
        return ToolResult(f'{{"noted":{len(self.calls)}}}', "noted")


def keep_calling(server: Any, times: int) -> None:
    # Different arguments each time, so loop detection never steps in first.
    for index in range(times):
        server.answer(anthropic_tool_use("note", {"n": index}))


def setup(tmp_path: Path, server: Any, **driver_kwargs: Any) -> tuple[Driver, Any, Note]:
    store = open_store(tmp_path / "agentrt.db")
    tool = Note(driver_kwargs.pop("side_effect", SideEffect.READ_ONLY))
    gate = Gate(
        store,
        [tool],
        policy=ClassPolicy(
            {
                SideEffect.READ_ONLY: Outcome.ALLOW,
                SideEffect.LOCAL_MUTATION: Outcome.REQUIRE_APPROVAL,
            }
        ),
        limits=driver_kwargs.pop("gate_limits", Limits()),
    )
    agent = AnthropicAgent("claude-fake", base_url=server.url, retry=FAST)
    driver_kwargs.setdefault("prices", PRICED)
    return Driver(gate, agent, **driver_kwargs), store, tool


def limit_events(store: Any, run_id: str) -> list[str]:
    return [
        e.payload["limit"] for e in store.list_events(run_id) if e.type == "model_limit_reached"
    ]


async def test_model_call_limit_ends_the_run_before_the_next_call(
    tmp_path: Path, model_server: Any
) -> None:
    keep_calling(model_server, 5)
    driver, store, tool = setup(tmp_path, model_server, limits=ModelLimits(max_model_calls=2))

    result = await driver.run("Take notes.")

    assert (result.status, result.reason) == (RunStatus.FAILED, "model_call_limit")
    assert len(model_server.requests) == 2
    assert len(tool.calls) == 2
    assert limit_events(store, result.run_id) == ["model_call_limit"]


async def test_token_limit_ends_the_run_before_the_next_call(
    tmp_path: Path, model_server: Any
) -> None:
    keep_calling(model_server, 5)  # each reply: 120 in + 30 out = 150 tokens
    driver, store, _ = setup(tmp_path, model_server, limits=ModelLimits(max_tokens=300))

    result = await driver.run("Take notes.")

    assert (result.status, result.reason) == (RunStatus.FAILED, "token_limit")
    assert len(model_server.requests) == 2
    assert sum(a.charged_tokens for a in list_attempts(store, result.run_id)) == 300


async def test_cost_limit_ends_the_run_before_the_next_call(
    tmp_path: Path, model_server: Any
) -> None:
    keep_calling(model_server, 5)  # each reply: 120 * $3/M + 30 * $15/M = $0.00081
    limits = ModelLimits(max_cost=Decimal("0.0016"))
    driver, store, _ = setup(tmp_path, model_server, limits=limits)

    result = await driver.run("Take notes.")

    assert (result.status, result.reason) == (RunStatus.FAILED, "cost_limit")
    assert len(model_server.requests) == 2
    costs = [a.cost for a in list_attempts(store, result.run_id)]
    assert costs == [Decimal("0.00081"), Decimal("0.00081")]


async def test_ambiguous_attempt_is_charged_its_full_budget_against_the_token_limit(
    tmp_path: Path, model_server: Any
) -> None:
    model_server.answer(drop=True)
    keep_calling(model_server, 3)
    driver, _store, tool = setup(tmp_path, model_server, limits=ModelLimits(max_tokens=4096))

    result = await driver.run("Take notes.")

    # The dropped attempt alone is charged past 4096 (its request bytes + 4096 output).
    assert (result.status, result.reason) == (RunStatus.FAILED, "token_limit")
    assert len(model_server.requests) == 1
    assert tool.calls == []


async def test_a_cost_limit_with_an_unknown_price_refuses_to_dispatch(
    tmp_path: Path, model_server: Any
) -> None:
    keep_calling(model_server, 1)
    driver, store, _ = setup(
        tmp_path, model_server, limits=ModelLimits(max_cost=Decimal("1")), prices=PriceTable({})
    )

    with pytest.raises(PriceUnknown, match="the price of anthropic model 'claude-fake' is unknown"):
        await driver.run("Take notes.")

    assert model_server.requests == []
    (run,) = store.list_runs()
    assert run.status is RunStatus.RUNNING


async def test_an_unknown_price_declared_free_costs_zero(tmp_path: Path, model_server: Any) -> None:
    model_server.answer(anthropic_text("done"))
    driver, store, _ = setup(
        tmp_path,
        model_server,
        limits=ModelLimits(max_cost=Decimal("0.01")),
        prices=PriceTable({}, unknown_is_free=True),
    )

    result = await driver.run("Take notes.")

    assert result.status is RunStatus.COMPLETED
    assert [a.cost for a in list_attempts(store, result.run_id)] == [Decimal(0)]


async def test_active_time_limit_ends_the_run(tmp_path: Path, model_server: Any) -> None:
    for index in range(5):
        model_server.answer(anthropic_tool_use("note", {"n": index}), delay=0.4)
    driver, _, _ = setup(tmp_path, model_server, limits=ModelLimits(max_active_time=1.0))

    result = await driver.run("Take notes.")

    assert (result.status, result.reason) == (RunStatus.FAILED, "active_time")
    # The limit ended it, not the script: at least one 0.4 s request fits in
    # the second, and the fifth was never asked (on a loaded machine the
    # overhead around each request can make the first already pass 1 s).
    assert 1 <= len(model_server.requests) <= 4


async def test_active_time_excludes_the_wait_for_an_approval(
    tmp_path: Path, model_server: Any
) -> None:
    model_server.answer(anthropic_tool_use("note", {"n": 1}))
    model_server.answer(anthropic_text("done"))
    driver, store, tool = setup(
        tmp_path,
        model_server,
        side_effect=SideEffect.LOCAL_MUTATION,
        limits=ModelLimits(max_active_time=1.5),
    )
    paused = await driver.run("Take a note.")
    assert paused.status is RunStatus.WAITING_FOR_APPROVAL
    await anyio.sleep(2.0)  # longer than the limit, but waiting, not working
    approval = paused.approval
    assert approval is not None
    approve(store, paused.run_id, approval_hash=approval.approval_hash, by="test")

    result = await driver.resume(paused.run_id)

    assert result.status is RunStatus.COMPLETED, result.reason
    assert len(tool.calls) == 1


async def test_active_time_applies_to_an_agent_without_a_model(tmp_path: Path) -> None:
    store = open_store(tmp_path / "agentrt.db")
    tool = Note()

    async def slow(step_input: Any) -> Decision:
        await anyio.sleep(0.3)
        return Decision.tool_call("note", f'{{"n":{len(step_input.history)}}}')

    driver = Driver(
        Gate(store, [tool]), ScriptedAgent(slow), limits=ModelLimits(max_active_time=0.5)
    )

    result = await driver.run("Take notes.")

    assert (result.status, result.reason) == (RunStatus.FAILED, "active_time")
    assert 1 <= len(tool.calls) <= 3


async def test_retries_stop_at_the_runs_deadline(tmp_path: Path, model_server: Any) -> None:
    model_server.answer(
        anthropic_error("rate_limit_error", "wait"), status=429, headers={"Retry-After": "5"}
    )
    driver, store, _ = setup(tmp_path, model_server, gate_limits=Limits(deadline=2.0))
    started = time.monotonic()

    result = await driver.run("Take notes.")

    # Waiting 5 s would cross the 2 s deadline: the run ends now, not after a futile wait.
    assert (result.status, result.reason) == (RunStatus.FAILED, "deadline")
    assert time.monotonic() - started < 2.0
    assert len(model_server.requests) == 1
    assert len(list_attempts(store, result.run_id)) == 1
    (event,) = [e for e in store.list_events(result.run_id) if e.type == "model_limit_reached"]
    assert "no retry: the run's time runs out first" in event.payload["detail"]
