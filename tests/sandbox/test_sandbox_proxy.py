"""Through a real `agentrt proxy` process: sandboxed servers, the warning, fail-closed loading."""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from sandbox_support import ESCAPER, FILESYSTEM_SERVER, NODE_MODULES, Listener

from agentrt.mcp import Sandbox, Server, pin

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.timeout(120)]

AGENTRT = Path(sys.executable).parent / "agentrt"
SECRET = "planted-in-home"
_ESCAPER_TOOLS = ("read", "write", "list", "connect", "whoami", "spawn")


def _private(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o600)
    return path


class Setup:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.conf = root / "conf"
        self.work = root / "work"
        self.home = root / "home"
        self.work.mkdir(parents=True)
        self.secret = _private(self.home / ".aws" / "credentials", SECRET)
        (self.work / "hello.txt").write_text("hello from the work dir\n")
        self.marker = self.work / "escaper-started"
        self.stderr = root / "proxy.stderr"

    async def write(self, node: str) -> Path:
        escaper_command = [sys.executable, str(ESCAPER), str(self.marker)]
        fs_command = [node, str(FILESYSTEM_SERVER), str(self.work)]
        escaper_sandbox = {"write": [str(self.work)], "network": False}
        fs_sandbox = {"read": [str(NODE_MODULES)], "write": [str(self.work)]}
        escaper = Server(
            name="esc", command=escaper_command, sandbox=Sandbox(write=[str(self.work)])
        )
        files = Server(
            name="fs",
            command=fs_command,
            sandbox=Sandbox(read=[str(NODE_MODULES)], write=[str(self.work)]),
        )
        _private(self.conf / "esc.json", (await pin(escaper)).to_json())
        bare = Server(name="bare", command=escaper_command)
        _private(self.conf / "bare.json", (await pin(bare)).to_json())
        _private(self.conf / "fs.json", (await pin(files)).to_json())
        self.marker.unlink(missing_ok=True)
        read_only = {"side_effect": "read_only", "timeout": "20s"}
        document: dict[str, Any] = {
            "database": "proxy.db",
            "session": "sandbox",
            "servers": [
                {
                    "name": "esc",
                    "command": escaper_command,
                    "sandbox": escaper_sandbox,
                    "manifest": "esc.json",
                    "rules": {tool: read_only for tool in _ESCAPER_TOOLS},
                },
                {
                    "name": "fs",
                    "command": fs_command,
                    "sandbox": fs_sandbox,
                    "manifest": "fs.json",
                    "rules": {"read_text_file": read_only},
                },
                {
                    "name": "bare",
                    "command": escaper_command[:2],
                    "manifest": "bare.json",
                    "rules": {"whoami": read_only},
                },
            ],
        }
        return _private(self.conf / "proxy.json", json.dumps(document))

    @asynccontextmanager
    async def host(self, path: str) -> AsyncIterator[ClientSession]:
        config = self.conf / "proxy.json"
        parameters = StdioServerParameters(
            command=str(AGENTRT),
            args=["proxy", "--config", str(config)],
            env={"PATH": path, "HOME": str(self.home)},
            cwd=str(self.root),
        )
        with self.stderr.open("a") as errlog:
            async with (
                stdio_client(parameters, errlog=errlog) as (read_stream, write_stream),
                ClientSession(read_stream, write_stream) as session,
            ):
                await session.initialize()
                yield session


async def _outcome(session: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await session.call_tool(tool, arguments)
    text = "".join(getattr(block, "text", "") for block in result.content)
    outcome: dict[str, Any] = json.loads(text[text.index("{") :])
    return outcome


@pytest.fixture
def node() -> str:
    found = shutil.which("node")
    if found is None or not FILESYSTEM_SERVER.exists():
        pytest.skip("needs node and the npm test servers (make test installs them)")
    return found


async def test_through_the_proxy_a_sandboxed_server_reaches_only_its_write_path(
    tmp_path: Path, node: str
) -> None:
    setup = Setup(tmp_path)
    config = await setup.write(node)
    listener = Listener()
    try:
        async with setup.host(os.environ["PATH"]) as session:
            secret = await _outcome(session, "esc_read", path=str(setup.secret))
            database = await _outcome(session, "esc_list", path=str(config.parent))
            configuration = await _outcome(session, "esc_read", path=str(config))
            network = await _outcome(session, "esc_connect", host="127.0.0.1", port=listener.port)
            written = await _outcome(
                session, "esc_write", path=str(setup.work / "out"), content="w"
            )
            hello = str(setup.work / "hello.txt")
            listed = await session.call_tool("fs_read_text_file", {"path": hello})
            bare = await _outcome(session, "bare_whoami")
        assert not secret["ok"] and not database["ok"] and not configuration["ok"]
        assert not network["ok"]
        assert not listener.saw_anyone()
        assert written["ok"] and (setup.work / "out").read_text() == "w"
        assert "hello from the work dir" in "".join(getattr(b, "text", "") for b in listed.content)
        assert os.getpid() in bare["value"]["proc"]  # the unsandboxed one sees the host's /proc
    finally:
        listener.close()
    stderr = setup.stderr.read_text()
    warnings = [line for line in stderr.splitlines() if "has no sandbox" in line]
    assert warnings == [
        "agentrt proxy: warning: server bare has no sandbox, so it runs with every file and "
        "network this user can reach"
    ]


async def test_through_the_proxy_without_bwrap_the_sandboxed_servers_are_left_out(
    tmp_path: Path, node: str
) -> None:
    setup = Setup(tmp_path)
    await setup.write(node)
    empty = tmp_path / "no-bwrap"
    empty.mkdir()
    async with setup.host(str(empty)) as session:
        names = sorted(tool.name for tool in (await session.list_tools()).tools)
    assert names == ["bare_whoami", "gate_status"]
    assert not setup.marker.exists()
    stderr = setup.stderr.read_text()
    for server in ("esc", "fs"):
        assert (
            f'agentrt proxy: server {server} did not load: loading server "{server}" failed while '
            f'starting the server: server "{server}" has a sandbox and was not started: bwrap was '
            "not found on PATH; install bubblewrap"
        ) in stderr
