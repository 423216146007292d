"""A whole session through `agentrt proxy` to a server behind OAuth: login, a governed call,
the token's expiry and rotation mid-session, step-up, a revoked login and a new one
without restarting the proxy, and the tokens searched for where they must never be."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from oauth_support import OAuthServer, click_consent, oauth_server

from agentrt.mcp._login import login
from agentrt.mcp._oauth import canonical_resource
from agentrt.mcp._tokens import AuthSettings, token_file

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

AGENTRT = Path(sys.executable).parent / "agentrt"
RULES = {"whoami": {"side_effect": "read_only"}, "admin_reset": {"side_effect": "read_only"}}


def _config(root: Path, server: OAuthServer) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o700)
    path = root / "proxy.json"
    document = {
        "database": "proxy.db",
        "session": "oauth",
        "servers": [
            {
                "name": "remote",
                "endpoint": server.endpoint,
                "manifest": "remote.manifest.json",
                "rules": RULES,
            }
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


async def _login(server: OAuthServer) -> list[str]:
    """Log in with the scripted browser; the scope its consent page showed."""
    shown: list[str] = []

    async def browser(url: str) -> None:
        async def click() -> None:
            shown.append(await click_consent(url))

        group.start_soon(click)

    async with anyio.create_task_group() as group:
        await login("remote", server.endpoint, AuthSettings(), show_url=browser)
    return shown


def _text(result: Any) -> str:
    return "".join(getattr(block, "text", "") for block in result.content)


async def test_a_whole_session_through_the_proxy_keeps_every_token_out_of_every_record(
    tmp_path: Path, state_home: Path
) -> None:
    with oauth_server("--access-ttl", "3") as server:
        config = _config(tmp_path / "conf", server)
        environment = _environment(state_home)
        # Before any login, pin says what is missing instead of failing obscurely.
        unpinned = subprocess.run(
            [str(AGENTRT), "pin", "--config", str(config)],
            env=environment, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert unpinned.returncode != 0
        assert "needs `agentrt login remote`" in unpinned.stderr

        await _login(server)
        pinned = subprocess.run(
            [str(AGENTRT), "pin", "--config", str(config)],
            env=environment, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert pinned.returncode == 0, pinned.stderr

        stderr_path = tmp_path / "proxy.stderr"
        parameters = StdioServerParameters(
            command=str(AGENTRT),
            args=["proxy", "--config", str(config)],
            env=environment,
            cwd=str(tmp_path),
        )
        file = token_file("remote", canonical_resource(server.endpoint))
        with stderr_path.open("a") as errlog:
            async with (
                stdio_client(parameters, errlog=errlog) as (read, write),
                ClientSession(read, write) as host,
            ):
                await host.initialize()
                first = await host.call_tool("remote_whoami", {})
                assert _text(first) == "an authorized client", _text(first)

                # The access token ends mid-session: the next call refreshes it first,
                # and the rotated refresh token is what the file keeps.
                before = file.read()
                assert before is not None
                refreshes = server.log()["refreshes"]
                await anyio.sleep(3.2)
                second = await host.call_tool("remote_whoami", {})
                assert _text(second) == "an authorized client", _text(second)
                after = file.read()
                assert after is not None and server.log()["refreshes"] == refreshes + 1
                assert after.access_token != before.access_token
                assert after.refresh_token != before.refresh_token

                # A scope not granted: nothing runs, the model is told, no silent widening.
                refused = await host.call_tool("remote_admin_reset", {})
                assert refused.is_error
                assert "permission the operator has not granted" in _text(refused)
                assert "agentrt login remote" in _text(refused)
                assert "reset done" not in _text(refused)
                stepped = file.read()
                assert stepped is not None and stepped.wanted_scope == "read admin"
                assert stepped.scope == "read"

                # The login is revoked: once the token ends, the call is UNAVAILABLE.
                server.revoke_all()
                await anyio.sleep(3.2)
                unavailable = await host.call_tool("remote_whoami", {})
                assert _text(unavailable).startswith("UNAVAILABLE"), _text(unavailable)
                assert "needs `agentrt login remote`" in _text(unavailable)
                assert "Nothing ran." in _text(unavailable)

                # A new login (asking for the wider scope) serves the running proxy at once.
                shown = await _login(server)
                assert shown  # the loopback page answered the browser
                again = await host.call_tool("remote_whoami", {})
                assert _text(again) == "an authorized client", _text(again)
                granted = await host.call_tool("remote_admin_reset", {})
                assert _text(granted) == "reset done", _text(granted)

        stderr = stderr_path.read_text()
        assert stderr.count("agentrt login remote") >= 2
        tokens = _every_token(server)
        assert len(tokens) >= 4  # two logins, a refresh between, the last refresh token
        export = subprocess.run(
            [str(AGENTRT), "--db", str(config.parent / "proxy.db"), "export"],
            env=environment, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert export.returncode == 0, export.stderr
        assert '"tool_requested"' in export.stdout or "remote_whoami" in export.stdout
        places = {
            "database": b"".join(
                path.read_bytes()
                for path in config.parent.iterdir()
                if path.name.startswith("proxy.db")
            ),
            "proxy stderr": stderr.encode(),
            "pin output": (unpinned.stderr + pinned.stdout + pinned.stderr).encode(),
            "export": export.stdout.encode(),
            "manifest": (config.parent / "remote.manifest.json").read_bytes(),
            "configuration": config.read_bytes(),
        }
        for where, content in places.items():
            for token in tokens:
                assert token.encode() not in content, f"a token was found in the {where}"


def _every_token(server: OAuthServer) -> list[str]:
    """Every bearer token the server saw (the refresh tokens are in the token file)."""
    seen = server.log()["authorization"]
    tokens = {header.removeprefix("Bearer ") for header in seen if header.startswith("Bearer ")}
    record = token_file("remote", canonical_resource(server.endpoint)).read()
    assert record is not None and record.refresh_token is not None
    tokens.update({record.refresh_token, record.access_token})
    return sorted(tokens)


async def test_no_token_passthrough_the_hosts_authorization_never_reaches_the_server(
    tmp_path: Path, state_home: Path
) -> None:
    import socket

    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    with oauth_server() as server:
        config = _config(tmp_path / "conf", server)
        environment = _environment(state_home)
        await _login(server)
        pinned = subprocess.run(
            [str(AGENTRT), "pin", "--config", str(config)],
            env=environment, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert pinned.returncode == 0, pinned.stderr
        record = token_file("remote", canonical_resource(server.endpoint)).read()
        assert record is not None
        before = len(server.log()["authorization"])  # the login's own requests
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        stderr_path = tmp_path / "proxy.stderr"
        with stderr_path.open("a") as errlog:
            proxy = subprocess.Popen(
                [str(AGENTRT), "proxy", "--config", str(config), "--http", f"127.0.0.1:{port}",
                 "--token", "proxy-token-for-hosts"],
                stdin=subprocess.DEVNULL, stderr=errlog, env=environment, cwd=tmp_path,
            )  # fmt: skip
        try:
            deadline = time.monotonic() + 30
            while "serving streamable HTTP" not in stderr_path.read_text():
                assert proxy.poll() is None, stderr_path.read_text()
                assert time.monotonic() < deadline, stderr_path.read_text()
                await anyio.sleep(0.05)
            url = f"http://127.0.0.1:{port}/mcp"
            # The upstream's own token is not the proxy's: refused at the door.
            async with httpx2.AsyncClient() as raw:
                refused = await raw.post(
                    url,
                    headers={"authorization": f"Bearer {record.access_token}",
                             "accept": "application/json, text/event-stream"},
                    json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
                )  # fmt: skip
            assert refused.status_code == 401
            client = httpx2.AsyncClient(headers={"authorization": "Bearer proxy-token-for-hosts"})
            async with (
                client,
                streamable_http_client(url, http_client=client) as (read, write),
                ClientSession(read, write) as host,
            ):
                await host.initialize()
                result = await host.call_tool("remote_whoami", {})
                assert _text(result) == "an authorized client", _text(result)
        finally:
            proxy.terminate()
            proxy.wait(timeout=20)
        seen = server.log()["authorization"][before:]
        assert seen and all(header == f"Bearer {record.access_token}" for header in seen), seen
