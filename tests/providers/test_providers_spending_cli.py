"""The operator sees what a run spent (`agentrt show`, `agentrt runs`), and the demo with Claude."""

from __future__ import annotations

import json
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from api_formats import anthropic_error, anthropic_text, anthropic_tool_use
from click.testing import CliRunner

from agentrt import Driver, Gate, RunStatus, open_store
from agentrt.accounting import Price, PriceTable
from agentrt.cli import cli
from agentrt.demo import INPUT_FILE, OUTPUT_FILE, DemoPaths, default_example_dir
from agentrt.providers import AnthropicAgent, RetryPolicy
from agentrt.tools import SideEffect, ToolCall, ToolResult, ToolSpec

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]

AGENTRT = str(Path(sys.executable).parent / "agentrt")


class Note:
    spec = ToolSpec(
        name="note",
        description="Take a note.",
        input_schema={"type": "object", "properties": {"n": {"type": "integer"}}},
        side_effect=SideEffect.READ_ONLY,
        timeout=5.0,
    )

    async def call(self, call: ToolCall) -> ToolResult:
        return ToolResult('{"noted":true}', "noted")


def agentrt(database: Path, *args: str) -> Any:
    result = CliRunner().invoke(cli, ["--db", str(database), *args])
    assert result.exit_code == 0, result.output
    return result.output


async def test_show_prints_model_calls_tokens_and_cost_and_json_carries_them(
    tmp_path: Path, model_server: Any
) -> None:
    database = tmp_path / "agentrt.db"
    model_server.answer(anthropic_error("rate_limit_error", "slow"), status=429)
    model_server.answer(anthropic_tool_use("note", {"n": 1}))
    model_server.answer(anthropic_text("done"))
    agent = AnthropicAgent(
        "claude-fake", base_url=model_server.url, retry=RetryPolicy(initial_delay=0.05)
    )
    prices = PriceTable({"anthropic:claude-fake": Price(Decimal("3"), Decimal("15"))})
    with open_store(database) as store:
        result = await Driver(Gate(store, [Note()]), agent, prices=prices).run("Take a note.")
    assert result.status is RunStatus.COMPLETED

    text = agentrt(database, "show", result.run_id)
    assert "model calls        3" in text
    assert "240 in, 60 out, 0 cache write, 0 cache read (charged 300)" in text
    assert "cost               $0.0016" in text
    assert "transient_error" in text and "answered 429: slow" in text

    records = [
        json.loads(line) for line in agentrt(database, "--json", "show", result.run_id).splitlines()
    ]
    calls = [r for r in records if r["record"] == "model_call"]
    assert [(c["step"], c["attempt"], c["outcome"]) for c in calls] == [
        (1, 1, "transient_error"),
        (1, 2, "ok"),
        (2, 1, "ok"),
    ]
    assert (calls[1]["input_tokens"], calls[1]["output_tokens"]) == (120, 30)
    assert calls[1]["stop_reason"] == "tool_use" and calls[1]["cost"] == "0.00081"
    (usage,) = [r for r in records if r["record"] == "model_usage"]
    assert usage["model_calls"] == 3 and usage["cost"] == "0.00162"

    listing = agentrt(database, "runs")
    assert listing.splitlines()[0].split()[:4] == ["RUN", "STATUS", "STEPS", "COST"]
    assert "$0.0016" in listing
    (run,) = [json.loads(line) for line in agentrt(database, "--json", "runs").splitlines()][:1]
    assert (run["model_calls"], run["cost"]) == (3, "0.00162")


async def test_show_of_a_run_without_model_calls_says_so(tmp_path: Path) -> None:
    database = tmp_path / "agentrt.db"
    with open_store(database) as store:
        run_id = await Gate(store, [Note()]).start("Nothing yet.")

    assert "model calls        0" in agentrt(database, "show", run_id)
    listing = agentrt(database, "runs")
    assert listing.splitlines()[1].split()[3] == "-"
    record = json.loads(agentrt(database, "--json", "runs").splitlines()[0])
    assert (record["model_calls"], record["cost"]) == (0, "0")


def claude_answers(server: Any, sandbox: Path) -> None:
    """The demo's two steps as `tool_use`, then the closing sentence."""
    server.answer(anthropic_tool_use("fs_read_text_file", {"path": str(sandbox / INPUT_FILE)}))
    server.answer(
        anthropic_tool_use(
            "fs_write_file", {"path": str(sandbox / OUTPUT_FILE), "content": "A summary.\n"}
        )
    )
    server.answer(anthropic_text("I wrote SUMMARY.md."))


@pytest.mark.parametrize("rate_limited_first", [False, True])
def test_agentrt_demo_with_a_claude_model_completes_and_show_reports_its_calls(
    tmp_path: Path, model_server: Any, rate_limited_first: bool
) -> None:
    if not DemoPaths(Path("."), default_example_dir()).server_script.is_file():
        pytest.fail("the demo's filesystem server is not installed (make demo installs it)")
    state = tmp_path / "state"
    if rate_limited_first:
        model_server.answer(
            anthropic_error("rate_limit_error", "slow down"),
            status=429,
            headers={"Retry-After": "1"},
        )
    claude_answers(model_server, (state / "sandbox").resolve())

    finished = subprocess.run(
        [AGENTRT, "demo", "--state-dir", str(state), "--model", "anthropic:fake",
         "--base-url", model_server.url],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip

    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert "agent: Anthropic model fake at http://127.0.0.1" in finished.stdout
    assert (state / "sandbox" / OUTPUT_FILE).read_text() == "A summary.\n"
    assert all(r.path == "/v1/messages" for r in model_server.requests)
    listing = subprocess.run(
        [AGENTRT, "--json", "--db", str(state / "agentrt.db"), "runs"],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    run_id = json.loads(listing.stdout.splitlines()[0])["run_id"]
    shown = subprocess.run(
        [AGENTRT, "--json", "--db", str(state / "agentrt.db"), "show", run_id],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    records = [json.loads(line) for line in shown.stdout.splitlines()]
    calls = [r for r in records if r["record"] == "model_call"]
    expected = ["transient_error", "ok", "ok", "ok"] if rate_limited_first else ["ok"] * 3
    assert [c["outcome"] for c in calls] == expected
    assert [c["step"] for c in calls] == ([1] if rate_limited_first else []) + [1, 2, 3]
    assert all(c["input_tokens"] == 120 and c["output_tokens"] == 30 for c in calls[-3:])
    (usage,) = [r for r in records if r["record"] == "model_usage"]
    assert usage["model_calls"] == len(expected)
    assert usage["input_tokens"] == 360 and usage["output_tokens"] == 90
