"""ScriptedAgent: the deterministic agent the demo uses when no model is configured."""

from __future__ import annotations

import pytest

from agentrt.agent import Agent, Decision, DecisionKind, Observation, StepInput
from agentrt.providers import ScriptedAgent

pytestmark = pytest.mark.anyio


def seen(count: int) -> StepInput:
    history = [Observation(n, "t", "{}", "result", "{}") for n in range(1, count + 1)]
    return StepInput(run_id="r", goal="g", tools=[], history=history)


async def test_scripted_agent_answers_by_the_number_of_observations() -> None:
    script = [Decision.tool_call("t", "{}"), Decision.complete("done")]
    agent = ScriptedAgent(script)

    assert isinstance(agent, Agent)
    assert await agent.decide(seen(0)) == script[0]
    assert await agent.decide(seen(1)) == script[1]
    # A fresh agent for a resumed run picks up where the script left off.
    assert await ScriptedAgent(script).decide(seen(1)) == script[1]


async def test_scripted_agent_past_its_end_fails_the_run() -> None:
    decision = await ScriptedAgent([Decision.complete("x")]).decide(seen(1))

    assert decision.kind is DecisionKind.FAIL
    assert "no step 2" in decision.reason


async def test_scripted_agent_takes_a_sync_or_async_function_of_what_it_sees() -> None:
    def sync(step_input: StepInput) -> Decision:
        return Decision.complete(f"{len(step_input.history)} seen")

    async def asynchronous(step_input: StepInput) -> Decision:
        return Decision.fail(step_input.goal)

    assert await ScriptedAgent(sync).decide(seen(2)) == Decision.complete("2 seen")
    assert await ScriptedAgent(asynchronous).decide(seen(0)) == Decision.fail("g")


async def test_scripted_agent_refuses_a_script_that_is_not_decisions() -> None:
    with pytest.raises(TypeError, match="script step 1 is a str"):
        ScriptedAgent([Decision.complete("x"), "complete"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="returned a str"):
        await ScriptedAgent(lambda _: "nope").decide(seen(0))  # type: ignore[arg-type,return-value]
