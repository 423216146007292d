"""A process that starts a run, calls a mutating tool, and is killed (-9) inside the call.

python reconcile_child.py DATABASE EFFECTS TOOL_NAME TERMINAL: the tool appends its effect to
EFFECTS, writes EFFECTS + ".started", and then waits to be killed.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import anyio

from agentrt import (
    ClassPolicy,
    Decision,
    Outcome,
    SideEffect,
    ToolCall,
    ToolResult,
    ToolSpec,
    open_store,
)
from agentrt.gate import Gate

RUN = "reconcile-run"


class Sender:
    def __init__(self, name: str, effects: Path, terminal: bool) -> None:
        self.spec = ToolSpec(name, "Send a mail.", {"type": "object"},
                             SideEffect.REMOTE_MUTATION, 30.0, terminal=terminal)  # fmt: skip
        self.effects = effects

    async def call(self, call: ToolCall) -> ToolResult:
        with self.effects.open("a", encoding="utf-8") as log:
            log.write("mail sent\n")
        Path(f"{self.effects}.started").write_text("yes")
        time.sleep(60)  # killed here, after the effect and before its result is recorded
        return ToolResult('{"sent":true}', "sent")


async def main(database: str, effects: str, name: str, terminal: bool) -> None:
    tool = Sender(name, Path(effects), terminal)
    policy = ClassPolicy({SideEffect.REMOTE_MUTATION: Outcome.ALLOW})
    with open_store(database) as store:
        gate = Gate(store, [tool], policy=policy, lease_ttl=1.0)
        await gate.start("send a mail", run_id=RUN)
        await gate.step(RUN, Decision.tool_call(name, "{}"))


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "terminal")
