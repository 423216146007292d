"""A live agent: a real model counts the words in the demo sandbox's text files, under a policy
where the first change asks a person and the policy's grant covers the later ones.

    python examples/live/live.py --model anthropic:claude-sonnet-4-5
    python examples/live/live.py --resume RUN          # after `agentrt --db DB approve RUN`

The model reads each `*.txt` file of the sandbox through the stock filesystem
server (pinned in examples/filesystem), writes each file's count to
`counts/NAME.count` and ends with the terminal tool `finish`, naming the total.
Reads run; the first write of a run waits for a person (`agentrt approve`); once
a person approved a write, the policy allows the run's later writes of the same
tool for GRANT_MINUTES — the policy's grant, recorded like every decision.
`--base-url` points the model at any endpoint that speaks its API (a proxy, a
gateway, a local fake); `--resume RUN` continues a run after its approval, in a
new process, with the same database.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import time
from pathlib import Path

from agentrt import (
    ClassPolicy,
    Driver,
    Outcome,
    RunStatus,
    SideEffect,
    ToolCall,
    ToolResult,
    ToolSpec,
    open_store,
)
from agentrt.accounting import ModelLimits
from agentrt.gate import Gate
from agentrt.mcp import Rule, Server, load, pin
from agentrt.policy import PolicyDecision, RunView, ToolRequest
from agentrt.providers import agent_for
from agentrt.store import ApprovalStatus, Store, iso_to_epoch

HERE = Path(__file__).resolve().parent
SERVER_SCRIPT = (
    HERE.parent / "filesystem/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js"
)
GRANT_MINUTES = 10
GOAL = (
    "Count the words in each .txt file directly in {sandbox}. For each file NAME.txt, write "
    "the count (just the number) to {sandbox}/counts/NAME.count with write_file. Then call "
    "finish with the total of all counts."
)
STARTING_FILES = {
    "alpha.txt": "one two three\n",
    "beta.txt": "four five six seven\n",
}
RULES = {
    "list_directory": Rule(side_effect=SideEffect.READ_ONLY),
    "read_text_file": Rule(side_effect=SideEffect.READ_ONLY),
    "write_file": Rule(side_effect=SideEffect.LOCAL_MUTATION, allow_hint_mismatch=True),
}


class Finish:
    """The terminal tool: the run completes with the total the model names."""

    spec = ToolSpec(
        name="finish",
        description="Finish the task, naming the total word count.",
        input_schema={
            "type": "object",
            "properties": {"total": {"type": "integer", "minimum": 0}},
            "required": ["total"],
            "additionalProperties": False,
        },
        side_effect=SideEffect.READ_ONLY,
        timeout=5.0,
        terminal=True,
    )

    async def call(self, call: ToolCall) -> ToolResult:
        total = json.loads(call.args)["total"]
        return ToolResult(json.dumps({"total": total}), f"finished: {total} words")


class FirstChangeAsks:
    """Reads run.  A change waits for a person, unless a person approved a change with the same
    tool in this run less than `minutes` ago: then the policy's grant lets it run."""

    id = "examples/live first-change-asks v1"

    def __init__(self, store: Store, minutes: float) -> None:
        self._store = store
        self._seconds = minutes * 60
        self._asks = ClassPolicy(
            {
                SideEffect.READ_ONLY: Outcome.ALLOW,
                SideEffect.LOCAL_MUTATION: Outcome.REQUIRE_APPROVAL,
            }
        )

    async def evaluate(self, request: ToolRequest, run: RunView) -> PolicyDecision:
        if request.spec.side_effect is SideEffect.LOCAL_MUTATION:
            latest = self._store.latest_approval(run.run_id)
            if (
                latest is not None
                and latest.tool == request.spec.name
                and latest.status in (ApprovalStatus.APPROVED, ApprovalStatus.USED)
                and latest.decided_at is not None
                and time.time() - iso_to_epoch(latest.decided_at) < self._seconds
            ):
                return PolicyDecision.allow(
                    f"covered by approval {latest.approval_id} (granted for {GRANT_MINUTES} min)"
                )
        return await self._asks.evaluate(request, run)


def _sandbox(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    for name, text in STARTING_FILES.items():
        if not (path / name).exists():
            (path / name).write_text(text, encoding="utf-8")
    (path / "counts").mkdir(exist_ok=True)
    return path.resolve()


async def main(arguments: argparse.Namespace) -> int:
    node = shutil.which("node")
    if node is None or not SERVER_SCRIPT.exists():
        print("live: needs node and examples/filesystem installed (make demo)", file=sys.stderr)
        return 2
    sandbox = _sandbox(Path(arguments.sandbox))
    server = Server(
        name="fs", command=[node, str(SERVER_SCRIPT), str(sandbox)], default_timeout=30.0
    )
    manifest = await pin(server)
    tools, report = await load(server, manifest, RULES)
    agent = agent_for(arguments.model, base_url=arguments.base_url)
    try:
        with open_store(arguments.db) as store:
            gate = Gate(store, [*tools, Finish()], policy=FirstChangeAsks(store, GRANT_MINUTES))
            driver = Driver(gate, agent, limits=ModelLimits(max_model_calls=30))
            if arguments.resume:
                result = await driver.resume(arguments.resume)
            else:
                result = await driver.run(GOAL.format(sandbox=sandbox))
    finally:
        if report.connection is not None:
            await report.connection.aclose()
    if result.status is RunStatus.WAITING_FOR_APPROVAL and result.approval is not None:
        print(f"run {result.run_id} waits for a person: {result.approval.tool} "
              f"{result.approval.args}")  # fmt: skip
        print(f"  approve:  agentrt --db {arguments.db} approve {result.run_id}")
        print(f"  continue: python {Path(__file__).name} --db {arguments.db} "
              f"--resume {result.run_id} --model {arguments.model}")  # fmt: skip
        return 0
    print(f"run {result.run_id} {result.status}: {result.result or result.reason}")
    return 0 if result.status is RunStatus.COMPLETED else 1


def _arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="anthropic:claude-sonnet-4-5",
                        help="ollama:NAME, openai:NAME or anthropic:NAME")  # fmt: skip
    parser.add_argument("--base-url", default=None, help="the model's endpoint, if not its own")
    parser.add_argument("--db", default="live.db", help="the run's database (SQLite file)")
    parser.add_argument("--sandbox", default=os.path.join("live-sandbox"),
                        help="the directory the server may read and write")  # fmt: skip
    parser.add_argument("--resume", metavar="RUN", help="continue this run after its approval")
    return parser.parse_args(argv)


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main(_arguments(sys.argv[1:]))))
