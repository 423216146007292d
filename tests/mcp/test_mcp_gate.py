"""A server's tools inside the Gate: a server failure is a tool error the agent sees, never an
abort; a terminal rule completes the run; a denied parameter fails the call, not the run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from agentrt import Decision, SideEffect, open_store
from agentrt.gate import Gate
from agentrt.mcp import Rule, Server, load, pin
from agentrt.store import RunStatus

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

HOSTILE = Path(__file__).parent / "servers" / "hostile_stdio.py"

_SCENARIO = {
    "pages": {
        "": json.dumps(
            {
                "tools": [
                    {"name": "fail", "description": "Fails.", "inputSchema": {"type": "object"}},
                    {
                        "name": "finish",
                        "description": "Finishes.",
                        "inputSchema": {
                            "type": "object",
                            "properties": {"answer": {"type": "string"}, "force": {}},
                        },
                    },
                ]
            }
        )
    },
    "calls": {
        "fail": {"result": '{"content":[{"type":"text","text":"quota exceeded"}],"isError":true}'},
        "finish": {"result": '{"content":[{"type":"text","text":"done: 42"}]}'},
    },
}

RULES = {
    "fail": Rule(side_effect=SideEffect.READ_ONLY),
    "finish": Rule(side_effect=SideEffect.READ_ONLY, terminal=True, deny=["force"]),
}


async def test_server_errors_are_tool_errors_and_a_terminal_rule_completes_the_run(
    tmp_path: Path,
) -> None:
    server = Server(
        name="svc",
        command=[sys.executable, str(HOSTILE), json.dumps(_SCENARIO)],
        default_timeout=5.0,
    )
    tools, report = await load(server, await pin(server), RULES)
    try:
        with open_store(tmp_path / "runs.db") as store:
            gate = Gate(store, tools)
            run_id = await gate.start("answer")

            failed = await gate.step(run_id, Decision.tool_call("svc_fail", "{}"))
            assert failed.status is RunStatus.RUNNING
            assert failed.observation is not None
            assert failed.observation.kind == "tool_error"
            assert 'server "svc"' in failed.observation.content
            assert "quota exceeded" in failed.observation.content

            # "force" is hidden; without additionalProperties: false the schema lets it
            # through, and the tool refuses it rather than passing it on.
            forced = await gate.step(
                run_id, Decision.tool_call("svc_finish", '{"answer": "x", "force": true}')
            )
            assert forced.status is RunStatus.RUNNING
            assert forced.observation is not None
            assert forced.observation.kind == "tool_error"
            assert '"force" is denied' in forced.observation.content

            finished = await gate.step(run_id, Decision.tool_call("svc_finish", '{"answer": "x"}'))
            assert finished.status is RunStatus.COMPLETED
            assert json.loads(store.get_run(run_id).result or "null") == "done: 42"
    finally:
        assert report.connection is not None
        await report.connection.aclose()
