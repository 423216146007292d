"""A call's channels travel in one explicit `CallContext`: handed to `Gate.step`, carried
to the server's tool, and given each message by the request whose read or stream
delivered it, never by whichever task happens to be reading."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from servers.harness import hostile_http

from agentrt import Decision, SideEffect, open_store
from agentrt.gate import Gate
from agentrt.mcp import AskRefused, CallContext, Rule, Server, load, pin
from agentrt.mcp._connection import connect

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

HOSTILE = Path(__file__).parent / "servers" / "hostile_stdio.py"

_LOG_LINE = (
    '{"jsonrpc":"2.0","method":"notifications/message",'
    '"params":{"level":"info","logger":"svc","data":"working"}}'
)
# The connection's first progress token is agentrt-1.
_PROGRESS_LINE = (
    '{"jsonrpc":"2.0","method":"notifications/progress",'
    '"params":{"progressToken":"agentrt-1","progress":1,"total":2,"message":"half"}}'
)


class _Heard:
    """Everything one call's context was handed."""

    def __init__(self, *, refuse_with: int = -32042) -> None:
        self.refuse_with = refuse_with
        self.asked: list[tuple[str, Any]] = []
        self.logged: list[tuple[str, str | None, Any]] = []
        self.progress: list[tuple[float, float | None, str | None]] = []
        self.runs: list[str] = []

    async def ask(self, method: str, params: Any) -> Any:
        self.asked.append((method, params))
        raise AskRefused(self.refuse_with, "not now")

    async def log(self, level: str, logger: str | None, data: Any) -> None:
        self.logged.append((level, logger, data))

    async def on_progress(self, value: float, total: float | None, text: str | None) -> None:
        self.progress.append((value, total, text))

    def context(self) -> CallContext:
        return CallContext(
            progress=self.on_progress, log=self.log, ask=self.ask, on_run=self.runs.append
        )


def _asking_server() -> Server:
    scenario = {
        "pages": {
            "": json.dumps(
                {
                    "tools": [
                        {"name": "ask", "description": "Asks.", "inputSchema": {"type": "object"}}
                    ]
                }
            )
        },
        "calls": {"ask": {"before": [_LOG_LINE, _PROGRESS_LINE], "elicit": True}},
    }
    return Server(
        name="svc",
        command=[sys.executable, str(HOSTILE), json.dumps(scenario)],
        default_timeout=10.0,
        client_capabilities={"elicitation": {}},
    )


async def test_a_library_user_answers_a_servers_request_through_the_steps_call_context(
    tmp_path: Path,
) -> None:
    server = _asking_server()
    rules = {"ask": Rule(side_effect=SideEffect.READ_ONLY)}
    tools, report = await load(server, await pin(server), rules)
    heard = _Heard()
    try:
        with open_store(tmp_path / "runs.db") as store:
            gate = Gate(store, tools)
            run_id = await gate.start("ask")
            outcome = await gate.step(
                run_id, Decision.tool_call("svc_ask", "{}"), context=heard.context()
            )
    finally:
        assert report.connection is not None
        await report.connection.aclose()
    assert outcome.observation is not None
    assert "elicitation answered with error -32042" in outcome.observation.content
    assert [method for method, _params in heard.asked] == ["elicitation/create"]
    assert heard.asked[0][1]["message"] == "Your password?"
    assert heard.logged == [("info", "svc", "working")]
    assert heard.progress == [(1.0, 2.0, "half")]
    assert heard.runs == [run_id]


def _called(log: Path) -> list[str]:
    """The tools called so far, from the server's request log."""
    if not log.exists():
        return []
    complete = log.read_text().split("\n")[:-1]  # a line still being written is left
    bodies = [json.loads(json.loads(line)["body"] or "{}") for line in complete]
    return [body["params"]["name"] for body in bodies if body.get("method") == "tools/call"]


async def test_over_http_a_request_on_one_calls_stream_reaches_only_that_calls_context(
    tmp_path: Path,
) -> None:
    # Two calls with askers in flight: on stdio the server's request would be refused as
    # ambiguous; over HTTP it arrived on one call's stream, and goes to that call's context.
    log = tmp_path / "requests.jsonl"
    scenario = {
        "mode": "sse",
        "log": str(log),
        "calls": {"ask": {"before": [_LOG_LINE], "elicit": True}, "wait": {"never": True}},
    }
    asking, waiting = _Heard(refuse_with=-32042), _Heard(refuse_with=-32099)
    with hostile_http(scenario) as url:
        connection = await connect(Server(name="remote", endpoint=url))
        try:
            async with anyio.create_task_group() as group:

                async def wait_call() -> None:
                    await connection.call_tool("wait", "{}", timeout=30, context=waiting.context())

                group.start_soon(wait_call)
                with anyio.fail_after(10):
                    while "wait" not in _called(log):
                        await anyio.sleep(0.02)
                result = await connection.call_tool(
                    "ask", "{}", timeout=10, context=asking.context()
                )
                group.cancel_scope.cancel()
        finally:
            await connection.aclose()
    assert result["content"][0]["text"] == "elicitation answered with error -32042"
    assert [method for method, _params in asking.asked] == ["elicitation/create"]
    assert asking.logged == [("info", "svc", "working")]
    assert waiting.asked == [] and waiting.logged == []
