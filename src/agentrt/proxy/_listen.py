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
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

import anyio
from anyio.streams.memory import MemoryObjectSendStream

from ._modern_plain import SUBSCRIPTION_ID_META_KEY, honored_filter
from ._plain import INTERNAL_ERROR, INVALID_REQUEST

__all__ = ["HostEvents", "ListenRefused"]

# Streams open at once, and events queued for one slow stream before it is ended (the host
# re-listens and lists again): the SDK's defaults are 1024 each; a proxy serves few hosts.
_MAX_STREAMS: Final = 256
_MAX_QUEUED: Final = 256


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


def _requested(params: Any) -> Mapping[str, Any]:
    """A listen request's filter as the host sent it: from its params object (the front,
    `_modern_plain`) or its params model (the SDK's server, or the models' fallback)."""
    if isinstance(params, Mapping):
        requested: Mapping[str, Any] = params["notifications"]
        return requested
    dumped: dict[str, Any] = params.notifications.model_dump(by_alias=True, exclude_none=True)
    return dumped


def _matches(honored: Mapping[str, Any], uris: frozenset[str], event: _Event) -> bool:
    if event.kind == "tools":
        return honored.get("toolsListChanged") is True
    if event.kind == "prompts":
        return honored.get("promptsListChanged") is True
    if event.kind == "resources":
        return honored.get("resourcesListChanged") is True
    return event.uri in uris


_LIST_CHANGED: Final = {
    "tools": "notifications/tools/list_changed",
    "prompts": "notifications/prompts/list_changed",
    "resources": "notifications/resources/list_changed",
}
_ACKNOWLEDGED: Final = "notifications/subscriptions/acknowledged"
_UPDATED: Final = "notifications/resources/updated"


def _frame(event: _Event, meta: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The SDK's `event_to_notification`: the stamped notification of one event, as its
    model dumps it (method, params)."""
    if event.kind == "updated":
        return _UPDATED, {"_meta": meta, "uri": event.uri}
    return _LIST_CHANGED[event.kind], {"_meta": meta}


# Each frame's model, for a session that takes only models (the SDK's).
_FRAME_MODELS: Final = {
    _ACKNOWLEDGED: "SubscriptionsAcknowledgedNotification",
    _UPDATED: "ResourceUpdatedNotification",
    _LIST_CHANGED["tools"]: "ToolListChangedNotification",
    _LIST_CHANGED["prompts"]: "PromptListChangedNotification",
    _LIST_CHANGED["resources"]: "ResourceListChangedNotification",
}


async def _send(session: Any, frame: tuple[str, dict[str, Any]], subscription_id: Any) -> None:
    """One frame to the stream's host: as JSON to the front's session (`send_frame`), as
    the SDK's notification model to the SDK's session."""
    method, params = frame
    send_frame = getattr(session, "send_frame", None)
    if send_frame is not None:
        await send_frame(method, params)
        return
    import mcp_types as types

    model = getattr(types, _FRAME_MODELS[method])
    notification = model.model_validate({"method": method, "params": params}, by_name=False)
    await session.send_notification(notification, related_request_id=subscription_id)


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
            MemoryObjectSendStream[_Event], tuple[dict[str, Any], frozenset[str]]
        ] = {}
        self._forward = forward
        self._others_subscribed = others_subscribed
        self.listening: Counter[str] = Counter()
        """How many open streams name each resource URI."""

    async def listen(self, ctx: Any, params: Any) -> dict[str, Any]:
        """Serve one listen stream until the host leaves (or the proxy stops); its result as
        the SDK's `SubscriptionsListenResult` dumps it."""
        requested = _requested(params)
        uris = list(dict.fromkeys(requested.get("resourceSubscriptions") or ()))
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
                result = await self._stream(ctx, requested)
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

    async def _stream(self, ctx: Any, requested: Mapping[str, Any]) -> dict[str, Any]:
        """One stream as the SDK's `ListenHandler` serves it: the acknowledgement first (the
        stream joined before it, so nothing published meanwhile is lost), then each event
        asked for, every frame stamped with the subscription id (the request's id); a stream
        whose host stopped reading is ended at `_MAX_QUEUED`."""
        subscription_id = ctx.request_id
        if subscription_id is None:
            raise _refused(INVALID_REQUEST, "subscriptions/listen requires a request id")
        if len(self._streams) >= _MAX_STREAMS:
            raise _refused(INTERNAL_ERROR, "Subscription limit reached")
        honored = honored_filter(requested)
        uris = frozenset(honored.get("resourceSubscriptions", ()))
        meta: dict[str, Any] = {SUBSCRIPTION_ID_META_KEY: subscription_id}
        send, receive = anyio.create_memory_object_stream[_Event](_MAX_QUEUED)
        self._streams[send] = (honored, uris)
        try:
            acknowledged = (_ACKNOWLEDGED, {"_meta": meta, "notifications": honored})
            await _send(ctx.session, acknowledged, subscription_id)
            async for event in receive:
                await _send(ctx.session, _frame(event, meta), subscription_id)
        finally:
            self._streams.pop(send, None)
            send.close()
            receive.close()
        return {"_meta": meta, "resultType": "complete"}

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
