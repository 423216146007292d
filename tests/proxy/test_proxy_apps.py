"""MCP Apps (`io.modelcontextprotocol/ui`) behind the proxy: pinned, offered only to a host
that renders apps, read through the gate, and the app's own calls governed.

The upstream is a small MCP Apps server written with the official Python SDK
(tests/proxy/servers/apps_server.py); the hosts are the SDK's `Client` over
stdio, one advertising the extension and one not.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from click.testing import CliRunner
from mcp import Client, ClientSession
from mcp.client.extension import ClientExtension
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError
from proxy_helpers import host_environment, serving_http, text_of, write_private

from agentrt.cli import cli
from agentrt.mcp import Manifest, Server, pin
from agentrt.store import open_store

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120), pytest.mark.slow]

APPS_SERVER = Path(__file__).parent / "servers" / "apps_server.py"
APP_URI = "ui://board/app.html"
APP_MIME = "text/html;profile=mcp-app"
AGENTRT = Path(sys.executable).parent / "agentrt"


class RendersApps(ClientExtension):
    """What a host that renders MCP Apps advertises."""

    identifier = "io.modelcontextprotocol/ui"

    def settings(self) -> dict[str, Any]:
        return {"mimeTypes": [APP_MIME]}


@dataclass
class AppsSetup:
    root: Path
    config: Path
    html: Path
    log: Path
    manifest: Manifest

    def client(self, *, apps: bool, mode: str = "auto") -> Client:
        parameters = StdioServerParameters(
            command=str(AGENTRT),
            args=["proxy", "--config", str(self.config)],
            env=host_environment(),
            cwd=str(self.root),
        )
        return Client(
            parameters,
            mode=mode,  # type: ignore[arg-type]
            cache=None,
            extensions=[RendersApps()] if apps else None,
        )

    def stderr(self) -> str:
        path = self.root / "proxy.stderr"
        return path.read_text() if path.exists() else ""

    def pinned_cards(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []


@pytest.fixture
async def apps(tmp_path: Path) -> AppsSetup:
    conf = tmp_path / "conf"
    conf.mkdir()
    html = tmp_path / "app.html"
    html.write_text("<!doctype html><p>board v1</p>")
    log = tmp_path / "cards.log"
    env = [f"APPS_HTML={html}", f"APPS_LOG={log}"]
    command = [sys.executable, str(APPS_SERVER)]
    manifest = await pin(Server(name="apps", command=command, env=env, connect_timeout=30.0))
    write_private(conf / "apps.manifest.json", manifest.to_json())
    document = {
        "database": "proxy.db",
        "session": "apps",
        "hold": "300ms",  # a held call is answered PENDING_APPROVAL after this, not 15 s
        "policy": {
            "read_only": "allow",
            "local_mutation": "require_approval",
            "remote_mutation": "require_approval",
            "destructive": "deny",
        },
        "servers": [
            {
                "name": "apps",
                "command": command,
                "env": env,
                "default_timeout": "10s",
                "manifest": "apps.manifest.json",
                "rules": {
                    "show_board": {"side_effect": "read_only"},
                    "pin_card": {"side_effect": "local_mutation"},
                    "count_cards": {"side_effect": "read_only"},
                },
            }
        ],
    }
    config = write_private(conf / "proxy.json", json.dumps(document))
    return AppsSetup(tmp_path, config, html, log, manifest)


def _chain_verifies(setup: AppsSetup) -> None:
    with open_store(setup.root / "conf" / "proxy.db", create=False) as store:
        store.verify_chain()


def _ui(tool: Any) -> Any:
    return (tool.meta or {}).get("ui")


async def test_the_pin_keeps_each_apps_content_hash_and_a_manifest_without_apps_has_none(
    apps: AppsSetup,
) -> None:
    pinned = apps.manifest.apps
    assert pinned is not None and list(pinned) == [APP_URI]
    assert pinned[APP_URI].tools == ("pin_card", "show_board")
    assert Manifest.from_json(apps.manifest.to_json()) == apps.manifest
    without = Manifest(server="x", pinned_at=apps.manifest.pinned_at, tools={})
    assert '"apps"' not in without.to_json()


async def test_an_app_is_offered_only_to_a_host_that_renders_apps(apps: AppsSetup) -> None:
    async with apps.client(apps=True) as client:
        listed = {tool.name: tool for tool in (await client.list_tools()).tools}
        resources = [str(resource.uri) for resource in (await client.list_resources()).resources]
        read = await client.read_resource(APP_URI)
        shown = await client.call_tool("apps_show_board", {})
    assert _ui(listed["apps_show_board"]) == {"resourceUri": APP_URI}
    assert _ui(listed["apps_pin_card"]) == {"resourceUri": APP_URI, "visibility": ["app"]}
    assert listed["apps_count_cards"].meta is None
    assert resources == [APP_URI]
    [content] = read.contents
    assert content.text == "<!doctype html><p>board v1</p>"
    assert content.mime_type == APP_MIME
    assert text_of(shown) == "the board has 2 cards"

    async with apps.client(apps=False) as client:
        plain = {tool.name: tool for tool in (await client.list_tools()).tools}
        hidden = [str(resource.uri) for resource in (await client.list_resources()).resources]
        with pytest.raises(MCPError, match="there is no resource"):
            await client.read_resource(APP_URI)
    # The tool stays for every host; only its app is withheld.
    assert {"apps_show_board", "apps_pin_card", "apps_count_cards"} <= set(plain)
    assert all(_ui(tool) is None for tool in plain.values())
    assert hidden == []
    # The app's read is a recorded, read-only run of the proxy's resource tool.
    with open_store(apps.root / "conf" / "proxy.db", create=False) as store:
        reads = [
            run
            for run in store.list_runs()
            for step in store.list_steps(run.run_id)
            if step.tool == "resource--apps"
        ]
    assert len(reads) == 1
    _chain_verifies(apps)


async def test_a_2025_host_that_renders_apps_is_offered_the_app_too(apps: AppsSetup) -> None:
    async with apps.client(apps=True, mode="legacy") as client:
        assert client.protocol_version.startswith("2025-")
        listed = {tool.name: tool for tool in (await client.list_tools()).tools}
        read = await client.read_resource(APP_URI)
    assert _ui(listed["apps_show_board"]) == {"resourceUri": APP_URI}
    assert read.contents[0].text == "<!doctype html><p>board v1</p>"


async def test_an_app_originated_write_is_held_for_approval(apps: AppsSetup) -> None:
    # The app's button calls pin_card through the host: an ordinary tools/call.
    async with apps.client(apps=True) as client:
        held = await client.call_tool("apps_pin_card", {"text": "ship it"})
    assert text_of(held).startswith("PENDING_APPROVAL: ")
    assert apps.pinned_cards() == []
    _chain_verifies(apps)


async def test_an_app_that_changes_between_listing_and_read_is_refused(apps: AppsSetup) -> None:
    async with apps.client(apps=True) as client:
        listed = {tool.name for tool in (await client.list_tools()).tools}
        assert "apps_show_board" in listed
        apps.html.write_text("<!doctype html><script>steal()</script>")
        with pytest.raises(MCPError) as refused:
            await client.read_resource(APP_URI)
        counted = await client.call_tool("apps_count_cards", {})
    assert f"the app {APP_URI} changed since it was pinned" in str(refused.value)
    assert "nothing was forwarded" in str(refused.value)
    assert "steal" not in str(refused.value)
    # Nothing else was harmed: another tool of the server still answers, the chain verifies.
    assert text_of(counted) == "2"
    _chain_verifies(apps)


async def test_an_app_changed_since_the_pin_refuses_its_tools_at_start(apps: AppsSetup) -> None:
    apps.html.write_text("<!doctype html><p>board v2</p>")
    parameters = StdioServerParameters(
        command=str(AGENTRT), args=["proxy", "--config", str(apps.config)],
        env=host_environment(), cwd=str(apps.root),
    )  # fmt: skip
    with (apps.root / "proxy.stderr").open("a") as errlog:
        async with (
            stdio_client(parameters, errlog=errlog) as (read_stream, write_stream),
            ClientSession(read_stream, write_stream) as session,
        ):
            await session.initialize()
            listed = {tool.name for tool in (await session.list_tools()).tools}
            counted = await session.call_tool("apps_count_cards", {})
    assert "apps_show_board" not in listed and "apps_pin_card" not in listed
    assert text_of(counted) == "2"
    stderr = apps.stderr()
    assert (
        f"apps: refused show_board: its app {APP_URI} changed since it was pinned "
        "(its contents' SHA-256 differs); review it and pin again"
    ) in stderr


BASIC_APP_SERVER = (
    Path(__file__).resolve().parents[1]
    / "npm/node_modules/@modelcontextprotocol/server-basic-vanillajs/dist/index.js"
)


async def test_the_official_basic_mcp_app_server_is_pinned_and_served_to_an_apps_host(
    tmp_path: Path,
) -> None:
    # @modelcontextprotocol/server-basic-vanillajs (tests/npm/package.json), over stdio.
    conf = tmp_path / "conf"
    conf.mkdir()
    command = ["node", str(BASIC_APP_SERVER), "--stdio"]
    manifest = await pin(Server(name="basic", command=command, connect_timeout=30.0))
    assert manifest.apps is not None
    [uri] = manifest.apps
    assert uri.startswith("ui://") and manifest.apps[uri].tools == ("get-time",)
    write_private(conf / "basic.manifest.json", manifest.to_json())
    document = {
        "database": "proxy.db",
        "session": "basic",
        "servers": [
            {
                "name": "basic",
                "command": command,
                "default_timeout": "10s",
                "manifest": "basic.manifest.json",
                "rules": {"get-time": {"side_effect": "read_only", "rename": "get_time"}},
            }
        ],
    }
    config = write_private(conf / "proxy.json", json.dumps(document))
    setup = AppsSetup(tmp_path, config, tmp_path / "unused", tmp_path / "unused", manifest)
    async with setup.client(apps=True) as client:
        [tool] = [tool for tool in (await client.list_tools()).tools if tool.name == "get_time"]
        read = await client.read_resource(uri)
        timed = await client.call_tool("get_time", {})
    assert _ui(tool)["resourceUri"] == uri
    [content] = read.contents
    assert content.mime_type == APP_MIME and "<html" in content.text.lower()
    assert timed.is_error is False
    async with setup.client(apps=False) as client:
        [plain] = [tool for tool in (await client.list_tools()).tools if tool.name == "get_time"]
    assert _ui(plain) is None
    with open_store(conf / "proxy.db", create=False) as store:
        store.verify_chain()


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_over_http_the_app_is_offered_by_each_requests_own_capabilities(
    apps: AppsSetup, mode: str
) -> None:
    # 2026 hosts are stateless (the capabilities ride each request); 2025 hosts have sessions.
    with serving_http(apps.config, apps.root) as (url, _stderr):
        async with Client(url, mode=mode, cache=None, extensions=[RendersApps()]) as client:  # type: ignore[arg-type]
            listed = {tool.name: tool for tool in (await client.list_tools()).tools}
            read = await client.read_resource(APP_URI)
        async with Client(url, mode=mode, cache=None) as plain:  # type: ignore[arg-type]
            withheld = {tool.name: tool for tool in (await plain.list_tools()).tools}
            resources = (await plain.list_resources()).resources
    assert _ui(listed["apps_show_board"]) == {"resourceUri": APP_URI}
    assert read.contents[0].text == "<!doctype html><p>board v1</p>"
    assert _ui(withheld["apps_show_board"]) is None and resources == []


async def test_a_repin_shows_a_changed_app_and_writes_its_new_hash_only_when_agreed(
    apps: AppsSetup,
) -> None:
    manifest_path = apps.root / "conf" / "apps.manifest.json"
    before = manifest_path.read_bytes()
    runner = CliRunner()
    unchanged = await anyio.to_thread.run_sync(
        lambda: runner.invoke(cli, ["pin", "--config", str(apps.config)])
    )
    assert "unchanged since it was pinned" in unchanged.output, unchanged.output
    apps.html.write_text("<!doctype html><p>board v2</p>")
    declined = await anyio.to_thread.run_sync(
        lambda: runner.invoke(cli, ["pin", "--config", str(apps.config)], input="n\n")
    )
    assert f'changed app "{APP_URI}"' in declined.output, declined.output
    assert "named by: pin_card, show_board" in declined.output
    assert manifest_path.read_bytes() == before
    agreed = await anyio.to_thread.run_sync(
        lambda: runner.invoke(cli, ["pin", "--config", str(apps.config), "--yes"])
    )
    assert agreed.exit_code == 0, agreed.output
    repinned = Manifest.from_json(manifest_path.read_bytes())
    assert repinned.apps is not None and apps.manifest.apps is not None
    assert repinned.apps[APP_URI].content_hash != apps.manifest.apps[APP_URI].content_hash


async def test_a_resource_rule_denying_ui_uris_denies_the_apps_read(apps: AppsSetup) -> None:
    document = json.loads(apps.config.read_text())
    document["servers"][0]["resource_rules"] = [{"uri": "ui://*", "outcome": "deny"}]
    write_private(apps.config, json.dumps(document))
    async with apps.client(apps=True) as client:
        with pytest.raises(MCPError, match=r"^DENIED"):
            await client.read_resource(APP_URI)
        shown = await client.call_tool("apps_show_board", {})
    # The tool itself is still the tool; only its app's read is refused, and recorded.
    assert text_of(shown) == "the board has 2 cards"
    with open_store(apps.root / "conf" / "proxy.db", create=False) as store:
        denied = [
            step
            for run in store.list_runs()
            for step in store.list_steps(run.run_id)
            if step.tool == "resource--apps"
        ]
    assert len(denied) == 1 and denied[0].status == "denied"
    _chain_verifies(apps)


async def test_a_manifest_repinned_while_serving_holds_the_apps_to_their_pins(
    apps: AppsSetup,
) -> None:
    # The new manifest pins board v2 (pinned from a copy serving it); the running server
    # still serves v1, so taking the manifest reads an app its pin does not match.
    other = apps.root / "app-v2.html"
    other.write_text("<!doctype html><p>board v2</p>")
    command = [sys.executable, str(APPS_SERVER)]
    repinned = await pin(
        Server(name="apps", command=command, env=[f"APPS_HTML={other}", f"APPS_LOG={apps.log}"],
               connect_timeout=30.0)
    )  # fmt: skip
    assert repinned.apps is not None and apps.manifest.apps is not None
    assert repinned.apps[APP_URI].content_hash != apps.manifest.apps[APP_URI].content_hash
    told = anyio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            told.set()

    parameters = StdioServerParameters(
        command=str(AGENTRT), args=["proxy", "--config", str(apps.config)],
        env=host_environment(), cwd=str(apps.root),
    )  # fmt: skip
    with (apps.root / "proxy.stderr").open("a") as errlog:
        transport = stdio_client(parameters, errlog=errlog)
        # A 2025 host, so the list change comes on its session (a 2026-07-28 host's needs
        # a listen stream).
        async with Client(
            transport, mode="legacy", cache=None, extensions=[RendersApps()],
            message_handler=on_message,
        ) as client:  # fmt: skip
            before = {tool.name: tool for tool in (await client.list_tools()).tools}
            write_private(apps.root / "conf" / "apps.manifest.json", repinned.to_json())
            with anyio.fail_after(30):
                while "server apps: took its new manifest" not in apps.stderr():
                    await anyio.sleep(0.1)
            after = {tool.name for tool in (await client.list_tools()).tools}
            assert "apps_show_board" not in after and "apps_pin_card" not in after
            refused = await client.call_tool("apps_show_board", {})
            counted = await client.call_tool("apps_count_cards", {})
            with anyio.fail_after(10):
                await told.wait()
    assert _ui(before["apps_show_board"]) == {"resourceUri": APP_URI}
    assert "apps_count_cards" in after
    assert refused.is_error and "Nothing ran." in text_of(refused), text_of(refused)
    assert text_of(counted) == "2"
    stderr = apps.stderr()
    assert (
        f"agentrt proxy: apps: refused show_board: its app {APP_URI} changed since it was "
        "pinned (its contents' SHA-256 differs); review it and pin again"
    ) in stderr.splitlines()
    assert "agentrt proxy: server apps: took its new manifest" in stderr.splitlines()
    _chain_verifies(apps)
