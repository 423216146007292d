"""`pin` and `check` over a proxy configuration, against real stdio MCP servers."""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from agentrt.cli import cli

SERVER_SCRIPT = Path(__file__).with_name("cli_mcp_server.py")

pytestmark = pytest.mark.timeout(90)


class Setup:
    """A proxy configuration (owner-only) naming the test server and the stock time server."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.marks = directory / "marks"
        self.marks.mkdir()
        self.config = directory / "proxy.json"
        self.things_manifest = directory / "things.manifest.json"
        self.time_manifest = directory / "time.manifest.json"
        self.write()

    def write(self, **overrides: object) -> None:
        document = {
            "database": "runs.db",
            "session": "cli",
            "servers": [
                {
                    "name": "things",
                    "command": [sys.executable, str(SERVER_SCRIPT), str(self.marks)],
                    "manifest": self.things_manifest.name,
                    "rules": {
                        "read_thing": {"side_effect": "read_only", "timeout": "5s"},
                        "write_thing": {
                            "side_effect": "local_mutation",
                            "timeout": "5s",
                            "allow_hint_mismatch": True,
                        },
                    },
                },
                {
                    "name": "time",
                    "command": [sys.executable, "-m", "mcp_server_time"],
                    "manifest": self.time_manifest.name,
                    "rules": {"get_current_time": {"side_effect": "read_only", "timeout": "5s"}},
                },
            ],
            **overrides,
        }
        self.config.write_text(json.dumps(document))
        os.chmod(self.config, 0o600)

    def run(self, *args: str) -> Result:
        return CliRunner().invoke(cli, list(args))


@pytest.fixture
def setup(tmp_path: Path) -> Setup:
    return Setup(tmp_path)


@pytest.fixture
def open_umask() -> Iterator[None]:
    previous = os.umask(0)
    try:
        yield
    finally:
        os.umask(previous)


def test_pin_writes_owner_only_manifests_under_any_umask(setup: Setup, open_umask: None) -> None:
    result = setup.run("pin", "--config", str(setup.config))
    assert result.exit_code == 0, result.output
    for manifest in (setup.things_manifest, setup.time_manifest):
        assert stat.S_IMODE(os.stat(manifest).st_mode) == 0o600
        document = json.loads(manifest.read_text())
        assert document["server"] in ("things", "time")
    assert sorted(json.loads(setup.things_manifest.read_text())["tools"]) == [
        "read_thing",
        "shout",
        "write_thing",
    ]
    assert not [name for name in os.listdir(setup.directory) if name.endswith(".tmp")]


def test_pin_prints_each_tool_with_the_hints_the_server_claims(setup: Setup) -> None:
    result = setup.run("pin", "--config", str(setup.config))
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert any(line.split()[:2] == ["read_thing", "readOnlyHint=true"] for line in lines)
    assert any(
        line.split()[:3] == ["write_thing", "readOnlyHint=false", "destructiveHint=true"]
        for line in lines
    )
    assert any(line.split()[:3] == ["shout", "no", "hints"] for line in lines)
    # The stock PyPI server's own claims, printed as it sent them.
    assert any(
        line.startswith("get_current_time") and "readOnlyHint=true destructiveHint=false" in line
        for line in lines
    )
    assert "they classify nothing" in result.output


def test_pin_escapes_what_the_server_chose(setup: Setup) -> None:
    result = setup.run("pin", "--config", str(setup.config), "things")
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.output and "\u202e" not in result.output
    assert "Loud \\x1b[31mred\\x1b[0m text \\u202etxt.exe" in result.output
    # The manifest keeps the description as received; only the printing escapes it.
    pinned = json.loads(setup.things_manifest.read_text())["tools"]["shout"]["description"]
    assert pinned == "Loud \x1b[31mred\x1b[0m text \u202etxt.exe"


def test_pin_of_one_named_server_pins_only_it(setup: Setup) -> None:
    result = setup.run("pin", "--config", str(setup.config), "things")
    assert result.exit_code == 0, result.output
    assert setup.things_manifest.exists() and not setup.time_manifest.exists()


def test_pin_of_a_server_the_configuration_does_not_name_is_refused(setup: Setup) -> None:
    result = setup.run("pin", "--config", str(setup.config), "tickets")
    assert result.exit_code == 2
    assert 'the configuration has no server "tickets" (it has: things, time)' in result.output
    assert not setup.things_manifest.exists() and not setup.time_manifest.exists()


def test_pin_replaces_a_symbolic_link_at_the_manifest_path_without_following_it(
    setup: Setup,
) -> None:
    victim = setup.directory / "victim.txt"
    victim.write_text("keep me\n")
    setup.things_manifest.symlink_to(victim)
    result = setup.run("pin", "--config", str(setup.config), "things")
    assert result.exit_code == 0, result.output
    assert victim.read_text() == "keep me\n"
    assert not setup.things_manifest.is_symlink()
    assert stat.S_IMODE(os.lstat(setup.things_manifest).st_mode) == 0o600


def test_pin_of_a_server_that_cannot_start_fails_and_writes_nothing(setup: Setup) -> None:
    setup.write(
        servers=[
            {
                "name": "broken",
                "command": [str(setup.directory / "no-such-program")],
                "manifest": "broken.manifest.json",
                "rules": {},
                "connect_timeout": "5s",
            }
        ]
    )
    result = setup.run("pin", "--config", str(setup.config))
    assert result.exit_code == 1
    assert 'agentrt: server "broken" was not pinned:' in result.output
    assert not (setup.directory / "broken.manifest.json").exists()


def test_check_prints_the_report_calls_nothing_and_closes_the_connection(setup: Setup) -> None:
    assert setup.run("pin", "--config", str(setup.config)).exit_code == 0
    (setup.marks / "closed").unlink()
    result = setup.run("check", "--config", str(setup.config))
    assert result.exit_code == 0, result.output
    assert "things: registered read_thing as things_read_thing (read_only)" in result.output
    assert (
        "things: registered write_thing as things_write_thing (local_mutation); hint mismatch "
        "allowed: classified local_mutation, but the server claims destructiveHint"
    ) in result.output
    assert "things: unclassified shout" in result.output
    assert "time: registered get_current_time" in result.output
    assert not (setup.marks / "calls").exists()
    assert (setup.marks / "closed").exists()


def test_check_fails_with_exit_1_when_a_pinned_tool_changed(setup: Setup) -> None:
    assert setup.run("pin", "--config", str(setup.config), "things").exit_code == 0
    manifest = json.loads(setup.things_manifest.read_text())
    manifest["tools"]["read_thing"]["description_hash"] = "0" * 64
    setup.things_manifest.write_text(json.dumps(manifest))
    setup.write(servers=[json.loads(setup.config.read_text())["servers"][0]])
    result = setup.run("--json", "check", "--config", str(setup.config))
    assert result.exit_code == 1
    report = json.loads(result.output.splitlines()[0])
    assert report["ok"] is False
    assert [refusal["tool"] for refusal in report["refused"]] == ["read_thing"]
    assert [registered["tool"] for registered in report["registered"]] == ["write_thing"]
    assert not (setup.marks / "calls").exists()


def test_check_without_a_manifest_fails_naming_the_server(setup: Setup) -> None:
    result = setup.run("check", "--config", str(setup.config))
    assert result.exit_code == 1
    assert 'server "things": not loaded:' in result.output
    assert 'server "time": not loaded:' in result.output


def test_a_configuration_others_can_write_is_refused(setup: Setup) -> None:
    os.chmod(setup.config, 0o666)
    for command in ("pin", "check"):
        result = setup.run(command, "--config", str(setup.config))
        assert result.exit_code == 2, command
        assert "cannot be used" in result.output
    assert not setup.things_manifest.exists()
