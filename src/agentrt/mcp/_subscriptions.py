"""`subscriptions/listen` upstream: what a server on the 2026-07-28 revision pushes.

A server on the revision has no session and no standalone stream: its list
changes and resource updates reach a client only on the response stream of a
`subscriptions/listen` request (the spec's basic/patterns/subscriptions page).
`Listen` holds one such stream open for one `Connection` while its owner runs
`Listen.run` (the proxy does; `agentrt pin` does not), asking for what the
server's discover answer advertises: `toolsListChanged`, `promptsListChanged`,
`resourcesListChanged` for each list whose `listChanged` is true, and
`resourceSubscriptions` for the URIs subscribed through the connection's
`resources/subscribe` (`subscribe`/`unsubscribe`, which a modern connection
routes here: the revision removed those methods).

The frames of the stream are told apart by `_meta["io.modelcontextprotocol/
subscriptionId"]`, the id of the listen request: the acknowledgement first,
then the events, each within what was asked and acknowledged.  Events are
coalesced while they wait (one pending entry per list and per URI) and handed
on to the connection's `on_notification`, where a 2025 session's notifications
go: one list's or one URI's at most once per `EVENT_INTERVAL` (those between
are one, handed on after it), so a flood costs a few deliveries.

A changed filter (a URI subscribed) opens a new stream before the old one is
closed, once the new one is acknowledged.  A stream that breaks, ends, or is
closed by the server is listened to again after a backoff (1 s doubling to
`MAX_BACKOFF`, said once); one that lived longer than that (an idle timeout on
the way, the HTTP client's read bound of five minutes) at once and unsaid.
Since nothing is replayed, a stream opened again after a loss is followed by
every list it covers and every URI it names being treated as changed (the
refetch the spec asks for).  A server that answers the listen request with "method not found" is
said once and not asked again on that connection's process or session.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import anyio
import anyio.abc

from ..canonical import canonical_json
from ..sanitize import sanitize
from ._connection_errors import MCPConnectionError, ServerErrorResponse
from ._jsonrpc import METHOD_NOT_FOUND

if TYPE_CHECKING:
    from ._connection import Connection

__all__ = ["MAX_BACKOFF", "SUBSCRIPTION_ID", "Listen"]

SUBSCRIPTION_ID: Final = "io.modelcontextprotocol/subscriptionId"
ACKNOWLEDGED: Final = "notifications/subscriptions/acknowledged"
RESOURCE_UPDATED: Final = "notifications/resources/updated"

MAX_BACKOFF: Final = 30.0
"""The longest wait before listening again after a stream broke or was refused."""
_FIRST_BACKOFF: Final = 1.0
_SUBSCRIBE_POLL: Final = 0.05
_NEVER: Final = float("inf")
ACK_TIMEOUT: Final = 10.0
"""How long a `subscribe` waits for the new stream's acknowledgement."""
EVENT_INTERVAL: Final = 0.5
"""The least time between two events of one list or one URI handed on; those between
are one event, handed on when it ends."""
MAX_PENDING: Final = 1024
"""Distinct events waiting at once; more are dropped (each names a subscribed URI, so this
is reached only by a host subscribed to that many)."""

# The filter member asked for each list, by the capability that advertises it.
_LISTS: Final = {
    "tools": ("toolsListChanged", "notifications/tools/list_changed"),
    "prompts": ("promptsListChanged", "notifications/prompts/list_changed"),
    "resources": ("resourcesListChanged", "notifications/resources/list_changed"),
}
_EVENT_OF_FLAG: Final = {flag: method for flag, method in _LISTS.values()}

Say = Callable[[str], None]


@dataclass(eq=False)
class _Stream:
    """One listen request: what it asked, what the server acknowledged, how it ended."""

    asked: dict[str, Any]
    request_id: int | None = None
    honored: dict[str, Any] | None = None
    acked: anyio.Event = field(default_factory=anyio.Event)
    ended: anyio.Event = field(default_factory=anyio.Event)
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    refusal: ServerErrorResponse | None = None
    failure: str | None = None  # why it broke, when it did (None: graceful, or closed here)
    closed_here: bool = False
    opened_at: float = 0.0


class Listen:
    """The upstream listen stream of one connection (see the module's docstring)."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self.uris: set[str] = set()
        """The resource URIs subscribed through the connection."""
        self._changed = anyio.Event()
        self._current: _Stream | None = None
        self._streams: list[_Stream] = []
        self._pending: dict[tuple[str, str | None], dict[str, Any]] = {}
        self._ready = anyio.Event()
        self._running = False
        self._refused_generation: int | None = None
        self._said: set[str] = set()
        self.generation = 0
        """Bumped by the connection at each handshake: a new process or session."""
        # Counted for the tests and the operator.
        self.opened = 0
        self.taken = 0
        self.delivered = 0

    # -- the owner's side ----------------------------------------------------------

    def poke(self) -> None:
        """Something the filter depends on changed (a handshake, a subscription)."""
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    async def run(
        self,
        say: Say,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Hold the stream open (and again after each loss) until cancelled; `say` gets one
        sentence for what the operator should know (a refusal, a first loss)."""
        self._running = True
        task_status.started()
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(self._pump)
                await self._hold(group, say)
        finally:
            self._running = False
            for stream in self._streams:
                stream.acked.set()

    async def subscribe(self, uri: str, *, timeout: float) -> dict[str, Any]:  # noqa: ASYNC109
        """Ask for `uri`'s updates: the stream is opened again naming it, and this returns
        once the server acknowledged that (`{}`), or raises `MCPConnectionError` in one
        sentence when it did not or could not."""
        resources = self._connection.capabilities
        resources = resources.get("resources") if isinstance(resources, dict) else None
        if not (isinstance(resources, dict) and resources.get("subscribe") is True):
            raise self._refused(uri, "the server does not offer resource subscriptions")
        if not self._running:
            raise self._refused(uri, "its updates are not being listened to")
        had = uri in self.uris  # another host's subscription to it stands in any case
        self.uris.add(uri)
        self.poke()
        why = "the server did not acknowledge a subscription to it in time"
        with anyio.move_on_after(min(timeout, ACK_TIMEOUT)):
            while True:
                stream = self._current
                if self._refused_generation == self.generation:
                    why = "the server does not offer subscriptions/listen"
                    break
                if (
                    stream is not None
                    and stream.honored is not None
                    and uri in stream.asked.get("resourceSubscriptions", ())
                ):
                    if uri in _uris(stream.honored):
                        return {}
                    why = "the server did not agree to send its updates"
                    break
                await anyio.sleep(_SUBSCRIBE_POLL)  # until the new stream is acknowledged
        if not had:
            # Refused to the caller, so not asked for either (a later subscribe asks again).
            self.uris.discard(uri)
            self.poke()
        raise self._refused(uri, why)

    async def unsubscribe(self, uri: str) -> dict[str, Any]:
        """Stop asking for `uri`'s updates (the stream is opened again without it)."""
        self.uris.discard(uri)
        self.poke()
        return {}

    # -- the connection's side -----------------------------------------------------

    def intercept(self, method: str, params: dict[str, Any]) -> bool:
        """Take a frame of a listen stream (True: the connection is done with it).  A
        notification carrying no subscription id is not one (False)."""
        meta = params.get("_meta")
        if not isinstance(meta, dict) or SUBSCRIPTION_ID not in meta:
            return method == ACKNOWLEDGED  # an acknowledgement of nothing is dropped too
        stream = self._stream_of(meta[SUBSCRIPTION_ID])
        if stream is None:
            return True  # a stream closed here, or never opened: nothing of it is wanted
        if method == ACKNOWLEDGED:
            honored = params.get("notifications")
            if stream.honored is None and isinstance(honored, dict):
                stream.honored = honored
                stream.acked.set()
            return True
        if stream.honored is None:
            return True  # the spec has the acknowledgement first: before it, nothing counts
        self._take(stream, method, params)
        return True

    def _take(self, stream: _Stream, method: str, params: dict[str, Any]) -> None:
        """Queue an event within what was asked and acknowledged, coalesced by list and URI."""
        if method == RESOURCE_UPDATED:
            uri = params.get("uri")
            if not isinstance(uri, str) or uri not in _uris(stream.honored):
                return
            key: tuple[str, str | None] = (method, uri)
            event: dict[str, Any] = {"uri": uri}
        else:
            flag = next((f for f, m in _EVENT_OF_FLAG.items() if m == method), None)
            if flag is None or not _flag(stream.honored, flag) or not stream.asked.get(flag):
                return
            key, event = (method, None), {}
        self.taken += 1
        if key in self._pending or len(self._pending) >= MAX_PENDING:
            return  # one pending event of a kind stands for all of them
        self._pending[key] = event
        self._ready.set()

    # -- holding the stream ----------------------------------------------------------

    def _filter(self) -> dict[str, Any] | None:
        """What to ask for now, or None when there is nothing to listen for (a legacy or
        dead connection, a server that refused, nothing advertised)."""
        connection = self._connection
        if connection.closing or not connection.modern or connection.needs_restart() is not None:
            return None
        if self._refused_generation == self.generation:
            return None
        capabilities = connection.capabilities
        if not isinstance(capabilities, dict):
            return None
        asked: dict[str, Any] = {}
        for capability, (flag, _method) in _LISTS.items():
            advertised = capabilities.get(capability)
            if isinstance(advertised, dict) and advertised.get("listChanged") is True:
                asked[flag] = True
        resources = capabilities.get("resources")
        if self.uris and isinstance(resources, dict) and resources.get("subscribe") is True:
            asked["resourceSubscriptions"] = sorted(self.uris)
        return asked or None

    async def _hold(self, group: anyio.abc.TaskGroup, say: Say) -> None:
        """Keep a stream open for what `_filter` asks, opening a new one when that changes
        and after each loss (backed off, said once); nothing while it asks nothing."""
        backoff = _FIRST_BACKOFF
        lost = False
        while True:
            changed = self._changed
            asked = self._filter()
            current = self._current
            if asked is None:
                self._close(current)
                self._current = None
                await changed.wait()
                continue
            if current is not None and current.asked == asked and not current.ended.is_set():
                await _either(current.ended, changed)
                if not current.ended.is_set() or current.closed_here:
                    continue  # the filter changed (or was changed back): look again
                self._current = None
                ended = current
            else:
                opened = await self._open(group, asked, say, refetch=lost)
                if opened.honored is not None:
                    lost = False  # acknowledged: whatever the loss hid was refetched
                if opened is self._current:
                    continue
                ended = opened
                if ended.refusal is not None and ended.refusal.code == METHOD_NOT_FOUND:
                    self._refused_generation = self.generation
                    self._say_once(say, f"refused {self.generation}", self._refusal(ended))
                    continue
            lost = True
            lived = anyio.current_time() - ended.opened_at
            if ended.honored is not None and lived >= MAX_BACKOFF:
                # A long-lived stream ended (an idle timeout on the way, a server's
                # restart): listened to again at once, and not worth a line.
                backoff = _FIRST_BACKOFF
                continue
            self._say_once(say, "lost", self._lost_sentence(ended))
            await self._sleep_or_change(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF)

    async def _open(
        self, group: anyio.abc.TaskGroup, asked: dict[str, Any], say: Say, *, refetch: bool
    ) -> _Stream:
        """Open a stream asking `asked` and wait for its acknowledgement (bounded); once
        acknowledged it replaces the current one, which is closed only then.  Returns it,
        current, or ended (refused, broken, closed by the server, unacknowledged)."""
        stream = _Stream(asked, opened_at=anyio.current_time())
        self._streams.append(stream)
        group.start_soon(self._listen, stream)
        with anyio.move_on_after(ACK_TIMEOUT):
            await stream.acked.wait()  # set by the acknowledgement, or by the end
        if stream.honored is None and not stream.ended.is_set():
            stream.failure = f"it was not acknowledged within {ACK_TIMEOUT:g}s"
            stream.scope.cancel()
            await stream.ended.wait()
        if stream.honored is not None:
            self._check_honored(stream, say)
            if refetch:
                self._refetch(stream)
            if not stream.ended.is_set():
                previous, self._current = self._current, stream
                self._close(previous)
        return stream

    async def _listen(self, stream: _Stream) -> None:
        """One listen request, held until the server ends it, it breaks, or it is closed here."""
        params = canonical_json({"notifications": stream.asked})
        self.opened += 1
        try:
            with stream.scope:
                await self._connection._request(
                    "subscriptions/listen", params, on_sent=lambda rid: _named(stream, rid)
                )
        except ServerErrorResponse as refused:
            stream.refusal = refused
            stream.failure = f"it was refused ({refused.server_message})"
        except MCPConnectionError as broken:
            stream.failure = sanitize(str(broken))
        except Exception as broken:  # a stream is never worth the listener's life
            stream.failure = sanitize(str(broken) or type(broken).__name__)
        finally:
            if stream.scope.cancelled_caught:
                stream.closed_here = True
            stream.ended.set()
            stream.acked.set()
            with contextlib.suppress(ValueError):
                self._streams.remove(stream)

    def _close(self, stream: _Stream | None) -> None:
        if stream is not None and not stream.ended.is_set():
            stream.closed_here = True
            stream.scope.cancel()

    def _stream_of(self, subscription_id: Any) -> _Stream | None:
        if type(subscription_id) is not int:
            return None
        return next((s for s in self._streams if s.request_id == subscription_id), None)

    def _check_honored(self, stream: _Stream, say: Say) -> None:
        assert stream.honored is not None
        missing = [
            capability
            for capability, (flag, _method) in _LISTS.items()
            if stream.asked.get(flag) and not _flag(stream.honored, flag)
        ]
        if missing:
            self._say_once(
                say,
                f"unhonored {missing}",
                f'server "{self._name()}" did not agree to tell of changes to its '
                f"{' and '.join(missing)} list; those changes are heard only at a restart",
            )

    def _refetch(self, stream: _Stream) -> None:
        """After a lost stream, nothing is replayed: treat what it covers as changed."""
        assert stream.honored is not None
        for flag, method in _EVENT_OF_FLAG.items():
            if stream.asked.get(flag) and _flag(stream.honored, flag):
                self._pending.setdefault((method, None), {})
        for uri in _uris(stream.honored):
            if uri in self.uris:
                self._pending.setdefault((RESOURCE_UPDATED, uri), {"uri": uri})
        if self._pending:
            self._ready.set()

    async def _pump(self) -> None:
        """Hand each pending event on, one at a time (a slow host holds only this task), and
        each list's or URI's at most once per `EVENT_INTERVAL`: a flood is one event then."""
        last: dict[tuple[str, str | None], float] = {}
        while True:
            await self._ready.wait()
            self._ready = anyio.Event()
            while self._pending:
                now = anyio.current_time()
                due = [k for k in self._pending if now - last.get(k, -_NEVER) >= EVENT_INTERVAL]
                if not due:
                    wake = min(last[key] for key in self._pending) + EVENT_INTERVAL
                    await anyio.sleep(max(wake - now, 0.0))
                    continue
                for key in due:
                    params = self._pending.pop(key)
                    last[key] = now
                    self.delivered += 1
                    await self._connection._handed_on(key[0], params)

    async def _sleep_or_change(self, seconds: float) -> None:
        with anyio.move_on_after(seconds):
            await self._changed.wait()

    def _say_once(self, say: Say, key: str, sentence: str) -> None:
        if key not in self._said:
            self._said.add(key)
            with contextlib.suppress(Exception):
                say(sentence)

    def _refusal(self, stream: _Stream) -> str:
        assert stream.refusal is not None
        return (
            f'server "{self._name()}" does not offer subscriptions/listen '
            f"({stream.refusal.server_message}), so its list changes and resource updates "
            "are not heard; its tools are served as listed"
        )

    def _lost_sentence(self, stream: _Stream) -> str:
        why = stream.failure or "the server ended it"
        return (
            f'the subscriptions/listen stream of server "{self._name()}" ended ({why}); it is '
            f"opened again after a backoff of up to {MAX_BACKOFF:g}s, and what it covers is "
            "listed again then (said once)"
        )

    def _refused(self, uri: str, why: str) -> MCPConnectionError:
        return MCPConnectionError(
            self._connection.server.name,
            f'the resource {sanitize(uri)} of server "{self._name()}" cannot be subscribed '
            f"to: {why}",
        )

    def _name(self) -> str:
        return sanitize(self._connection.server.name)


def _named(stream: _Stream, request_id: int) -> None:
    stream.request_id = request_id


def _flag(honored: dict[str, Any] | None, flag: str) -> bool:
    return isinstance(honored, dict) and honored.get(flag) is True


def _uris(honored: dict[str, Any] | None) -> frozenset[str]:
    uris = honored.get("resourceSubscriptions") if isinstance(honored, dict) else None
    if not isinstance(uris, list):
        return frozenset()
    return frozenset(uri for uri in uris if isinstance(uri, str))


async def _either(*events: anyio.Event) -> None:
    """Wait until any of `events` is set."""
    async with anyio.create_task_group() as either:
        for event in events:
            either.start_soon(_set_then_cancel, event, either.cancel_scope)


async def _set_then_cancel(event: anyio.Event, scope: anyio.CancelScope) -> None:
    await event.wait()
    scope.cancel()
