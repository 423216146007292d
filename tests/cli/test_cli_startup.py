"""The operator's commands start without the parts they do not use."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

_PROBE = """
import json, sys
from agentrt.cli import cli
try:
    cli([*sys.argv[1:], "--help"], prog_name="agentrt", standalone_mode=False)
finally:
    heavy = sorted(m for m in ("mcp", "starlette", "uvicorn", "agentrt.proxy") if m in sys.modules)
    print(json.dumps(heavy), file=sys.stderr)
"""


def _heavy_modules(*command: str) -> list[str]:
    finished = subprocess.run(
        [sys.executable, "-c", _PROBE, *command], capture_output=True, text=True, timeout=60
    )
    assert finished.returncode == 0, finished.stderr
    heavy: list[str] = json.loads(finished.stderr.strip().splitlines()[-1])
    return heavy


@pytest.mark.parametrize("command", ["runs", "show", "approve", "reject", "cancel", "verify"])
def test_reading_and_deciding_commands_do_not_import_the_mcp_sdk_or_the_proxy(
    command: str,
) -> None:
    assert _heavy_modules(command) == []


def test_every_command_is_listed_in_the_help_and_resolves() -> None:
    from click.testing import CliRunner

    from agentrt.cli import cli

    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0, result.output
    listed = [line.split()[0] for line in result.output.split("Commands:")[1].splitlines() if line]
    assert listed == [
        "runs", "show", "events", "approve", "reject", "cancel", "verify", "inbox", "export",
        "init", "pin", "classify", "check", "proxy", "demo", "recheck",
    ]  # fmt: skip
    for name in listed:
        assert CliRunner().invoke(cli, [name, "--help"]).exit_code == 0, name
