"""`subscriptions/listen`: what changes the proxy tells a host on the 2026-07-28 revision.

A 2026 host has no session for notifications; it opens a listen stream and
names what it wants told (the tool, prompt and resource lists changing, and
updates of resources it names).  The SDK's `ListenHandler` serves the stream
(acknowledgement first, every frame stamped with the subscription id, only
the kinds asked for); `HostEvents` is the proxy's side of it: a resource a
listening host names is subscribed at its server while anyone listens (as a
2025 host's `resources/subscribe` is), the server's update is published to
the streams, and a list change is published when what hosts may see changed
(`list_changed`, for whoever reloads the lists).
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, Final, Literal

import anyio
from mcp.server.context import ServerRequestContext
from mcp.server.subscriptions import (
    InMemorySubscriptionBus,
    ListenHandler,
    PromptsListChanged,
    ResourcesListChanged,
    ResourceUpdated,
    ServerEvent,
    ToolsListChanged,
)
from mcp_types import SubscriptionsListenRequestParams, SubscriptionsListenResult

__all__ = ["HostEvents"]

# Streams open at once, and events queued for one slow stream before it is ended (the host
# re-listens and lists again): the SDK's defaults are 1024 each; a proxy serves few hosts.
_MAX_STREAMS: Final = 256
_MAX_QUEUED: Final = 256
_LISTS: Final[dict[str, ServerEvent]] = {
    "tools": ToolsListChanged(),
    "prompts": PromptsListChanged(),
    "resources": ResourcesListChanged(),
}

# Subscribes (or unsubscribes) one resource URI at the server offering it.
Forward = Callable[[str, str], Awaitable[None]]


class HostEvents:
    """The listen streams of 2026 hosts, and the upstream subscriptions they hold open.

    `forward(method, uri)` sends `resources/subscribe` or `resources/unsubscribe`
    to the server of `uri`; `others_subscribed(uri)` says whether a 2025 host
    still holds a subscription of its own (then the server stays subscribed)."""

    def __init__(self, forward: Forward, others_subscribed: Callable[[str], bool]) -> None:
        self._bus = InMemorySubscriptionBus()
        self._streams = ListenHandler(
            self._bus, max_subscriptions=_MAX_STREAMS, max_buffered_events=_MAX_QUEUED
        )
        self._forward = forward
        self._others_subscribed = others_subscribed
        self.listening: Counter[str] = Counter()
        """How many open streams name each resource URI."""

    async def listen(
        self, ctx: ServerRequestContext[Any], params: SubscriptionsListenRequestParams
    ) -> SubscriptionsListenResult:
        """Serve one listen stream until the host leaves (or the proxy stops)."""
        uris = list(dict.fromkeys(params.notifications.resource_subscriptions or ()))
        subscribed: list[str] = []

        async def subscribe() -> None:
            for uri in uris:
                # Counted first: a server may send the first update before it answers.
                self.listening[uri] += 1
                subscribed.append(uri)
                if self.listening[uri] == 1 and not self._others_subscribed(uri):
                    # A URI no server offers is acknowledged and never fires, as the SDK's
                    # own handler treats it; the host learns nothing of what exists.
                    with contextlib.suppress(Exception):
                        await self._forward("resources/subscribe", uri)

        try:
            async with anyio.create_task_group() as group:
                # After the stream's first step, which joins the bus before it acknowledges:
                # an update the server sends while it answers the subscribe is not lost.
                group.start_soon(subscribe)
                result = await self._streams(ctx, params)
            return result
        finally:
            for uri in subscribed:
                self.listening[uri] -= 1
                if self.listening[uri] <= 0:
                    del self.listening[uri]
                    if not self._others_subscribed(uri):
                        # The host is gone; a server that refuses changes nothing for anyone.
                        with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                            await self._forward("resources/unsubscribe", uri)

    async def resource_updated(self, uri: str) -> None:
        """A server said `uri` changed: every stream that named it is told."""
        await self._bus.publish(ResourceUpdated(uri=uri))

    async def list_changed(self, kind: Literal["tools", "prompts", "resources"]) -> None:
        """What hosts may see of one list changed: every stream that asked is told."""
        await self._bus.publish(_LISTS[kind])

    def close(self) -> None:
        """The proxy stops: each stream ends gracefully (its result is its last frame)."""
        self._streams.close()
