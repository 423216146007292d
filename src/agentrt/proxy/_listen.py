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
import sys
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, Literal

import anyio
from anyio.streams.memory import MemoryObjectSendStream
from mcp_types import (
    INTERNAL_ERROR,
    INVALID_REQUEST,
    NotificationParams,
    PromptListChangedNotification,
    ResourceListChangedNotification,
    ResourceUpdatedNotification,
    ResourceUpdatedNotificationParams,
    SubscriptionFilter,
    SubscriptionsAcknowledgedNotification,
    SubscriptionsAcknowledgedNotificationParams,
    SubscriptionsListenRequestParams,
    SubscriptionsListenResult,
    ToolListChangedNotification,
)

__all__ = ["HostEvents", "ListenRefused"]

# Streams open at once, and events queued for one slow stream before it is ended (the host
# re-listens and lists again): the SDK's defaults are 1024 each; a proxy serves few hosts.
_MAX_STREAMS: Final = 256
_MAX_QUEUED: Final = 256
# The SDK's `mcp.shared.subscriptions.SUBSCRIPTION_ID_META_KEY`.
SUBSCRIPTION_ID_META_KEY: Final = "io.modelcontextprotocol/subscriptionId"


@dataclass(frozen=True, slots=True)
class _Event:
    """What a stream may be told: one list changed, or one resource updated."""

    kind: Literal["tools", "prompts", "resources", "updated"]
    uri: str = ""


_LISTS: Final[dict[str, _Event]] = {
    kind: _Event(kind) for kind in ("tools", "prompts", "resources")
}


class ListenRefused(Exception):
    """A listen request refused before its acknowledgement (the SDK's `MCPError`)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code, self.message, self.data = code, message, None


def _refused(code: int, message: str) -> Exception:
    # The SDK's server maps only its own `MCPError`; it is loaded whenever that server runs.
    exceptions = sys.modules.get("mcp.shared.exceptions")
    if exceptions is not None:
        error: Exception = exceptions.MCPError(code, message)
        return error
    return ListenRefused(code, message)


def _honored(requested: SubscriptionFilter) -> SubscriptionFilter:
    """The SDK's `_honored_subset`: every kind asked for, falsy ones dropped."""
    return SubscriptionFilter(
        tools_list_changed=True if requested.tools_list_changed else None,
        prompts_list_changed=True if requested.prompts_list_changed else None,
        resources_list_changed=True if requested.resources_list_changed else None,
        resource_subscriptions=list(requested.resource_subscriptions)
        if requested.resource_subscriptions
        else None,
    )


def _matches(honored: SubscriptionFilter, uris: frozenset[str], event: _Event) -> bool:
    if event.kind == "tools":
        return honored.tools_list_changed is True
    if event.kind == "prompts":
        return honored.prompts_list_changed is True
    if event.kind == "resources":
        return honored.resources_list_changed is True
    return event.uri in uris


def _frame(event: _Event, meta: dict[str, Any]) -> Any:
    """The SDK's `event_to_notification`: the stamped notification of one event."""
    if event.kind == "tools":
        return ToolListChangedNotification(params=NotificationParams(_meta=meta))
    if event.kind == "prompts":
        return PromptListChangedNotification(params=NotificationParams(_meta=meta))
    if event.kind == "resources":
        return ResourceListChangedNotification(params=NotificationParams(_meta=meta))
    return ResourceUpdatedNotification(
        params=ResourceUpdatedNotificationParams(uri=event.uri, _meta=meta)
    )


# Subscribes (or unsubscribes) one resource URI at the server offering it.
Forward = Callable[[str, str], Awaitable[None]]


class HostEvents:
    """The listen streams of 2026 hosts, and the upstream subscriptions they hold open.

    `forward(method, uri)` sends `resources/subscribe` or `resources/unsubscribe`
    to the server of `uri`; `others_subscribed(uri)` says whether a 2025 host
    still holds a subscription of its own (then the server stays subscribed)."""

    def __init__(self, forward: Forward, others_subscribed: Callable[[str], bool]) -> None:
        # Each open stream, and what its host asked to be told.
        self._streams: dict[
            MemoryObjectSendStream[_Event], tuple[SubscriptionFilter, frozenset[str]]
        ] = {}
        self._forward = forward
        self._others_subscribed = others_subscribed
        self.listening: Counter[str] = Counter()
        """How many open streams name each resource URI."""

    async def listen(
        self, ctx: Any, params: SubscriptionsListenRequestParams
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
                result = await self._stream(ctx, params)
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

    async def _stream(
        self, ctx: Any, params: SubscriptionsListenRequestParams
    ) -> SubscriptionsListenResult:
        """One stream as the SDK's `ListenHandler` serves it: the acknowledgement first (the
        stream joined before it, so nothing published meanwhile is lost), then each event
        asked for, every frame stamped with the subscription id (the request's id); a stream
        whose host stopped reading is ended at `_MAX_QUEUED`."""
        subscription_id = ctx.request_id
        if subscription_id is None:
            raise _refused(INVALID_REQUEST, "subscriptions/listen requires a request id")
        if len(self._streams) >= _MAX_STREAMS:
            raise _refused(INTERNAL_ERROR, "Subscription limit reached")
        honored = _honored(params.notifications)
        uris = frozenset(honored.resource_subscriptions or ())
        meta: dict[str, Any] = {SUBSCRIPTION_ID_META_KEY: subscription_id}
        send, receive = anyio.create_memory_object_stream[_Event](_MAX_QUEUED)
        self._streams[send] = (honored, uris)
        try:
            acknowledged = SubscriptionsAcknowledgedNotification(
                params=SubscriptionsAcknowledgedNotificationParams(
                    notifications=honored, _meta=meta
                )
            )
            await ctx.session.send_notification(acknowledged, related_request_id=subscription_id)
            async for event in receive:
                frame = _frame(event, meta)
                await ctx.session.send_notification(frame, related_request_id=subscription_id)
        finally:
            self._streams.pop(send, None)
            send.close()
            receive.close()
        return SubscriptionsListenResult(_meta=meta)

    def _publish(self, event: _Event) -> None:
        for stream, (honored, uris) in list(self._streams.items()):
            if not _matches(honored, uris, event):
                continue
            try:
                stream.send_nowait(event)
            except anyio.WouldBlock:
                # The host stopped reading: its stream ends (it re-listens and lists again).
                self._streams.pop(stream, None)
                stream.close()
            except anyio.ClosedResourceError:
                self._streams.pop(stream, None)

    async def resource_updated(self, uri: str) -> None:
        """A server said `uri` changed: every stream that named it is told."""
        self._publish(_Event("updated", uri))

    async def list_changed(self, kind: Literal["tools", "prompts", "resources"]) -> None:
        """What hosts may see of one list changed: every stream that asked is told."""
        self._publish(_LISTS[kind])

    def close(self) -> None:
        """The proxy stops: each stream ends gracefully (its result is its last frame)."""
        for stream in list(self._streams):
            stream.close()
