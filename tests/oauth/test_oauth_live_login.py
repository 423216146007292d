"""A login made while `agentrt proxy` runs serves the server that waited for it, without a
restart: loaded when its tokens and its manifest appear, held to its pins under the rules
in force then, and the host told its list changed (docs/oauth.md); the other server serves
throughout."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from oauth_support import OAuthServer, click_consent, oauth_server

from agentrt.approvals import approve
from agentrt.mcp._login import login
from agentrt.mcp._tokens import AuthSettings
from agentrt.store import open_store

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.timeout(120)]

AGENTRT = Path(sys.executable).parent / "agentrt"
CHANGING = Path(__file__).parents[1] / "proxy" / "servers" / "changing_server.py"


def _config(root: Path, server: OAuthServer) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o700)
    path = root / "proxy.json"
    document = {
        "database": "proxy.db",
        "session": "oauth",
        "hold": "300ms",  # a held call is answered PENDING_APPROVAL after this, not 15 s
        "servers": [
            {
                "name": "remote",
                "endpoint": server.endpoint,
                "manifest": "remote.manifest.json",
                "rules": {"whoami": {"side_effect": "read_only"}},
            },
            {
                "name": "chg",
                "command": [sys.executable, str(CHANGING)],
                "default_timeout": "10s",
                "manifest": "chg.manifest.json",
                "rules": {"echo": {"side_effect": "read_only"}},
            },
        ],
    }
    path.write_text(json.dumps(document))
    path.chmod(0o600)
    return path


def _environment(state: Path) -> dict[str, str]:
    environment = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", "/tmp"),
        "XDG_STATE_HOME": str(state),
    }
    if "AGENTRT_ANCHOR_DIR" in os.environ:
        environment["AGENTRT_ANCHOR_DIR"] = os.environ["AGENTRT_ANCHOR_DIR"]
    return environment


async def _login(server: OAuthServer) -> None:
    async def browser(url: str) -> None:
        group.start_soon(click_consent, url)

    async with anyio.create_task_group() as group:
        await login("remote", server.endpoint, AuthSettings(), show_url=browser)


def _pin(config: Path, environment: dict[str, str], name: str) -> None:
    pinned = subprocess.run(
        [str(AGENTRT), "pin", "--config", str(config), name],
        env=environment, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert pinned.returncode == 0, pinned.stderr


def _text(result: Any) -> str:
    return "".join(getattr(block, "text", "") for block in result.content)


@dataclass
class _Serving:
    """A proxy whose server "remote" waits for a login, and its host (the SDK's client)."""

    host: ClientSession
    changed: anyio.Event
    config: Path
    environment: dict[str, str]
    stderr_path: Path

    def stderr(self) -> str:
        return self.stderr_path.read_text() if self.stderr_path.exists() else ""

    async def names(self) -> set[str]:
        return {tool.name for tool in (await self.host.list_tools()).tools}


@asynccontextmanager
async def _serving(root: Path, state: Path, server: OAuthServer) -> AsyncIterator[_Serving]:
    """The proxy started with "chg" pinned and "remote" not yet logged in, over stdio."""
    changed = anyio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            changed.set()

    config = _config(root / "conf", server)
    environment = _environment(state)
    _pin(config, environment, "chg")
    stderr_path = root / "proxy.stderr"
    parameters = StdioServerParameters(
        command=str(AGENTRT), args=["proxy", "--config", str(config)],
        env=environment, cwd=str(root),
    )  # fmt: skip
    with stderr_path.open("a") as errlog:
        async with (
            stdio_client(parameters, errlog=errlog) as (read, write),
            ClientSession(read, write, message_handler=on_message) as host,
        ):
            await host.initialize()
            yield _Serving(host, changed, config, environment, stderr_path)


async def test_a_login_made_while_the_proxy_runs_serves_the_server_under_the_rules_in_force(
    tmp_path: Path, state_home: Path
) -> None:
    with oauth_server() as server:
        async with _serving(tmp_path, state_home, server) as serving:
            before = await serving.names()
            # While remote waits for its login, the operator classifies whoami as a remote
            # mutation and renames it: taken at once, before remote is loaded.
            document = json.loads(serving.config.read_text())
            document["servers"][0]["rules"] = {
                "whoami": {"side_effect": "remote_mutation", "rename": "remote_identity"}
            }
            serving.config.write_text(json.dumps(document))
            with anyio.fail_after(30):
                while "took the new rules of" not in serving.stderr():
                    await anyio.sleep(0.1)
            # The person logs in, then the operator pins what the server offers.
            await _login(server)
            _pin(serving.config, serving.environment, "remote")
            with anyio.fail_after(30):
                await serving.changed.wait()
            after = await serving.names()
            held = await serving.host.call_tool("remote_identity", {})
            with open_store(serving.config.parent / "proxy.db", create=False) as store:
                waiting = store.get_approval(_approval_id(_text(held)))
                approve(store, waiting.run_id, approval_hash=waiting.approval_hash,
                        approval_id=waiting.approval_id, by="operator")  # fmt: skip
            whoami = await serving.host.call_tool("remote_identity", {})
            echo = await serving.host.call_tool("chg_echo", {"text": "unharmed"})
    assert "chg_echo" in before and "remote_whoami" not in before
    # Served under the rules in force when the login came, not the start's.
    assert "remote_identity" in after and "remote_whoami" not in after
    assert _text(held).startswith("PENDING_APPROVAL"), _text(held)
    assert _text(whoami) == "an authorized client", _text(whoami)
    assert _text(echo) == "unharmed"
    stderr = serving.stderr()
    assert "agentrt proxy: server remote did not load:" in stderr
    assert "agentrt proxy: server remote is logged in now and served" in stderr
    # Only its rules changed: nothing is said to wait for the next start.
    assert "took the new rules of" in stderr and "changed more than its rules" not in stderr
    with open_store(serving.config.parent / "proxy.db", create=False) as store:
        assert store.verify_chain().ok


def _approval_id(text: str) -> str:
    found = re.search(r"\(approval (\S+)\)", text)
    assert found is not None, text
    return found.group(1)
