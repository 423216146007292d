"""The operator's commands start without the parts they do not use."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from cli_support import Produced

_PROBE = """
import json, sys
from agentrt.cli import cli
try:
    cli([*sys.argv[1:], "--help"], prog_name="agentrt", standalone_mode=False)
finally:
    heavy = sorted(
        m for m in ("mcp", "starlette", "uvicorn", "agentrt.proxy", "cryptography")
        if m in sys.modules
    )
    print(json.dumps(heavy), file=sys.stderr)
"""


def _heavy_modules(*command: str) -> list[str]:
    finished = subprocess.run(
        [sys.executable, "-c", _PROBE, *command], capture_output=True, text=True, timeout=60
    )
    assert finished.returncode == 0, finished.stderr
    heavy: list[str] = json.loads(finished.stderr.strip().splitlines()[-1])
    return heavy


@pytest.mark.parametrize(
    "command", ["runs", "show", "approve", "reject", "cancel", "verify", "checkpoint"]
)
def test_reading_and_deciding_commands_do_not_import_the_mcp_sdk_or_the_proxy(
    command: str,
) -> None:
    assert _heavy_modules(command) == []


# What deciding and reading never use: the gate's JSON Schema validators, the driver.
_GATE_SIDE: tuple[str, ...] = ("agentrt.gate", "agentrt.driver", "agentrt.schema", "jsonschema")

_RUN = """
import json, sys
from agentrt.cli import cli
try:
    cli(sys.argv[1:], prog_name="agentrt", standalone_mode=False)
finally:
    print(json.dumps(sorted(m for m in GATE_SIDE if m in sys.modules)), file=sys.stderr)
"""


@pytest.mark.parametrize("command", ["runs", "show", "approve"])
def test_runs_show_and_approve_do_not_import_the_gate_or_json_schema(
    command: str, produced: Produced
) -> None:
    arguments = {
        "runs": ["runs"],
        "show": ["show", produced.waiting_run],
        "approve": ["approve", produced.waiting_run, "--approval", produced.approval_id],
    }[command]
    finished = subprocess.run(
        [sys.executable, "-c", _RUN.replace("GATE_SIDE", repr(_GATE_SIDE)),
         "--db", str(produced.database), *arguments],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert finished.returncode == 0, finished.stderr
    assert "approved" in finished.stdout or command != "approve", finished.stdout
    assert json.loads(finished.stderr.strip().splitlines()[-1]) == []


# What reading and deciding never use (issue 36): the event loop (asyncio brings ssl,
# 10 MiB), an HTTP client, the checkpoints and archives (verify's), the agent loop, and the
# proxy's side: the protocol's models, templates, the conditions engine, cryptography.
_NOT_FOR_READING_OR_DECIDING: tuple[str, ...] = (
    "asyncio",
    "ssl",
    "urllib.request",
    "email",
    "agentrt.retention",
    "agentrt.agent",
    "agentrt.proxy",
    "mcp",
    "mcp_types",
    "pydantic",
    "jinja2",
    "celpy",
    "cryptography",
)


@pytest.mark.parametrize("command", ["runs", "show", "approve"])
def test_runs_show_and_approve_do_not_import_the_event_loop_or_what_only_others_use(
    command: str, produced: Produced
) -> None:
    arguments = {
        "runs": ["runs"],
        "show": ["show", produced.waiting_run],
        "approve": ["approve", produced.waiting_run, "--approval", produced.approval_id],
    }[command]
    finished = subprocess.run(
        [sys.executable, "-c", _RUN.replace("GATE_SIDE", repr(_NOT_FOR_READING_OR_DECIDING)),
         "--db", str(produced.database), *arguments],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert finished.returncode == 0, finished.stderr
    assert "approved" in finished.stdout or command != "approve", finished.stdout
    assert json.loads(finished.stderr.strip().splitlines()[-1]) == []


def test_every_command_is_listed_in_the_help_and_resolves() -> None:
    from click.testing import CliRunner

    from agentrt.cli import cli

    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0, result.output
    # (A short help too long for the column wraps onto a line indented further.)
    listed = [
        line.split()[0]
        for line in result.output.split("Commands:")[1].splitlines()
        if line.strip() and not line.startswith("   ")
    ]
    assert listed == [
        "runs", "show", "events", "approve", "reject", "cancel", "grants", "revoke", "verify",
        "inbox", "approver", "approvers", "export", "init", "pin", "classify", "check", "proxy",
        "demo",
        "recheck", "bench", "taint", "login",
        "checkpoint", "archive", "evidence", "verify-evidence",
    ]  # fmt: skip
    for name in listed:
        assert CliRunner().invoke(cli, [name, "--help"]).exit_code == 0, name
