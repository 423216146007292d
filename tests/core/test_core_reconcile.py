"""Reconcile: a consumer's hook settles a mutation whose process was killed (-9) mid-call,
before the gate would pause on it; the gate never runs the action again by itself."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest

from agentrt import (
    ClassPolicy,
    Decision,
    Outcome,
    RunStatus,
    SideEffect,
    ToolCall,
    ToolResult,
    ToolSpec,
    open_store,
)
from agentrt.errors import RunLeased
from agentrt.gate import INTERRUPTED_SIDE_EFFECT, Gate, Interrupted, Reconciliation, StepOutcome
from agentrt.store import StepStatus

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

CHILD = Path(__file__).parent / "reconcile_child.py"
RUN = "reconcile-run"
POLICY = ClassPolicy({SideEffect.REMOTE_MUTATION: Outcome.ALLOW})


class Sender:
    """The heir's copy of the tool: counts the calls the heir itself makes."""

    def __init__(self, effects: Path, terminal: bool = False, timeout: float = 5.0) -> None:
        self.spec = ToolSpec("send", "Send a mail.", {"type": "object"},
                             SideEffect.REMOTE_MUTATION, timeout, terminal=terminal)  # fmt: skip
        self.effects = effects
        self.calls = 0

    async def call(self, call: ToolCall) -> ToolResult:
        self.calls += 1
        with self.effects.open("a", encoding="utf-8") as log:
            log.write("mail sent\n")
        return ToolResult('{"sent":true}', "sent")


def _killed_mid_call(tmp_path: Path, terminal: bool = False) -> tuple[Path, Path]:
    database, effects = tmp_path / "runs.db", tmp_path / "effects.log"
    child = subprocess.Popen(
        [sys.executable, str(CHILD), str(database), str(effects), "send",
         "terminal" if terminal else "plain"],
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    started = Path(f"{effects}.started")
    deadline = time.monotonic() + 30
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert started.exists()
    return database, effects


async def _resume(gate: Gate) -> StepOutcome:
    for _ in range(100):  # the killed process's lease lapses after its lease_ttl (1 s)
        try:
            return await gate.resume(RUN)
        except RunLeased:
            await anyio.sleep(0.05)
    return await gate.resume(RUN)


def _reconciled_events(database: Path) -> list[dict[str, object]]:
    with open_store(database) as store:
        return [e.payload for e in store.list_events(RUN, limit=100) if e.type == "step_reconciled"]


async def test_a_hook_that_finds_the_action_done_records_it_ran_and_nothing_runs_again(
    tmp_path: Path,
) -> None:
    database, effects = _killed_mid_call(tmp_path)
    asked: list[Interrupted] = []

    async def look(call: Interrupted) -> Reconciliation:
        asked.append(call)
        if effects.read_text().count("mail sent") == 1:
            return Reconciliation.ran(ToolResult('{"sent":true,"found":"outbox"}', "in the outbox"),
                                      "found in the outbox")  # fmt: skip
        return Reconciliation.unknown()

    tool = Sender(effects)
    with open_store(database) as store:
        gate = Gate(store, [tool], policy=POLICY, reconcile=look)
        outcome = await _resume(gate)
        assert outcome.status is RunStatus.RUNNING and outcome.reason == "reconciled"
        assert outcome.observation is not None and outcome.observation.kind == "result"
        assert json.loads(outcome.observation.content) == {"sent": True, "found": "outbox"}
        (step,) = store.list_steps(RUN)
        assert step.status is StepStatus.SUCCEEDED
        finished = await gate.step(RUN, Decision.complete("sent"))
        store.verify_chain()
    assert finished.status is RunStatus.COMPLETED
    assert [(a.run_id, a.step, a.tool, a.args) for a in asked] == [(RUN, 1, "send", "{}")]
    assert tool.calls == 0 and effects.read_text().count("mail sent") == 1
    (event,) = _reconciled_events(database)
    assert event["verdict"] == "ran" and event["note"] == "found in the outbox"


async def test_a_terminal_tool_found_done_completes_the_run_with_the_result_shown(
    tmp_path: Path,
) -> None:
    database, effects = _killed_mid_call(tmp_path, terminal=True)

    async def look(call: Interrupted) -> Reconciliation:
        return Reconciliation.ran(ToolResult('{"sent":true}', "in the outbox"))

    with open_store(database) as store:
        outcome = await _resume(Gate(store, [Sender(effects, terminal=True)], policy=POLICY,
                                     reconcile=look))  # fmt: skip
        run = store.get_run(RUN)
    assert outcome.status is RunStatus.COMPLETED
    assert run.status is RunStatus.COMPLETED and run.result == '{"sent":true}'


async def test_a_hook_that_finds_it_did_not_run_lets_the_agent_ask_again(tmp_path: Path) -> None:
    database, effects = _killed_mid_call(tmp_path)
    effects.write_text("")  # the mail never left: the hook sees an empty outbox

    async def look(call: Interrupted) -> Reconciliation:
        return Reconciliation.did_not_run("the outbox is empty")

    tool = Sender(effects)
    with open_store(database) as store:
        gate = Gate(store, [tool], policy=POLICY, reconcile=look)
        outcome = await _resume(gate)
        assert outcome.status is RunStatus.RUNNING and outcome.reason == "reconciled"
        assert outcome.observation is not None and outcome.observation.kind == "interrupted"
        assert "did not take effect" in outcome.observation.content
        assert tool.calls == 0  # never by itself
        # The agent asks again: a new step, through the policy, runs once.
        again = await gate.step(RUN, Decision.tool_call("send", "{}"))
        steps = store.list_steps(RUN)
        store.verify_chain()
    assert again.observation is not None and again.observation.kind == "result"
    assert tool.calls == 1
    assert [step.status for step in steps] == [StepStatus.INTERRUPTED, StepStatus.SUCCEEDED]
    (event,) = _reconciled_events(database)
    assert event["verdict"] == "did_not_run"


async def _ask(call: Interrupted) -> Reconciliation:
    return Reconciliation.unknown("cannot tell")


async def _raise(call: Interrupted) -> Reconciliation:
    raise ConnectionError("mail server unreachable")


async def _hang(call: Interrupted) -> Reconciliation:
    await anyio.sleep(60)
    raise AssertionError("unreachable")


async def _garbage(call: Interrupted) -> Reconciliation:
    return "yes it ran"  # type: ignore[return-value]


async def _ran_without_json(call: Interrupted) -> Reconciliation:
    return Reconciliation.ran(ToolResult("not json", "?"))


@pytest.mark.parametrize(
    ("hook", "note"),
    [
        (_ask, "cannot tell"),
        (_raise, "the reconcile hook failed: mail server unreachable"),
        (_hang, "the reconcile hook did not answer within 1s"),
        (_garbage, "the reconcile hook answered something other than a verdict"),
        (_ran_without_json, "the reconcile hook's result is not valid JSON"),
    ],
)
async def test_an_unknown_or_unusable_verdict_pauses_the_run_as_without_a_hook(
    tmp_path: Path, hook: object, note: str
) -> None:
    database, effects = _killed_mid_call(tmp_path)
    # The hook is given the tool's timeout to answer: a hanging one is waited for 1 s.
    tool = Sender(effects, timeout=1.0)
    with open_store(database) as store:
        gate = Gate(store, [tool], policy=POLICY, reconcile=hook)  # type: ignore[arg-type]
        outcome = await _resume(gate)
        store.verify_chain()
    assert outcome.status is RunStatus.WAITING_FOR_APPROVAL
    assert outcome.approval is not None and outcome.approval.kind == INTERRUPTED_SIDE_EFFECT
    assert tool.calls == 0
    (event,) = _reconciled_events(database)
    assert event["verdict"] == "unknown" and str(event["note"]).startswith(note)
