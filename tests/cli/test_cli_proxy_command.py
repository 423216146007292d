"""`agentrt proxy --config FILE` served without the click group (issue 36): the one form a
host's configuration starts every time it opens takes the short way; every other form
goes through the group, and both ways answer alike."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agentrt.cli import served_config

# Runs `main()` as the console script does, and says whether click was imported.
_FAST = """
import json, sys
import agentrt.proxy._serve as serving

def exit_process(status):
    print("CLICK " + json.dumps("click" in sys.modules), file=sys.stderr)
    sys.exit(status)

serving.exit_process = exit_process
from agentrt.cli import main
sys.argv = ["agentrt", *sys.argv[1:]]
main()
"""
# The same command through the group.
_GROUP = """
import sys
from agentrt.cli import cli
cli(sys.argv[1:], prog_name="agentrt")
"""


@pytest.mark.parametrize(
    ("argv", "served"),
    [
        (["proxy", "--config", "proxy.json"], "proxy.json"),
        (["proxy", "--config=proxy.json"], "proxy.json"),
        (["proxy", "--config", "proxy.json", "--http", "127.0.0.1:8080"], None),
        (["--db", "x.db", "proxy", "--config", "proxy.json"], None),
        (["proxy", "--help"], None),
        (["proxy", "--config"], None),
        (["proxy", "--config="], None),
        (["proxy", "--config", "--http"], None),
        (["proxy", "--config", ""], None),
        (["runs"], None),
        ([], None),
    ],
)
def test_only_the_plain_proxy_command_takes_the_short_way(
    argv: list[str], served: str | None
) -> None:
    assert served_config(argv) == served


def _run(program: str, args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", program, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("form", [["--config", "missing.json"], ["--config=missing.json"]])
def test_the_short_way_refuses_as_the_group_does_and_imports_no_click(
    tmp_path: Path, form: list[str]
) -> None:
    (tmp_path / "bad.json").write_text("{not json")
    for config in (form, ["--config", "bad.json"]):
        fast = _run(_FAST, ["proxy", *config], tmp_path)
        group = _run(_GROUP, ["proxy", *config], tmp_path)
        lines = fast.stderr.splitlines()
        assert lines[-1] == "CLICK false", fast.stderr
        assert fast.returncode == group.returncode == 1
        assert "\n".join(lines[:-1]) == group.stderr.rstrip("\n")
        assert "agentrt proxy:" in group.stderr
    assert sorted(path.name for path in tmp_path.iterdir()) == ["bad.json"]  # nothing made


def test_any_other_form_goes_through_the_group(tmp_path: Path) -> None:
    shown = _run(_FAST, ["proxy", "--help"], tmp_path)
    assert shown.returncode == 0
    assert "Serve the MCP proxy" in shown.stdout
    assert "CLICK" not in shown.stderr  # the group served it: the short way never ran
