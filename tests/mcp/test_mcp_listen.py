"""`subscriptions/listen` upstream (`mcp/_subscriptions.py`): a server on the 2026-07-28
revision tells of list changes and resource updates only on a listen stream, which the
connection holds open while its owner runs `Listen.run`.

The SDK server (`servers/sdk_live.py`) is the real thing; the scripted one
(`hostile_stdio.py`) does what a real server would not: garbage on the stream, frames of
another subscription, a stream it ends at once, a flood, a refusal.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from servers.harness import http_server, stdio_server

from agentrt.mcp import Server
from agentrt.mcp._connection import Connection, MCPConnectionError, connect
from agentrt.mcp._revision import MODERN_REVISION

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

SDK_LIVE = Path(__file__).parent / "servers" / "sdk_live.py"
_ID = "io.modelcontextprotocol/subscriptionId"


class _Heard:
    """What the connection handed on, and the operator's sentences."""

    def __init__(self) -> None:
        self.notifications: list[tuple[str, dict[str, Any]]] = []
        self.said: list[str] = []

    async def notified(self, method: str, params: dict[str, Any]) -> None:
        self.notifications.append((method, params))

    def methods(self) -> list[str]:
        return [method for method, _ in self.notifications]

    async def wait_for(self, method: str, count: int = 1, limit: float = 15.0) -> None:
        with anyio.fail_after(limit):
            while self.methods().count(method) < count:
                await anyio.sleep(0.02)


@asynccontextmanager
async def _listening(server: Server) -> AsyncIterator[tuple[Connection, _Heard]]:
    heard = _Heard()
    connection = await connect(server)
    connection.on_notification = heard.notified
    try:
        async with anyio.create_task_group() as group:
            await group.start(connection.listen.run, heard.said.append)
            yield connection, heard
            group.cancel_scope.cancel()
    finally:
        await connection.aclose()


def _sdk_stdio(*arguments: str) -> Server:
    command = [sys.executable, str(SDK_LIVE), "stdio", *arguments]
    return Server(name="live", command=command, revision="auto")


async def _call(connection: Connection, name: str, **arguments: Any) -> str:
    result = await connection.call_tool(name, json.dumps(arguments), timeout=10)
    return str(result["content"][0]["text"])


async def test_a_modern_sdk_servers_tool_change_and_resource_update_arrive_through_listen() -> None:
    async with _listening(_sdk_stdio()) as (connection, heard):
        assert connection.modern
        assert (
            await connection.request("resources/subscribe", {"uri": "note://a"}, timeout=10) == {}
        )
        assert await _call(connection, "grow") == "grown"
        await heard.wait_for("notifications/tools/list_changed")
        assert await _call(connection, "touch", text="second") == "touched"
        await heard.wait_for("notifications/resources/updated")
        assert ("notifications/resources/updated", {"uri": "note://a"}) in heard.notifications
        names = [raw.name for raw in await connection.list_tools()]
        assert "extra" in names
        assert heard.said == []


async def test_over_the_revisions_http_the_listen_stream_carries_the_same() -> None:
    with http_server(SDK_LIVE, "http", "--stateless") as url:
        server = Server(name="live", endpoint=url, revision="auto")
        async with _listening(server) as (connection, heard):
            assert connection.protocol_version == MODERN_REVISION
            await connection.request("resources/subscribe", {"uri": "note://a"}, timeout=10)
            await _call(connection, "grow")
            await heard.wait_for("notifications/tools/list_changed")
            await _call(connection, "touch", text="second")
            await heard.wait_for("notifications/resources/updated")
            # Unsubscribed: the stream is opened again without the URI; no more updates.
            await connection.request("resources/unsubscribe", {"uri": "note://a"}, timeout=10)
            await anyio.sleep(0.5)
            before = heard.methods().count("notifications/resources/updated")
            await _call(connection, "touch", text="third")
            await _call(connection, "grow")
            await heard.wait_for("notifications/tools/list_changed", 2)
            assert heard.methods().count("notifications/resources/updated") == before


async def test_a_flood_on_the_stream_is_coalesced_and_handed_on_a_bounded_number_of_times() -> None:
    async with _listening(_sdk_stdio()) as (connection, heard):
        await connection.request("resources/subscribe", {"uri": "note://a"}, timeout=10)
        assert await _call(connection, "flood", n=2000) == "flooded"
        await heard.wait_for("notifications/resources/updated")
        await anyio.sleep(1.0)
        assert connection.listen.taken >= 100  # many frames were read...
        # ...and handed on only while the previous one of the same kind was in flight.
        assert len(heard.notifications) <= 10, heard.methods()
        # Opened once, again for the subscription, and at most once more: the SDK's server
        # ends a stream whose backlog it bounds (1024), and it is listened to again after
        # the backoff, not in a loop.
        counts = await _call(connection, "add", a=1, b=2)
        assert counts in (
            "3 (tools/list 0, subscriptions/listen 2)",
            "3 (tools/list 0, subscriptions/listen 3)",
        ), counts
        assert len(heard.said) <= 1


async def test_a_server_that_advertises_no_changes_is_not_listened_to() -> None:
    async with _listening(_sdk_stdio("--no-listen")) as (connection, heard):
        assert (await _call(connection, "add", a=1, b=2)).startswith("3 ")
        await anyio.sleep(0.5)
        assert connection.listen.opened == 0
        assert heard.said == []


async def test_a_server_that_refuses_listen_is_said_once_in_one_sentence_and_still_works(
    tmp_path: Path,
) -> None:
    refused = {"error": {"code": -32601, "message": "Method not found"}}
    async with _listening(_scripted(tmp_path / "log", refused)) as (connection, heard):
        with anyio.fail_after(10):
            while not heard.said:
                await anyio.sleep(0.02)
        assert heard.said == [
            'server "hostile" does not offer subscriptions/listen (Method not found), so its '
            "list changes and resource updates are not heard; its tools are served as listed"
        ]
        assert await _call(connection, "anything") == "ok"
        await anyio.sleep(1.5)
        assert connection.listen.opened == 1  # not asked again on this process
        assert len(heard.said) == 1


def _scripted(log: Path, listen: dict[str, Any], **capabilities: Any) -> Server:
    discovered = json.dumps(
        {
            "supportedVersions": [MODERN_REVISION],
            "capabilities": capabilities or {"tools": {"listChanged": True}},
            "_meta": {},
        }
    )
    methods = {"server/discover": {"result": discovered}, "subscriptions/listen": listen}
    return stdio_server({"log": str(log), "methods": methods}, revision="auto")


def _ack(filter_: Any, subscription: str = "{id}") -> str:
    return (
        '{"jsonrpc":"2.0","method":"notifications/subscriptions/acknowledged","params":'
        f'{{"notifications":{json.dumps(filter_)},"_meta":{{"{_ID}":{subscription}}}}}}}'
    )


def _changed(subscription: str = "{id}") -> str:
    return (
        '{"jsonrpc":"2.0","method":"notifications/tools/list_changed","params":'
        f'{{"_meta":{{"{_ID}":{subscription}}}}}}}'
    )


async def test_garbage_and_frames_of_other_subscriptions_on_the_stream_are_ignored(
    tmp_path: Path,
) -> None:
    listen = {
        "before": [
            _changed(),  # before the acknowledgement: not counted
            _ack({"toolsListChanged": True}, "999"),  # another subscription's
            "this is not JSON",
            _ack("yes"),  # no filter object: not an acknowledgement
            '{"jsonrpc":"2.0","method":"notifications/subscriptions/acknowledged","params":[]}',
            _ack({"toolsListChanged": True}),
            '{"jsonrpc":"2.0","method":"notifications/tools/list_changed","params":{}}',
            _changed("999"),
            _changed('"{id}"'),  # the id as a string is another id
            '{"jsonrpc":"2.0","method":"notifications/resources/updated","params":'
            f'{{"uri":"x://y","_meta":{{"{_ID}":{{id}}}}}}}}',  # not asked for
            _changed(),
        ],
        "never": True,
    }
    async with _listening(_scripted(tmp_path / "log", listen)) as (connection, heard):
        await heard.wait_for("notifications/tools/list_changed")
        await anyio.sleep(0.5)
        # The unstamped list_changed is an ordinary notification; the stamped ones of this
        # subscription after its acknowledgement are one event.
        assert heard.methods() == ["notifications/tools/list_changed"] * 2
        assert heard.said == []
        assert connection.listen.opened == 1


async def test_a_stream_the_server_ends_is_opened_again_after_a_backoff_and_refetched(
    tmp_path: Path,
) -> None:
    result = f'{{"resultType":"complete","_meta":{{"{_ID}":{{id}}}}}}'
    ended = f'{{"jsonrpc":"2.0","id":{{id}},"result":{result}}}'
    listen = {"before": [_ack({"toolsListChanged": True})], "line": ended}
    async with _listening(_scripted(tmp_path / "log", listen)) as (connection, heard):
        # First at once, again after 1 s, then 2 s: not a tight loop.
        await heard.wait_for("notifications/tools/list_changed", 1, limit=10)
        await anyio.sleep(2.5)
        opened = connection.listen.opened
        assert 2 <= opened <= 4, opened
        assert len(heard.said) == 1, heard.said
        assert "subscriptions/listen stream" in heard.said[0]
        assert "the server ended it" in heard.said[0]
        # Each stream opened again after a loss is followed by a listing (the refetch).
        assert heard.methods().count("notifications/tools/list_changed") >= opened - 1


async def test_a_subscription_the_server_does_not_honor_is_refused_in_one_sentence(
    tmp_path: Path,
) -> None:
    listen = {"before": [_ack({"toolsListChanged": True})], "never": True}
    server = _scripted(
        tmp_path / "log", listen, tools={"listChanged": True}, resources={"subscribe": True}
    )
    async with _listening(server) as (connection, _heard):
        with pytest.raises(MCPConnectionError, match="did not agree to send its updates"):
            await connection.request("resources/subscribe", {"uri": "note://b"}, timeout=5)
        assert connection.listen.uris == set()
    received = [json.loads(line) for line in (tmp_path / "log").read_text().splitlines()]
    asked = [
        m["params"]["notifications"] for m in received if m.get("method") == "subscriptions/listen"
    ]
    assert asked[0] == {"toolsListChanged": True}
    assert {"toolsListChanged": True, "resourceSubscriptions": ["note://b"]} in asked


async def test_the_stream_is_cancelled_when_its_owner_stops(tmp_path: Path) -> None:
    listen = {"before": [_ack({"toolsListChanged": True})], "never": True}
    log = tmp_path / "log"
    async with _listening(_scripted(log, listen)) as (connection, _heard):
        with anyio.fail_after(10):
            while connection.listen.opened == 0:
                await anyio.sleep(0.02)
        await anyio.sleep(0.3)
    received = [json.loads(line) for line in log.read_text().splitlines()]
    (listen_request,) = [m for m in received if m.get("method") == "subscriptions/listen"]
    cancelled = [m for m in received if m.get("method") == "notifications/cancelled"]
    # On stdio the spec's way: notifications/cancelled naming the listen request.
    assert [m["params"]["requestId"] for m in cancelled] == [listen_request["id"]]
