"""`HostEvents`, the proxy's side of `subscriptions/listen`, in process: the SDK's own
client listening to a low-level server whose listen handler is the proxy's."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.server.lowlevel import Server
from mcp.shared.subscriptions import ResourceUpdated, ToolsListChanged

from agentrt.proxy._listen import HostEvents

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]


class Upstream:
    """What the streams asked of the servers, and which URIs a 2025 host still holds."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []
        self.held_by_2025_hosts: set[str] = set()

    async def forward(self, method: str, uri: str) -> None:
        self.sent.append((method, uri))


def _served(events: HostEvents) -> Server[Any]:
    return Server("listen-test", on_subscriptions_listen=events.listen)


async def test_a_list_change_reaches_only_the_streams_that_asked_for_it() -> None:
    upstream = Upstream()
    events = HostEvents(upstream.forward, upstream.held_by_2025_hosts.__contains__)
    async with (
        Client(_served(events), mode="auto", cache=None) as client,
        client.listen(tools_list_changed=True) as tools,
        client.listen(prompts_list_changed=True) as prompts,
    ):
        await events.list_changed("tools")
        with anyio.fail_after(5):
            assert await tools.__anext__() == ToolsListChanged()
        await events.list_changed("prompts")
        with anyio.fail_after(5):
            # The prompts stream never saw the tools change: its first event is its own.
            assert type(await prompts.__anext__()).__name__ == "PromptsListChanged"
    assert upstream.sent == []


async def test_a_resource_is_subscribed_once_while_streams_hold_it_and_let_go_after() -> None:
    upstream = Upstream()
    events = HostEvents(upstream.forward, upstream.held_by_2025_hosts.__contains__)
    uri = "test://watched"
    async with Client(_served(events), mode="auto", cache=None) as client:
        async with client.listen(resource_subscriptions=[uri]) as first:
            async with client.listen(resource_subscriptions=[uri, uri]):
                await anyio.sleep(0.1)
                assert upstream.sent == [("resources/subscribe", uri)]
                assert events.listening[uri] == 2
            await events.resource_updated(uri)
            with anyio.fail_after(5):
                assert await first.__anext__() == ResourceUpdated(uri=uri)
            assert upstream.sent == [("resources/subscribe", uri)]
        with anyio.fail_after(5):
            while len(upstream.sent) < 2:
                await anyio.sleep(0.02)
        assert upstream.sent[-1] == ("resources/unsubscribe", uri)
        assert uri not in events.listening
        # A 2025 host's own subscription keeps the server subscribed after the stream goes.
        upstream.held_by_2025_hosts.add(uri)
        async with client.listen(resource_subscriptions=[uri]):
            await anyio.sleep(0.1)
        await anyio.sleep(0.1)
    assert upstream.sent == [("resources/subscribe", uri), ("resources/unsubscribe", uri)]


async def test_a_list_change_the_proxy_tells_its_hosts_reaches_the_listen_streams() -> None:
    # `_live.HostListeners` tells the 2025 sessions that listed, and (set by `Handlers`) the
    # 2026-07-28 hosts' listen streams; before the merge of the two, streams heard nothing.
    from agentrt.proxy._live import HostListeners

    upstream = Upstream()
    events = HostEvents(upstream.forward, upstream.held_by_2025_hosts.__contains__)
    listeners = HostListeners()
    listeners.streams = events.list_changed
    async with (
        Client(_served(events), mode="auto", cache=None) as client,
        client.listen(tools_list_changed=True) as tools,
    ):
        assert await listeners.tools_changed() == 0  # no 2025 session listed
        with anyio.fail_after(5):
            assert await tools.__anext__() == ToolsListChanged()
