"""`agentrt init`: a host's configuration in, a pinned proxy configuration out, the host moved.

The host file names the stock filesystem server (from the npm install the
tests use) and the stock `mcp-server-time` from PyPI; every server really starts.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from agentrt.cli import cli
from agentrt.proxy.config import DEFAULT_SERVER_TIMEOUT, ConfigError, load_config

REPO = Path(__file__).resolve().parents[2]
FILESYSTEM_SERVER = (
    REPO / "tests/npm/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js"
)
TIME_SERVER = Path(sys.executable).with_name("mcp-server-time")
TOKEN_SERVER = Path(__file__).with_name("token_http_server.py")

pytestmark = pytest.mark.timeout(120)


def run(*args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), input=input)


class Host:
    """A Claude Desktop configuration naming the two stock servers, beside keys of its own."""

    def __init__(self, directory: Path) -> None:
        self.sandbox = directory / "sandbox"
        self.sandbox.mkdir()
        (self.sandbox / "notes.txt").write_text("hello\n")
        self.path = directory / "claude_desktop_config.json"
        self.out = directory / "agentrt"
        self.config = self.out / "proxy.json"
        self.servers: dict[str, object] = {
            "fs": {"command": "node", "args": [str(FILESYSTEM_SERVER), str(self.sandbox)]},
            "time": {"command": str(TIME_SERVER), "env": {"TIME_TEST": "kept"}},
        }
        self.write()

    def write(self) -> None:
        document = {"globalShortcut": "Ctrl+Space", "mcpServers": self.servers, "zoom": 1.25}
        self.path.write_text(json.dumps(document, indent=2))

    def init(self, *extra: str, input: str | None = None) -> Result:
        return run("init", "--from", str(self.path), "--out", str(self.out), *extra, input=input)


@pytest.fixture
def host(tmp_path: Path) -> Host:
    return Host(tmp_path)


@pytest.fixture
def open_umask() -> Iterator[None]:
    previous = os.umask(0)
    try:
        yield
    finally:
        os.umask(previous)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_init_writes_an_owner_only_configuration_and_both_manifests(
    host: Host, open_umask: None
) -> None:
    result = host.init()
    assert result.exit_code == 0, result.output
    assert mode(host.out) == 0o700
    assert mode(host.config) == 0o600
    for name in ("fs", "time"):
        manifest = host.out / f"{name}.manifest.json"
        assert mode(manifest) == 0o600
        assert json.loads(manifest.read_text())["server"] == name
    assert "read_text_file" in json.loads((host.out / "fs.manifest.json").read_text())["tools"]
    document = json.loads(host.config.read_text())
    assert document["database"] == "proxy.db" and document["session"] == "agentrt"
    servers = {server["name"]: server for server in document["servers"]}
    # The trifecta rule, and no label proposed silently: classify asks for them.
    assert document["policy"]["flows"] == [
        {"after": ["private", "untrusted"], "call": "egress", "outcome": "require_approval"}
    ]
    assert all("labels" not in server for server in servers.values())
    assert servers["fs"]["command"] == ["node", str(FILESYSTEM_SERVER), str(host.sandbox)]
    assert servers["time"]["env"] == ["TIME_TEST=kept"]
    # Each imported stdio server is sandboxed: the directory it was handed is
    # its one writable path, no network; and it pinned from inside that sandbox.
    assert servers["fs"]["sandbox"] == {
        "read": [str(FILESYSTEM_SERVER)],
        "write": [str(host.sandbox)],
        "network": False,
    }
    assert servers["time"]["sandbox"] == {"network": False}
    assert all(server["rules"] == {} for server in servers.values())
    # The pin output, then the next steps in order.
    assert 'server "fs": 14 tools pinned to' in result.output
    assert "get_current_time  readOnlyHint=true" in result.output
    steps = [line.split(":", 1)[0].strip() for line in result.output.splitlines()[-3:]]
    assert steps == ["1. classify the tools", "2. see what would load", "3. start it from the host"]
    config = load_config(host.config)
    assert [upstream.server.default_timeout for upstream in config.servers] == [60.0, 60.0]


def test_a_server_without_rules_or_default_timeout_parses_with_the_defaults(
    tmp_path: Path,
) -> None:
    path = tmp_path / "proxy.json"
    path.write_text(
        json.dumps(
            {
                "database": "p.db",
                "session": "s",
                "servers": [{"name": "t", "command": ["x"], "manifest": "t.json"}],
            }
        )
    )
    path.chmod(0o600)
    (upstream,) = load_config(path).servers
    assert upstream.rules == {}
    assert upstream.server.default_timeout == DEFAULT_SERVER_TIMEOUT == 60.0


@pytest.mark.slow
def test_init_then_classify_then_check_registers_exactly_the_two_classified_tools(
    host: Host,
) -> None:
    assert host.init().exit_code == 0
    classified = run(
        "classify",
        "--config",
        str(host.config),
        "--set",
        "fs.read_text_file=read_only",
        "--set",
        "time.get_current_time=read_only",
    )
    assert classified.exit_code == 0, classified.output
    checked = run("--json", "check", "--config", str(host.config))
    assert checked.exit_code == 0, checked.output
    registered = [
        (report["server"], entry["name"], entry["side_effect"])
        for report in map(json.loads, checked.output.splitlines())
        for entry in report["registered"]
    ]
    assert registered == [
        ("fs", "fs_read_text_file", "read_only"),
        ("time", "time_get_current_time", "read_only"),
    ]


def test_install_rewrites_the_host_file_to_one_agentrt_entry_with_a_backup(host: Host) -> None:
    original = host.path.read_bytes()
    result = host.init("--install", "--yes")
    assert result.exit_code == 0, result.output
    document = json.loads(host.path.read_text())
    assert document["globalShortcut"] == "Ctrl+Space" and document["zoom"] == 1.25
    (name, entry), *others = document["mcpServers"].items()
    assert name == "agentrt" and not others
    assert Path(entry["command"]).is_absolute() and os.access(entry["command"], os.X_OK)
    assert entry["args"] == ["proxy", "--config", str(host.config)]
    (backup,) = host.path.parent.glob("claude_desktop_config.json.agentrt-backup-*")
    assert backup.read_bytes() == original
    assert "- fs (the proxy starts it" in result.output

    restored = run("init", "--restore", str(host.path), "--yes")
    assert restored.exit_code == 0, restored.output
    assert "  servers now: agentrt\n  servers after: fs, time\n" in restored.output
    assert host.path.read_bytes() == original


def test_install_asks_first_and_a_no_changes_nothing(host: Host) -> None:
    assert host.init().exit_code == 0
    original = host.path.read_bytes()
    result = host.init("--install", input="n\n")
    assert result.exit_code == 1
    assert "will start only the proxy" in result.output
    assert "nothing was changed" in result.output
    assert host.path.read_bytes() == original
    assert not list(host.path.parent.glob("*.agentrt-backup-*"))


def test_a_server_that_cannot_start_is_kept_with_a_note_and_left_out_by_check(
    host: Host, tmp_path: Path
) -> None:
    fetcher = tmp_path / "bin" / "npx"
    fetcher.parent.mkdir()
    fetcher.write_text("#!/bin/sh\nexit 3\n")
    fetcher.chmod(0o755)
    host.servers["memory"] = {
        "command": str(fetcher),
        "args": ["-y", "@modelcontextprotocol/server-memory"],
    }
    host.write()
    result = host.init()
    assert result.exit_code == 0, result.output
    assert 'server "memory" could not be pinned:' in result.output
    assert "install it once, pinned: npm install --prefix" in result.output
    servers = {entry["name"]: entry for entry in json.loads(host.config.read_text())["servers"]}
    assert "memory" in servers
    assert servers["memory"]["note"].startswith("npx fetches @modelcontextprotocol/server-memory")
    assert "not pinned by agentrt init" in servers["memory"]["note"]
    assert not (host.out / "memory.manifest.json").exists()
    assert (host.out / "fs.manifest.json").exists()
    run("classify", "--config", str(host.config), "--set", "time.get_current_time=read_only")
    checked = run("check", "--config", str(host.config))
    assert "time: registered get_current_time" in checked.output
    assert 'server "memory": not loaded:' in checked.output


def test_vscode_servers_with_comments_are_read_and_installed_with_their_type(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    workspace = tmp_path / "project"
    (workspace / ".vscode").mkdir(parents=True)
    host_file = workspace / ".vscode" / "mcp.json"
    host_file.write_text(
        "{\n  // the workspace's servers\n"
        '  "inputs": [],\n'
        f'  "servers": {{"time": {{"type": "stdio", "command": "{TIME_SERVER}",}}, }},\n'
        "  /* trailing */\n}\n"
    )
    monkeypatch.chdir(workspace)
    out = tmp_path / "agentrt"
    result = run("init", "--from", "vscode", "--out", str(out), "--install", "--yes")
    assert result.exit_code == 0, result.output
    assert (out / "time.manifest.json").exists()
    document = json.loads(host_file.read_text())
    assert document["inputs"] == []
    assert document["servers"]["agentrt"]["type"] == "stdio"
    assert json.loads(load_config(out / "proxy.json").path.read_text())["session"] == "vscode"


def test_an_unknown_source_is_refused_in_one_sentence_and_nothing_is_written(
    tmp_path: Path,
) -> None:
    result = run("init", "--from", "claude-web", "--out", str(tmp_path / "agentrt"))
    assert result.exit_code == 1
    assert result.output == (
        "agentrt: unknown source 'claude-web': name one of claude-desktop, claude-code, "
        "cursor, vscode, or the path of a host's configuration file\n"
    )
    assert not (tmp_path / "agentrt").exists()


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ('{"mcpServers": {"fs": {"command": "node"', "is not usable JSON"),
        ('{"mcpServers": {"a": {"command": "x"}, "a": {"command": "y"}}}', "appears twice"),
        ('{"mcpServers": {"fs": {"command": "node", "args": "one"}}}', "args must be a list"),
        ('{"mcpServers": {"fs": {"args": []}}}', "has neither a command nor a url"),
        ('{"mcpServers": {"fs": {"command": "x", "env": {"TOKEN\\n": "t"}}}}', "not a variable"),
        ('{"theme": "dark"}', "has no mcpServers"),
    ],
)
def test_a_malformed_host_file_is_refused_in_one_sentence_and_nothing_is_written(
    tmp_path: Path, text: str, named: str
) -> None:
    host_file = tmp_path / "host.json"
    host_file.write_text(text)
    result = run("init", "--from", str(host_file), "--out", str(tmp_path / "agentrt"))
    assert result.exit_code == 1
    (line,) = result.output.splitlines()
    assert line.startswith("agentrt: the host configuration") and named in line
    assert not (tmp_path / "agentrt").exists()
    assert host_file.read_text() == text


def test_init_over_an_existing_configuration_is_refused_and_keeps_it(host: Host) -> None:
    host.out.mkdir(mode=0o700)
    host.config.write_text('{"kept": true}')
    result = host.init()
    assert result.exit_code == 1
    assert "already exists" in result.output
    assert host.config.read_text() == '{"kept": true}'


def test_restore_without_a_backup_is_refused(host: Host) -> None:
    original = host.path.read_bytes()
    result = run("init", "--restore", str(host.path), "--yes")
    assert result.exit_code == 1
    assert "there is no agentrt backup beside" in result.output
    assert host.path.read_bytes() == original


def test_a_server_handed_the_configuration_directory_is_refused_before_any_server_starts(
    host: Host, tmp_path: Path
) -> None:
    marker = tmp_path / "started"
    host.servers["fs"] = {"command": "node", "args": [str(FILESYSTEM_SERVER), str(tmp_path)]}
    host.servers["spy"] = {"command": "/bin/sh", "args": ["-c", f"touch {marker}"]}
    host.write()
    result = host.init()
    assert result.exit_code == 1
    # init proposes a sandbox granting the directory the server was handed, so
    # the refusal names that sandbox path (the guard on binds, not on strings).
    assert 'server "fs" has a sandbox write path' in result.output
    assert "edit" in result.output and "another --out" in result.output
    assert not marker.exists()
    assert not list(host.out.glob("*.manifest.json"))


@pytest.fixture
def token_endpoint() -> Iterator[str]:
    process = subprocess.Popen(
        [sys.executable, str(TOKEN_SERVER), "s3cret"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert process.stdout is not None
        port = int(process.stdout.readline())
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.kill()
        process.wait()


def test_an_http_server_is_imported_with_its_headers_and_pinned_through_them(
    tmp_path: Path, token_endpoint: str
) -> None:
    host_file = tmp_path / "mcp.json"
    host_file.write_text(
        json.dumps(
            {
                "mcpServers": {
                    "api": {"url": token_endpoint, "headers": {"Authorization": "Bearer s3cret"}},
                    "tokenless": {"url": token_endpoint},
                }
            }
        )
    )
    out = tmp_path / "agentrt"
    result = run("init", "--from", str(host_file), "--out", str(out))
    assert result.exit_code == 0, result.output
    assert sorted(json.loads((out / "api.manifest.json").read_text())["tools"]) == ["whoami"]
    servers = {
        entry["name"]: entry for entry in json.loads((out / "proxy.json").read_text())["servers"]
    }
    assert servers["api"]["endpoint"] == token_endpoint
    assert servers["api"]["headers"] == {"Authorization": "Bearer s3cret"}
    # Without the token the server answers 401: kept, marked, not pinned.
    assert 'server "tokenless" could not be pinned' in result.output
    assert "not pinned by agentrt init" in servers["tokenless"]["note"]
    assert not (out / "tokenless.manifest.json").exists()


def test_headers_on_a_server_without_an_endpoint_are_refused_naming_them(tmp_path: Path) -> None:
    path = tmp_path / "proxy.json"
    server = {"name": "t", "command": ["x"], "manifest": "t.json", "headers": {"A": "b"}}
    path.write_text(json.dumps({"database": "p.db", "session": "s", "servers": [server]}))
    path.chmod(0o600)
    with pytest.raises(ConfigError, match='server "t" headers are only for a server with an'):
        load_config(path)


def test_restore_keeps_a_copy_of_the_file_it_replaces(host: Host) -> None:
    installed = host.init("--install", "--yes")
    assert installed.exit_code == 0, installed.output
    # The host (or its user) changes the file after the install: a setting and a server.
    document = json.loads(host.path.read_text())
    document["zoom"] = 1.5
    document["mcpServers"]["added_later"] = {"command": "true"}
    host.path.write_text(json.dumps(document))
    edited = host.path.read_bytes()

    restored = run("init", "--restore", str(host.path), "--yes")
    assert restored.exit_code == 0, restored.output
    assert json.loads(host.path.read_text())["zoom"] == 1.25
    (kept,) = host.path.parent.glob("claude_desktop_config.json.agentrt-replaced-*")
    assert kept.read_bytes() == edited
    assert mode(kept) == 0o600
    assert f"the file it replaced is kept in {kept}" in restored.output
    # The copy is not a backup: restoring again still puts the original back.
    (backup,) = host.path.parent.glob("claude_desktop_config.json.agentrt-backup-*")
    again = run("init", "--restore", str(host.path), "--yes")
    assert again.exit_code == 0, again.output
    assert host.path.read_bytes() == backup.read_bytes()
