"""`"sandbox"` in proxy.json: parsed, checked as strictly as every field, reported by check."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agentrt.mcp import Sandbox
from agentrt.proxy import ConfigError, load_config

RULES = {"read_file": {"side_effect": "read_only"}}
AGENTRT = Path(sys.executable).parent / "agentrt"


def _config(tmp_path: Path, sandbox: Any, **server: Any) -> Path:
    """A configuration with one server; `sandbox` None leaves the field out."""
    if sandbox is not None:
        server["sandbox"] = sandbox
    document = {
        "database": "state/proxy.db",
        "session": "desk-1",
        "servers": [
            {
                "name": "fs",
                "command": ["node", "server.js"],
                "manifest": "fs.manifest.json",
                "rules": RULES,
                **server,
            }
        ],
    }
    path = tmp_path / "proxy.json"
    path.write_text(json.dumps(document))
    path.chmod(0o600)
    return path


def test_a_sandbox_is_read_with_paths_relative_to_the_file(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    raw = {"read": ["docs"], "write": ["/srv/sandbox"], "network": False, "home": "private"}
    config = load_config(_config(tmp_path, raw))
    sandbox = config.servers[0].server.sandbox
    assert sandbox is not None
    assert sandbox.read == [str(tmp_path / "docs")]
    assert sandbox.write == ["/srv/sandbox"]
    assert sandbox.network is False and sandbox.home == "private" and sandbox.devices == "minimal"


def test_the_operators_files_are_hidden_in_every_sandbox(tmp_path: Path) -> None:
    config = load_config(_config(tmp_path, {"hide": ["/srv/token"]}))
    sandbox = config.servers[0].server.sandbox
    assert sandbox is not None
    assert sandbox.hide[0] == "/srv/token"
    assert {str(path) for path in config.protected_paths()} <= set(sandbox.hide)


@pytest.mark.parametrize(
    ("sandbox", "problem"),
    [
        ({"reed": ["/srv"]}, 'server "fs" sandbox.reed is not a field this file may have'),
        ({"network": "no"}, 'server "fs" sandbox network must be true or false'),
        ({"write": "/srv"}, 'server "fs" sandbox write must be a list of strings'),
        ({"home": "shared"}, "sandbox home 'shared' is not offered"),
        ({"devices": "all"}, "sandbox devices 'all' is not offered"),
        (["/srv"], 'server "fs" sandbox must be a JSON object'),
    ],
)
def test_a_wrong_sandbox_field_is_refused_naming_it(
    tmp_path: Path, sandbox: Any, problem: str
) -> None:
    with pytest.raises(ConfigError, match="sandbox") as caught:
        load_config(_config(tmp_path, sandbox))
    assert problem in str(caught.value)


def test_a_sandbox_on_an_http_server_is_refused(tmp_path: Path) -> None:
    path = _config(tmp_path, {}, endpoint="http://127.0.0.1:1/mcp")
    document = json.loads(path.read_text())
    del document["servers"][0]["command"]
    path.write_text(json.dumps(document))
    with pytest.raises(ConfigError, match="has a sandbox but no command"):
        load_config(path)


@pytest.mark.parametrize("kind", ["read", "write"])
def test_a_sandbox_path_reaching_the_operators_files_is_refused(tmp_path: Path, kind: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(_config(tmp_path, {kind: ["state"]}))
    assert f'server "fs" has a sandbox {kind} path {tmp_path / "state"}, which reaches ' in str(
        caught.value
    )


def test_a_sandboxed_servers_arguments_are_bounded_by_its_binds_not_checked(
    tmp_path: Path,
) -> None:
    # Unsandboxed, an argument naming the state directory is refused (the string guard);
    # sandboxed, the server cannot see that directory unless a bind grants it.
    with pytest.raises(ConfigError, match="reaches"):
        load_config(_config(tmp_path, None, command=["node", "server.js", str(tmp_path)]))
    config = load_config(_config(tmp_path, {}, command=["node", "server.js", str(tmp_path)]))
    assert config.servers[0].server.sandbox == Sandbox(
        hide=[str(path) for path in config.protected_paths()]
    )


@pytest.mark.parametrize("sandboxed", [True, False])
def test_check_says_whether_each_server_is_sandboxed(tmp_path: Path, sandboxed: bool) -> None:
    work = tmp_path / "work"
    path = _config(tmp_path, {"write": [str(work)]} if sandboxed else None)
    environment = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
    text = subprocess.run(
        [str(AGENTRT), "check", "--config", str(path)],
        capture_output=True, text=True, env=environment, timeout=60, check=False,
    )  # fmt: skip
    records = subprocess.run(
        [str(AGENTRT), "--json", "check", "--config", str(path)],
        capture_output=True, text=True, env=environment, timeout=60, check=False,
    )  # fmt: skip
    first = text.stdout.splitlines()[0]
    if sandboxed:
        assert first == f'server "fs": sandboxed (write {work}; no network)'
    else:
        assert first == (
            'server "fs": not sandboxed: it runs with every file and network this user can reach'
        )
    record = json.loads(records.stdout.splitlines()[0])
    assert record["record"] == "check" and record["sandboxed"] is sandboxed


@pytest.mark.parametrize(
    "host_file", [".cursor/mcp.json", ".claude.json", ".config/Claude/claude_desktop_config.json"]
)
def test_a_sandbox_write_path_holding_a_hosts_mcp_configuration_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, host_file: str
) -> None:
    home = tmp_path / "home"
    (home / host_file).parent.mkdir(parents=True)
    (home / host_file).write_text('{"mcpServers": {}}')
    before = (home / host_file).read_bytes()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    with pytest.raises(ConfigError) as caught:
        load_config(_config(tmp_path, {"write": [str(home)]}))
    assert f'server "fs" has a sandbox write path {home}, which holds {home / host_file}' in str(
        caught.value
    )
    assert (home / host_file).read_bytes() == before
    # Reading the home is not writing it, and a work directory beside it is fine.
    work = home / "work"
    work.mkdir()
    assert load_config(_config(tmp_path, {"read": [str(home)], "write": [str(work)]})).servers
