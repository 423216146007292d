"""Through `agentrt proxy`: a server on the 2026-07-28 revision (the official SDK's, in its
stateless mode over HTTP, and on the revision over stdio) tells of its changes only on a
`subscriptions/listen` stream, which the proxy holds open (`mcp/_subscriptions.py`); its
list changes are held to the pins as a 2025 session's are, and a resource update reaches
the host that subscribed to it, without a restart.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client, ClientSession
from mcp.shared.subscriptions import ResourceUpdated, ToolsListChanged
from proxy_helpers import ProxySetup, build_setup, host_session, text_of, write_private
from test_proxy_hosts import http_proxy

from agentrt.mcp import Server, pin
from agentrt.mcp._revision import MODERN_REVISION
from agentrt.store import open_store

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120), pytest.mark.slow]

SDK_LIVE = Path(__file__).resolve().parents[1] / "mcp" / "servers" / "sdk_live.py"
HOSTILE_STDIO = SDK_LIVE.parent / "hostile_stdio.py"
RULES = {
    name: {"side_effect": "read_only"} for name in ("add", "grow", "redescribe", "touch", "flood")
}


@pytest.fixture(params=["stdio", "http"])
def live(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """The server's entry in proxy.json: started by the proxy on the revision (stdio), or
    serving the SDK's stateless HTTP on a free port."""
    if request.param == "stdio":
        yield {"command": [sys.executable, str(SDK_LIVE), "stdio"]}
        return
    process = subprocess.Popen(
        [sys.executable, str(SDK_LIVE), "http", "--stateless"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert process.stdout is not None
        yield {"endpoint": f"http://127.0.0.1:{int(process.stdout.readline())}/mcp"}
    finally:
        process.kill()
        process.wait()


class _Host:
    """The SDK's client as a 2025 host, keeping the proxy's notifications."""

    def __init__(self) -> None:
        self.tools_changed = 0
        self.updated: list[str] = []
        self.session: ClientSession

    async def on_message(self, message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            self.tools_changed += 1
        if isinstance(message, types.ResourceUpdatedNotification):
            self.updated.append(str(message.params.uri))

    async def names(self) -> set[str]:
        return {tool.name for tool in (await self.session.list_tools()).tools}


@asynccontextmanager
async def _host(setup: ProxySetup) -> AsyncIterator[_Host]:
    watching = _Host()
    async with host_session(setup, watching.on_message) as (session, _):
        watching.session = session
        yield watching


async def _until(condition: Any, seconds: float = 30.0) -> None:
    with anyio.fail_after(seconds):
        while not condition():
            await anyio.sleep(0.05)


async def _setup(root: Path, live: dict[str, Any]) -> ProxySetup:
    """The test upstream "up" beside the live server, pinned over the revision."""
    manifest = await pin(Server(name="live", revision="auto", connect_timeout=20.0, **live))
    assert manifest.revision == "2026-07-28"
    setup = await build_setup(root)
    write_private(setup.root / "conf" / "live.manifest.json", manifest.to_json())
    entry = {"name": "live", **live, "revision": "auto", "default_timeout": "10s"}
    setup.rewrite(
        servers=[
            *setup.document["servers"],
            {**entry, "manifest": "live.manifest.json", "rules": RULES},
        ]
    )
    return setup


async def test_a_modern_servers_changes_reach_the_host_through_listen_held_to_the_pins(
    tmp_path: Path, live: dict[str, Any]
) -> None:
    setup = await _setup(tmp_path, live)
    async with _host(setup) as host:
        assert {"live_add", "live_grow", "live_touch"} <= await host.names()
        await host.session.subscribe_resource("note://a")
        touched = await host.session.call_tool("live_touch", {"text": "second"})
        assert text_of(touched) == "touched"
        await _until(lambda: host.updated)
        read = await host.session.read_resource("note://a")
        # A tool added while serving: listed again (said on stderr), unpinned, invisible,
        # and the host is not told (what it may see did not change).
        await host.session.call_tool("live_grow", {})
        await _until(lambda: "extra is not pinned" in setup.stderr())
        assert "live_extra" not in await host.names()
        assert host.tools_changed == 0
        # A description changed while serving: refused, and the host told.
        await host.session.call_tool("live_redescribe", {})
        await _until(lambda: host.tools_changed == 1)
        after = await host.names()
        refused = await host.session.call_tool("live_add", {"a": 1, "b": 2})
        other = await host.session.call_tool("up_echo", {"text": "other server"})
    assert host.updated[0] == "note://a"
    assert isinstance(read.contents[0], types.TextResourceContents)
    assert read.contents[0].text == "second"
    assert "live_add" not in after and "live_touch" in after
    assert refused.is_error and "Nothing ran." in text_of(refused)
    assert text_of(other) == "other server"
    with open_store(setup.database, create=False) as store:
        events = store.list_events("server:live", limit=10)
        store.verify_chain()
    assert [dict(event.payload)["unpinned"] for event in events] == [["extra"], ["extra"]]
    assert "subscriptions/listen" not in setup.stderr()  # nothing went wrong to say


async def test_a_modern_server_that_refuses_listen_is_said_once_and_served_as_listed(
    tmp_path: Path,
) -> None:
    discovered = json.dumps(
        {
            "supportedVersions": [MODERN_REVISION],
            "capabilities": {"tools": {"listChanged": True}},
            "_meta": {},
        }
    )
    scenario = {
        "methods": {
            "server/discover": {"result": discovered},
            "subscriptions/listen": {"error": {"code": -32601, "message": "Method not found"}},
        }
    }
    command = [sys.executable, str(HOSTILE_STDIO), json.dumps(scenario)]
    manifest = await pin(Server(name="refusing", command=command, revision="auto"))
    setup = await build_setup(tmp_path)
    write_private(setup.root / "conf" / "refusing.manifest.json", manifest.to_json())
    rules = {name: {"side_effect": "read_only"} for name in manifest.tools}
    setup.rewrite(
        servers=[
            *setup.document["servers"],
            {
                "name": "refusing",
                "command": command,
                "revision": "auto",
                "manifest": "refusing.manifest.json",
                "rules": rules,
            },
        ]
    )
    async with _host(setup) as host:
        await _until(lambda: "subscriptions/listen" in setup.stderr())
        ran = await host.session.call_tool("refusing_ok", {})
        other = await host.session.call_tool("up_echo", {"text": "other server"})
        await anyio.sleep(1.5)  # not asked again, not said again
    assert text_of(ran) == "ok"
    assert text_of(other) == "other server"
    said = [line for line in setup.stderr().splitlines() if "subscriptions/listen" in line]
    assert said == [
        'agentrt proxy: server "refusing" does not offer subscriptions/listen (Method not '
        "found), so its list changes and resource updates are not heard; its tools are "
        "served as listed"
    ]


@pytest.mark.parametrize("live", ["http"], indirect=True)
async def test_a_2026_hosts_listen_stream_is_told_of_a_modern_servers_changes(
    tmp_path: Path, live: dict[str, Any]
) -> None:
    setup = await _setup(tmp_path, live)
    async with http_proxy(setup) as url, Client(url, mode="auto", cache=None) as client:
        async with client.listen(
            tools_list_changed=True, resource_subscriptions=["note://a"]
        ) as stream:
            assert stream.honored.resource_subscriptions == ["note://a"]
            await client.call_tool("live_touch", {"text": "second"})
            with anyio.fail_after(30):
                updated = await stream.__anext__()
            await client.call_tool("live_redescribe", {})
            with anyio.fail_after(30):
                changed = await stream.__anext__()
        names = {tool.name for tool in (await client.list_tools()).tools}
    assert isinstance(updated, ResourceUpdated) and updated.uri == "note://a"
    assert isinstance(changed, ToolsListChanged)
    assert "live_add" not in names and "live_touch" in names
