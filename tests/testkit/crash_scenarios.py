"""Scenarios for the crash-and-resume harness: a run that sends two mails through the Gate.

`careful` resumes as agentrt means it: the Driver resumes the run, and a cut-off
send waits for a person, who (having checked the outbox) rejects a second try.
`careless` resumes by hand: it sends every mail whose result the store lacks,
so a crash after a send and before its record sends that mail twice.
"""

from __future__ import annotations

import json
from pathlib import Path

import anyio

from agentrt import (
    ClassPolicy,
    Decision,
    Driver,
    Outcome,
    RunStatus,
    SideEffect,
    StepInput,
    ToolCall,
    ToolResult,
    ToolSpec,
    open_store,
)
from agentrt.approvals import reject
from agentrt.driver import RunResult
from agentrt.errors import RunLeased
from agentrt.gate import Gate

RUN = "mail-run"
RECIPIENTS = ("ann", "bob")
POLICY = ClassPolicy({SideEffect.REMOTE_MUTATION: Outcome.ALLOW})


class Mailer:
    """Sends a mail: its one side effect is a line in the effects file (not idempotent)."""

    spec = ToolSpec(
        name="send_mail",
        description="Send a mail.",
        input_schema={"type": "object", "properties": {"to": {"type": "string"}}},
        side_effect=SideEffect.REMOTE_MUTATION,
        timeout=5.0,
    )

    def __init__(self, effects: str) -> None:
        self.effects = Path(effects)

    async def call(self, call: ToolCall) -> ToolResult:
        send(self.effects, json.loads(call.args)["to"])
        return ToolResult('{"sent":true}', "sent")


def send(effects: Path, to: str) -> None:
    with effects.open("a", encoding="utf-8") as log:
        log.write(f"mail to {to}\n")


class Sender:
    """Sends to each recipient its history has not seen a call for, then completes."""

    async def decide(self, step_input: StepInput) -> Decision:
        called = {json.loads(o.args).get("to") for o in step_input.history if o.tool == "send_mail"}
        for to in RECIPIENTS:
            if to not in called:
                return Decision.tool_call("send_mail", json.dumps({"to": to}))
        return Decision.complete("both sent")


async def careful(database: str, effects: str, resume: bool) -> None:
    with open_store(database) as store:
        # A resume waits out the killed process's lease (most points), so the lease is short;
        # not shorter, as its heartbeat (a write, so a crash point) must not beat during the
        # run (a tenth of a second between taking the lease and the end): every run makes
        # the same writes, and each is killed at.
        gate = Gate(store, [Mailer(effects)], policy=POLICY, lease_ttl=1.0)
        driver = Driver(gate, Sender())
        if not resume:
            await driver.run("send two mails", run_id=RUN)
            return
        if store.count_runs() == 0:
            return  # killed before the run was recorded: nothing to resume
        if store.get_run(RUN).status.terminal:
            return  # killed after its last write: nothing left to do
        result = await _resume(driver)
        while result.status is RunStatus.WAITING_FOR_APPROVAL:
            # The send was cut off; the person checks the outbox and refuses a second try.
            assert result.approval is not None
            reject(store, RUN, approval_hash=result.approval.approval_hash, by="person",
                   note="already sent")  # fmt: skip
            if store.get_run(RUN).status.terminal:
                return  # a refused interrupted action ends the run
            result = await _resume(driver)


async def _resume(driver: Driver) -> RunResult:
    # The killed process still holds the run's lease until it expires (lease_ttl).
    for _ in range(100):
        try:
            return await driver.resume(RUN)
        except RunLeased:
            await anyio.sleep(0.1)
    return await driver.resume(RUN)


async def careless(database: str, effects: str, resume: bool) -> None:
    if not resume:
        await careful(database, effects, resume)
        return
    with open_store(database) as store:
        done = set()
        if store.count_runs():
            done = {
                json.loads(step.args)["to"]
                for step in store.list_steps(RUN)
                if step.tool == "send_mail" and str(step.status) == "succeeded"
            }
    for to in RECIPIENTS:
        if to not in done:
            send(Path(effects), to)


async def idle(database: str, effects: str, resume: bool) -> None:
    """A scenario that never writes: the harness has no point to crash it at."""
