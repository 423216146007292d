"""The client side of one MCP session, reading every answer from the bytes the server sent.

This is agentrt's own small JSON-RPC 2.0 client rather than the SDK's session:
the SDK's stdio transport cannot give an exact environment, set a
parent-death signal or always kill the process group, and its models round
numbers through float64, drop unknown keys and reject a whole `tools/list`
page for one bad tool.  Pins and results must come from the raw bytes
(docs/decisions/0003-mcp-client-transport.md).

The interface the pin/load code builds on:

- `await connect(server, on_step=..., on_started=...)` starts the stdio
  server (or opens the HTTP client), performs the `initialize` handshake
  advertising no client capabilities, and sends `notifications/initialized`;
  or, per `server.revision` (`_revision`, docs/decisions/0036), finds with
  `server/discover` a server on the 2026-07-28 revision, which has no
  handshake: every request then carries the `_meta` envelope (`modern`).
  `on_step` is told each step ("starting the server", "performing the
  handshake") so the caller's single deadline can name the one that timed
  out; `on_started` receives the `Connection` before the handshake, so a
  caller whose deadline fires during it can still read `stderr_tail()`.  If
  `connect` fails or is cancelled, everything it started is stopped.
- `Connection.list_tools()` pages `tools/list` and returns one `RawTool`
  per listed element, well-formed or not, in order.  The whole listing
  fails (`ProtocolViolation`) only for what makes it untrustworthy as a
  whole: a page that is not an object or has no `tools` array, a tool name
  listed twice, more than `MAX_TOOL_PAGES` pages, a repeated cursor, more
  than `MAX_TOOLS` tools.
- `Connection.call_tool(name, arguments_json, timeout=...)` sends
  `tools/call` with the arguments spliced in as the exact text given and
  returns the `result` as parsed by `parse_json`.  On timeout it sends
  `notifications/cancelled` and raises `CallTimeout`; a JSON-RPC error
  raises `ServerErrorResponse`.  Several calls may be in flight at once.
- `Connection.aclose()` is idempotent, safe from several tasks at once and
  while calls are in flight (they fail with `ConnectionClosed`).
- Every error is an `MCPConnectionError` whose message names the server;
  connect and listing errors of a stdio server end with the tail of its
  stderr when that is kept.

Server-to-client requests are answered with an error (`ping` with `{}`);
nothing answers sampling, elicitation or roots on the operator's behalf.  A
caller that does answer them (the proxy, under the operator's rule) passes a
`CallContext` with an `ask` to its `call_tool`, and the server's request made
while that call is the only one in flight (or, over HTTP, on that call's own
stream) is handed to it; any other is refused.  A call whose server answers
with an input-required result (the 2026-07-28 revision's way of asking) has
each of its requests handed to that `ask` the same way, and is retried with
the answers and the server's `requestState` (at most `MAX_INPUT_ROUNDS`
rounds, within the call's timeout); refused or unanswered, the
input-required result is returned as it came.  A server's log line goes to
the `log` of the context of the request whose read (stdio) or stream (HTTP)
delivered it: the transport names that request to `_notified`.  `request()`
sends any other client request (prompts, resources, completion, logging) and
returns its result as parsed; `list_all()` pages a listing.  Notifications
other than progress and logging go to `on_notification` when set, else are
dropped.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final, Protocol

import anyio

from ..canonical import JSONBoundaryError, canonical_json, parse_json
from ..sanitize import sanitize
from . import _revision
from ._connection_errors import (
    CallTimeout,
    ConnectionClosed,
    HeaderMismatchRefused,
    MCPConnectionError,
    NotSent,
    ProtocolViolation,
    RefusedRedirect,
    ServerErrorResponse,
)
from ._context import Ask, AskRefused, CallContext, Progress
from ._handshake import (
    FIRST_REQUEST_ID,
    HANDSHAKE_PROTOCOL_VERSIONS,
    client_info,
    initialize_params,
)
from ._jsonrpc import (
    METHOD_NOT_FOUND,
    Incoming,
    IncomingKind,
    answer_server_request,
    encode_answer,
    encode_notification,
    encode_request,
)
from ._server import Server
from ._stdio import start_stdio
from ._subscriptions import Listen

__all__ = [
    "MAX_TOOLS",
    "MAX_TOOL_PAGES",
    "AskRefused",
    "CallTimeout",
    "Connection",
    "ConnectionClosed",
    "HeaderMismatchRefused",
    "MCPConnectionError",
    "NotSent",
    "ProtocolViolation",
    "RawTool",
    "ServerErrorResponse",
    "connect",
]

MAX_TOOL_PAGES: Final = 100
"""More pages than this fail the listing: a server that pages forever cannot hold the client."""

MAX_TOOLS: Final = 1000
"""A listing with more tools than this fails rather than growing without bound."""

CANCEL_NOTICE_TIMEOUT: Final = 1.0
"""How long sending `notifications/cancelled` may take before it is given up."""


class _Transport(Protocol):
    async def request(
        self,
        request_id: int,
        method: str,
        message: bytes,
        headers: Mapping[str, str] | None = None,
        listen: bool = False,
    ) -> Incoming: ...

    async def send(self, message: bytes) -> None: ...

    async def aclose(self, *, polite: bool = True) -> None: ...

    def stderr_tail(self) -> str: ...

    def dead(self) -> str | None: ...

    def negotiated(self, protocol_version: str) -> None: ...

    async def read_idle(self, *, pushes: bool) -> str | None: ...

    def error_status(self, request_id: int) -> int | None: ...

    # Handed each message the server sent unasked, with the id of the request whose
    # read (stdio) or stream (HTTP) delivered it.
    listener: Callable[[Incoming, int], Awaitable[None]] | None


# How many input-required rounds one call may take, as the official SDK's client allows.
MAX_INPUT_ROUNDS: Final = 10


def _input_required(result: Any) -> bool:
    return isinstance(result, dict) and result.get("resultType") == "input_required"


# How long one progress callback may hold the reader (a slow host must not stall the server).
_PROGRESS_CALLBACK_SECONDS: Final = 1.0


@dataclass(frozen=True, slots=True)
class RawTool:
    """One element of a `tools/list` result exactly as the server sent it.

    `raw` is the element as parsed by `parse_json`: exact keys, number
    literals kept (int or Decimal).  It is normally an object, but anything a
    server listed is kept so the caller can refuse it on its own.  `name` is
    the `name` member when `raw` is an object and that member is a string,
    else None.  `page` and `position` (both from 0) locate it in the listing.
    """

    name: str | None
    raw: Any
    page: int
    position: int


class Connection:
    """One live session with one MCP server; close it with `aclose()`.

    `protocol_version` is the version the server chose at the handshake;
    `server_info` and `capabilities` are its `serverInfo` and
    `capabilities` as parsed (None when absent), for reports only.
    """

    def __init__(
        self,
        server: Server,
        transport: _Transport,
    ) -> None:
        self.server = server
        self._transport = transport
        self._progress: dict[str, Progress] = {}
        self._next_progress = 0
        # The askers of the calls in flight that answer the server's own requests.
        self._askers: list[Ask] = []
        # The context of each request in flight that carries one, by request id: a
        # message is handed to the context of the request that read it.
        self._contexts: dict[int, CallContext] = {}
        self.on_notification: Callable[[str, dict[str, Any]], Awaitable[None]] | None = None
        transport.listener = self._notified
        self._closing: anyio.Event | None = None
        # Set (and replaced) when a restart makes a new transport live, and on close.
        self._transport_changed = anyio.Event()
        self._live = False  # the handshake of the current transport completed
        self._next_id = FIRST_REQUEST_ID - 1
        self.protocol_version: str | None = None
        self.server_info: Any = None
        self.capabilities: Any = None
        # The 2026-07-28 revision: no session, every request carries `_meta`.
        self.modern = False
        self._envelope: dict[str, Any] = {}
        # The revision's `subscriptions/listen` stream, held while an owner runs it.
        self.listen = Listen(self)
        # One sentence each for what the server sent that the client set aside (a bad
        # discover answer, a bad cache hint, a tool with bad x-mcp-header annotations).
        self.notes: list[str] = []
        # Modern listing pages kept per their ttlMs: (method, cursor) -> (until, result).
        self._listings: dict[tuple[str, str | None], tuple[float, Any]] = {}
        # Per tool, the argument paths its schema mirrors into Mcp-Param-* headers.
        self._header_maps: dict[str, dict[tuple[str, ...], str]] = {}
        # Told a listing made to retry a call its server refused for its headers; returns
        # why the tool may not be called now ("" when it may): the owner's pins (`Upstream`).
        self.on_tools_relisted: Callable[[str, list[RawTool]], str] | None = None

    # -- public ----------------------------------------------------------------

    async def aclose(self, *, polite: bool = True) -> None:
        """End the session and, for stdio, the server's whole process group.

        Idempotent; several tasks may call it at once (all return once it is
        done); a call in flight fails with `ConnectionClosed`.  The shutdown
        runs shielded: cancelling a caller never leaves a server half-stopped.
        `polite=False` kills a stdio server without the graces (end of stdin,
        then SIGTERM), also when a polite close is already waiting through them:
        for a process whose own host is about to kill it.
        """
        if self._closing is not None:
            if not polite:
                await self._transport.aclose(polite=False)
            await self._closing.wait()
            return
        self._closing = anyio.Event()
        self._transport_changed.set()
        try:
            with anyio.CancelScope(shield=True):
                await self._transport.aclose(polite=polite)
        finally:
            self._closing.set()

    @property
    def closing(self) -> bool:
        """Whether `aclose()` began."""
        return self._closing is not None

    def stderr_tail(self) -> str:
        """The escaped last few KiB of a stdio server's stderr when kept here, else ""."""
        return self._transport.stderr_tail()

    def needs_restart(self) -> str | None:
        """Why the server must be started again before its next request (it exited,
        was killed, or its session broke), or None.  Never once `aclose()` began."""
        if self._closing is not None:
            return None
        if not self._live:
            return f'the session with server "{self._name()}" is not established'
        return self._transport.dead()

    async def restart(self, *, context: CallContext | None = None) -> None:
        """Stop what is left of a dead session, start the server again and perform the handshake.

        The caller bounds it and lists the tools again itself.  On failure the
        session stays dead (`needs_restart()` says so), and a later call may
        try again.  Refused with `NotSent` once `aclose()` began.  `context`:
        the call the restart is for, whose `log` gets the lines read meanwhile.
        """
        if self._closing is not None:
            raise NotSent(self.server.name, f'the connection to server "{self._name()}" is closed')
        self._live = False
        with anyio.CancelScope(shield=True):
            # Its session is over: no grace for a server that may still be alive.
            await self._transport.aclose(polite=False)
        if self.server.command is not None:
            self._transport = start_stdio(self.server)
        else:
            from ._http import open_http  # httpx2: only for a server over HTTP

            self._transport = open_http(self.server)
        try:
            await self._handshake(context)
        except MCPConnectionError as exc:
            with anyio.CancelScope(shield=True):
                await self._transport.aclose()
            raise self._with_stderr(exc) from None
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._transport.aclose()
            raise
        if self._closing is not None:
            # aclose() ran while the handshake was under way and closed the old transport.
            with anyio.CancelScope(shield=True):
                await self._transport.aclose()
            raise NotSent(self.server.name, f'the connection to server "{self._name()}" is closed')
        self.listen.poke()  # a new process or session: its listen stream is opened again
        self._live = True
        changed, self._transport_changed = self._transport_changed, anyio.Event()
        changed.set()

    async def watch_idle(self, on_lost: Callable[[str], None] | None = None) -> None:
        """Read what the server sends while no request is in flight, for the connection's
        life and across restarts, so a notification sent between requests is handled at
        once (docs/decisions/0049).  Over stdio the server's stdout is read; over HTTP, a
        legacy session whose server advertises list changes or subscriptions holds the
        standalone GET stream open.  `on_lost` is told, in one sentence, when the server's
        side ended while no request was reading (it exited, closed its stdout): the next
        request starts it again, as after a death mid-call.  Returns once `aclose()` began."""
        while self._closing is None:
            changed = self._transport_changed
            transport = self._transport
            if self._live:
                lost = await transport.read_idle(pushes=self._pushes())
                if lost is not None and on_lost is not None and transport is self._transport:
                    with contextlib.suppress(Exception):
                        on_lost(lost)
            await changed.wait()

    def _pushes(self) -> bool:
        """Whether the server said it may send something unasked: a list change or a
        resource subscription (a legacy session's capabilities)."""
        capabilities = self.capabilities if isinstance(self.capabilities, dict) else {}
        for kind in ("tools", "prompts", "resources"):
            offered = capabilities.get(kind)
            if isinstance(offered, dict) and (
                offered.get("listChanged") is True or offered.get("subscribe") is True
            ):
                return not self.modern
        return False

    async def list_tools(self, *, context: CallContext | None = None) -> list[RawTool]:
        """Every tool the server lists, in order, one `RawTool` per element, malformed ones too.

        `context`: the call the listing is for, whose `log` gets the lines read meanwhile."""
        try:
            return await self._list_tools(context)
        except MCPConnectionError as exc:
            raise self._with_stderr(exc) from None

    async def call_tool(
        self,
        name: str,
        arguments_json: str,
        *,
        timeout: float,  # noqa: ASYNC109 - the call's own bound, named by the interface
        progress: Progress | None = None,
        context: CallContext | None = None,
    ) -> dict[str, Any]:
        """Call one tool and return its `result` object as parsed from the server's bytes.

        `arguments_json` must be the text of a JSON object; it is sent as
        written.  After `timeout` seconds the request is cancelled with
        `notifications/cancelled` and `CallTimeout` is raised.  With `progress`
        (or the `context`'s), the request carries a `progressToken` and each of
        the server's `notifications/progress` for it is handed to it (bounded,
        errors ignored).  The `context`'s `log` and `ask` receive the server's log
        lines and requests during the call (see the module's docstring).
        """
        try:
            arguments = parse_json(arguments_json)
        except JSONBoundaryError as exc:
            raise ValueError(f"the arguments are not usable JSON: {exc}") from None
        if not isinstance(arguments, dict):
            raise ValueError("the arguments must be a JSON object")
        return await self.call_tool_checked(
            name, arguments_json, timeout=timeout, progress=progress, context=context
        )

    async def call_tool_checked(
        self,
        name: str,
        arguments_json: str,
        *,
        timeout: float,  # noqa: ASYNC109 - the call's own bound, named by the interface
        progress: Progress | None = None,
        context: CallContext | None = None,
        on_retry: Callable[[str], None] | None = None,
    ) -> dict[str, Any]:
        """`call_tool` for a caller that has already parsed `arguments_json` through
        `parse_json` and found an object (a `ServerTool`): the same call, without the
        second parse.  On the revision's HTTP, a call the server refused before running
        it for headers that disagree with its body is retried once after the tools are
        listed again (`_retry_after_header_mismatch`); `on_retry` is told so, in one
        sentence, for the call's record."""
        if progress is None and context is not None:
            progress = context.progress
        # The host's trace context (traceparent, tracestate), carried upstream in `_meta`.
        meta: dict[str, Any] = dict(context.trace or {}) if context is not None else {}
        token = ""
        if progress is not None:
            self._next_progress += 1
            token = f"agentrt-{self._next_progress}"
            self._progress[token] = progress
            meta["progressToken"] = token
        params = f'{{"name":{canonical_json(name)},"arguments":{arguments_json}}}'
        asker = context.ask if context is not None else None
        if asker is not None:
            self._askers.append(asker)
        deadline = anyio.current_time() + timeout
        try:
            try:
                result = await self._request(
                    "tools/call", params, limit=timeout, context=context, meta=meta
                )
            except ServerErrorResponse as refused:
                if not (
                    self.modern
                    and self.server.endpoint is not None
                    and _revision.refused_before_running(refused.code, refused.http_status)
                ):
                    raise
                result = await self._retry_after_header_mismatch(
                    name, params, deadline, context, meta, on_retry
                )
            for _round in range(MAX_INPUT_ROUNDS):
                if asker is None or not _input_required(result):
                    break
                # The server asks in its result (the 2026-07-28 revision): each request goes
                # to the asker as if sent alone; the call is retried with the answers.
                retry = await self._answered(asker, result, deadline)
                if retry is None:
                    break  # refused or unanswered: the input-required result stands
                remaining = max(deadline - anyio.current_time(), 0.001)
                result = await self._request(
                    "tools/call",
                    params[:-1] + "," + retry[1:],
                    limit=remaining,
                    context=context,
                    meta=meta,
                )
        finally:
            self._progress.pop(token, None)
            if asker is not None:
                self._askers.remove(asker)
        if not isinstance(result, dict):
            raise ProtocolViolation(
                self.server.name,
                f'server "{self._name()}" answered tools/call for "{sanitize(name)}" '
                "with a result that is not an object",
            )
        return result

    async def _retry_after_header_mismatch(
        self,
        name: str,
        params: str,
        deadline: float,
        context: CallContext | None,
        meta: dict[str, Any],
        on_retry: Callable[[str], None] | None,
    ) -> Any:
        """The spec's answer to a `HeaderMismatchError` the server sent before running the
        call: list the tools again (their `x-mcp-header` annotations may have changed), hold
        the tool to the owner's pins (`on_tools_relisted`), and send the call once more, at
        most once.  Refused again, or refused by the pins, it ends in one sentence; nothing
        ran either way."""
        shown = f'server "{self._name()}" refused tools/call for "{sanitize(name)}"'
        self.forget_listings()
        try:
            with anyio.fail_after(max(deadline - anyio.current_time(), 0.001)):
                listing = await self._list_tools(context)
        except (MCPConnectionError, TimeoutError) as exc:
            raise HeaderMismatchRefused(
                self.server.name,
                f"{shown} because its headers disagree with its body (HeaderMismatch), and "
                f"listing its tools again failed ({sanitize(str(exc))}); nothing ran",
            ) from None
        refusal = self.on_tools_relisted(name, listing) if self.on_tools_relisted else ""
        if refusal:
            raise HeaderMismatchRefused(
                self.server.name,
                f"{shown} because its headers disagree with its body (HeaderMismatch), and "
                f"listed again the tool is refused: {sanitize(refusal)}; nothing ran",
            )
        if on_retry is not None:
            on_retry(
                f"{shown} because its headers disagreed with its body (HeaderMismatch), before "
                "running it; its tools were listed again and the call was sent once more"
            )
        remaining = max(deadline - anyio.current_time(), 0.001)
        try:
            return await self._request(
                "tools/call", params, limit=remaining, context=context, meta=meta
            )
        except ServerErrorResponse as again:
            if not _revision.refused_before_running(again.code, again.http_status):
                raise
            raise HeaderMismatchRefused(
                self.server.name,
                f"{shown} twice because its headers disagree with its body (HeaderMismatch), "
                "also after its tools were listed again; nothing ran",
            ) from None

    async def _answered(self, asker: Ask, result: dict[str, Any], deadline: float) -> str | None:
        """The `inputResponses` and `requestState` members (as JSON object text) answering
        an input-required `result`, or None when one of its requests is refused or the
        call's deadline passes first."""
        requests = result.get("inputRequests")
        responses: dict[str, Any] = {}
        if requests is not None and not isinstance(requests, dict):
            return None
        with anyio.move_on_after(max(deadline - anyio.current_time(), 0.0)):
            for key, request in (requests or {}).items():
                method = request.get("method") if isinstance(request, dict) else None
                if not isinstance(method, str):
                    return None
                try:
                    responses[key] = await asker(method, request.get("params"))
                except AskRefused:
                    return None
            retry: dict[str, Any] = {"inputResponses": responses}
            if "requestState" in result:
                retry["requestState"] = result["requestState"]  # the server's own, verbatim
            return canonical_json(retry)
        return None

    async def request(
        self,
        method: str,
        params: Any = None,
        *,
        timeout: float,  # noqa: ASYNC109 - the request's own bound, like call_tool's
        context: CallContext | None = None,
    ) -> Any:
        """Send one client request (`prompts/get`, `resources/read`, ...) and return its
        `result` as parsed from the server's bytes; `params` is plain JSON or None.

        After `timeout` seconds it is cancelled and `CallTimeout` raised; a
        JSON-RPC error raises `ServerErrorResponse`.  The `context`'s `log` gets
        the server's log lines read while it waits."""
        if self.modern and method in ("resources/subscribe", "resources/unsubscribe"):
            # The revision removed both: a subscription is a URI the listen stream names.
            uri = params.get("uri") if isinstance(params, dict) else None
            if not isinstance(uri, str):
                raise ValueError(f"{method} needs a resource URI")
            if method == "resources/unsubscribe":
                return await self.listen.unsubscribe(uri)
            return await self.listen.subscribe(uri, timeout=timeout)
        meta = None
        if self.modern and isinstance(params, dict) and isinstance(params.get("_meta"), dict):
            # The envelope joins the caller's own `_meta` (the envelope's keys win).
            params = dict(params)
            meta = params.pop("_meta")
        params_json = None if params is None else canonical_json(params)
        return await self._request(method, params_json, limit=timeout, context=context, meta=meta)

    async def list_all(self, method: str, key: str, *, timeout: float) -> list[Any]:  # noqa: ASYNC109
        """Every element of a paged listing (`prompts/list` → `prompts`), bounded like
        `list_tools`: at most `MAX_TOOL_PAGES` pages and `MAX_TOOLS` elements, no
        repeated cursor.  Refused whole (`ProtocolViolation`) when malformed."""
        elements: list[Any] = []
        cursors: set[str] = set()
        cursor: str | None = None
        with anyio.fail_after(timeout):
            for page in range(MAX_TOOL_PAGES):
                result = await self._listing_page(method, cursor, limit=timeout, context=None)
                where = f'the {method} of server "{self._name()}" is refused: page {page + 1}'
                if not isinstance(result, dict) or not isinstance(result.get(key), list):
                    raise ProtocolViolation(self.server.name, f'{where} has no "{key}" array')
                elements.extend(result[key])
                if len(elements) > MAX_TOOLS:
                    raise ProtocolViolation(
                        self.server.name, f"{where}: more than {MAX_TOOLS} elements"
                    )
                next_cursor = result.get("nextCursor")
                if next_cursor is None or next_cursor == "":
                    return elements
                if not isinstance(next_cursor, str) or next_cursor in cursors:
                    raise ProtocolViolation(
                        self.server.name, f"{where} has a bad or repeated cursor"
                    )
                cursors.add(next_cursor)
                cursor = next_cursor
        raise ProtocolViolation(
            self.server.name,
            f'the {method} of server "{self._name()}" has more than {MAX_TOOL_PAGES} pages',
        )

    # -- the handshake ---------------------------------------------------------

    async def _handshake(self, context: CallContext | None = None) -> None:
        """Agree on the era per `server.revision` (docs/decisions/0036-upstream-revisions.md).

        "auto": probe with `server/discover` and stay modern on a discover result naming
        the 2026-07-28 revision; on anything else that is not a modern error (another
        error, a 4xx without one, garbage, no answer within the probe's bound), perform
        the `initialize` handshake, and probe again if the server refuses that (a late
        answer to the first probe may have set it on the revision).  "session": the
        handshake first, and the probe only when the server refuses it.  "legacy": the
        handshake alone."""
        self.modern = False
        self._listings.clear()
        self._header_maps.clear()
        self.listen.generation += 1
        if self.server.revision == "auto" and await self._discover(context):
            return
        if self.server.revision == "legacy":
            await self._initialize(context)
            return
        try:
            await self._initialize(context)
        except (ServerErrorResponse, ProtocolViolation) as refused:
            # A modern-only server refuses the handshake (the spec has it name its versions);
            # so does a dual-era stdio server that took a probe "auto" gave up on waiting
            # for (slow to start) and is serving the revision since.
            if isinstance(refused, RefusedRedirect) or not await self._discover(context):
                raise
            self.notes.clear()

    async def _discover(self, context: CallContext | None) -> bool:
        name = self._name()
        limit = _revision.DISCOVER_TIMEOUT
        deadline = anyio.current_effective_deadline()
        if deadline != float("inf"):
            limit = min(limit, max((deadline - anyio.current_time()) / 2, 0.001))
        capabilities = dict(self.server.client_capabilities or {})
        meta = _revision.envelope(client_info(), capabilities)
        try:
            with anyio.move_on_after(limit) as probe:
                result = await self._request(
                    "server/discover", canonical_json({"_meta": meta}), context=context,
                    headers=_revision.request_headers("server/discover", None, None),
                )  # fmt: skip
        except ServerErrorResponse as refused:
            supported = _revision.unsupported_versions(refused.code, refused.data)
            if supported is not None and not set(supported) & set(HANDSHAKE_PROTOCOL_VERSIONS):
                # A modern server that shares no revision with this client: nothing to fall to.
                shown = ", ".join(sanitize(v) for v in supported) or "none"
                raise ProtocolViolation(
                    self.server.name,
                    f'server "{name}" speaks only protocol versions {shown}, which this '
                    f"client does not speak (it speaks {_revision.MODERN_REVISION} and the "
                    "initialize handshake)",
                ) from None
            return False  # not found or refused: a legacy server
        except RefusedRedirect:
            raise
        except ProtocolViolation as violation:
            # An HTTP 4xx without a modern error, or an answer this client cannot read.
            self.notes.append(
                f'server "{name}" answered server/discover with something that is not a '
                f"discover result ({sanitize(str(violation))}); it is spoken to over the "
                "initialize handshake"
            )
            return False
        if probe.cancelled_caught:
            self.notes.append(
                f'server "{name}" did not answer server/discover within {limit:g}s; '
                "it is spoken to over the initialize handshake"
            )
            return False
        discovered = _revision.read_discover(self.server.name, result)
        if not isinstance(discovered, _revision.Discovered):
            if not (isinstance(result, dict) and isinstance(result.get("supportedVersions"), list)):
                self.notes.append(
                    f'server "{name}" answered server/discover with a result that is not a '
                    "discover result naming a protocol version this client speaks; it is "
                    "spoken to over the initialize handshake"
                )
            return False
        self.modern = True
        self.protocol_version = _revision.MODERN_REVISION
        self.capabilities = discovered.capabilities
        self.server_info = discovered.server_info
        self._envelope = meta
        return True

    async def _initialize(self, context: CallContext | None = None) -> None:
        # Over stdio a server started early was sent this request at its spawn (`_spawn`).
        result = await self._request("initialize", initialize_params(self.server), context=context)
        if not isinstance(result, dict):
            raise ProtocolViolation(
                self.server.name,
                f'server "{self._name()}" answered initialize with a result that is not an object',
            )
        version = result.get("protocolVersion")
        if not isinstance(version, str) or version not in HANDSHAKE_PROTOCOL_VERSIONS:
            shown = sanitize(version) if isinstance(version, str) else "no version"
            raise ProtocolViolation(
                self.server.name,
                f'server "{self._name()}" chose protocol version {shown}, which this client '
                f"does not speak (it speaks {', '.join(HANDSHAKE_PROTOCOL_VERSIONS)})",
            )
        self.protocol_version = version
        self.server_info = result.get("serverInfo")
        self.capabilities = result.get("capabilities")
        self._transport.negotiated(version)
        await self._transport.send(encode_notification("notifications/initialized", None))

    # -- listing ---------------------------------------------------------------

    async def _list_tools(self, context: CallContext | None) -> list[RawTool]:
        tools: list[RawTool] = []
        names: set[str] = set()
        cursors: set[str] = set()
        cursor: str | None = None
        for page in range(MAX_TOOL_PAGES):
            result = await self._listing_page("tools/list", cursor, limit=None, context=context)
            if not isinstance(result, dict):
                raise self._listing_error(f"page {page + 1} is not an object")
            # Exact keys: a page with "Tools" and no "tools" lists nothing a
            # reader could agree on; with both, only "tools" counts.
            if "tools" not in result:
                raise self._listing_error(f'page {page + 1} has no "tools" member')
            elements = result["tools"]
            if not isinstance(elements, list):
                raise self._listing_error(f'page {page + 1}\'s "tools" is not an array')
            if len(tools) + len(elements) > MAX_TOOLS:
                raise self._listing_error(f"it offers more than {MAX_TOOLS} tools")
            for position, element in enumerate(elements):
                name = element.get("name") if isinstance(element, dict) else None
                if not isinstance(name, str):
                    name = None
                elif (
                    self.modern
                    and self.server.endpoint is not None
                    and not self._headers_ok(name, element)
                ):
                    continue
                elif name in names:
                    raise self._listing_error(f'it lists the tool "{sanitize(name)}" twice')
                else:
                    names.add(name)
                tools.append(RawTool(name=name, raw=element, page=page, position=position))
            next_cursor = result.get("nextCursor")
            if next_cursor is None or next_cursor == "":
                return tools
            if not isinstance(next_cursor, str):
                raise self._listing_error(f'page {page + 1}\'s "nextCursor" is not a string')
            if next_cursor in cursors:
                raise self._listing_error(
                    f'page {page + 1} repeats the cursor "{sanitize(next_cursor)}"'
                )
            cursors.add(next_cursor)
            cursor = next_cursor
        raise self._listing_error(f"it has more than {MAX_TOOL_PAGES} pages")

    def _headers_ok(self, name: str, element: dict[str, Any]) -> bool:
        """Whether a tool listed over the revision's HTTP may be kept: one whose
        `x-mcp-header` annotations are invalid is left out, as the spec requires, and said."""
        problem = _revision.x_mcp_header_problem(element)
        if problem is not None:
            self._header_maps.pop(name, None)
            note = (
                f'server "{self._name()}" lists the tool "{sanitize(name)}" with invalid '
                f"x-mcp-header annotations ({sanitize(problem)}); it is left out"
            )
            if note not in self.notes:
                self.notes.append(note)
            return False
        header_map = _revision.x_mcp_header_map(element)
        if header_map:
            self._header_maps[name] = header_map
        else:
            self._header_maps.pop(name, None)
        return True

    def _listing_error(self, reason: str) -> ProtocolViolation:
        return ProtocolViolation(
            self.server.name, f'the tool listing of server "{self._name()}" is refused: {reason}'
        )

    # -- requests --------------------------------------------------------------

    async def _request(
        self,
        method: str,
        params_json: str | None,
        *,
        limit: float | None = None,
        context: CallContext | None = None,
        meta: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        keep_hints: bool = False,
        on_sent: Callable[[int], None] | None = None,
    ) -> Any:
        """Send one request; `meta` goes in its params' `_meta` (with the revision's envelope
        on a modern connection, whose HTTP headers are derived here unless given).  A modern
        result loses the revision's own members (`_revision.transport_members`; the cache
        hints only unless `keep_hints`), so results are the same on either revision."""
        if self.modern:
            meta = {**(meta or {}), **self._envelope}
            if headers is None and self.server.endpoint is not None:
                headers = self._modern_headers(method, params_json)
        if meta:
            params_json = _with_meta(params_json, meta)
        self._next_id += 1
        request_id = self._next_id
        message = encode_request(request_id, method, params_json)
        if context is not None:
            self._contexts[request_id] = context
        if on_sent is not None:
            on_sent(request_id)  # before it goes: its first frame may come before its answer
        try:
            # (What `anyio.fail_after` does, without its two generator layers.)
            bound = anyio.CancelScope(
                deadline=float("inf") if limit is None else anyio.current_time() + limit
            )
            with bound:
                answer = await self._transport.request(
                    request_id, method, message, headers, listen=self._listens(context)
                )
            if bound.cancelled_caught and anyio.current_time() >= bound.deadline:
                raise TimeoutError
        except TimeoutError:
            if limit is None:
                raise  # not ours: no bound was set here
            await self._send_cancelled(request_id, f"no answer within {limit:g}s")
            raise CallTimeout(
                self.server.name,
                f'server "{self._name()}" did not answer {method} within {limit:g}s; '
                "the request was cancelled",
            ) from None
        except anyio.get_cancelled_exc_class():
            # The protocol forbids cancelling initialize and server/discover; connect closes
            # the session instead, and an abandoned probe's late answer is dropped.
            if method not in ("initialize", "server/discover"):
                await self._send_cancelled(request_id, "the caller gave up")
            raise
        finally:
            if context is not None:
                del self._contexts[request_id]
        if answer.error is not None:
            error = ServerErrorResponse(self.server.name, method, answer.error)
            error.http_status = self._transport.error_status(request_id)
            raise error
        self._transport.error_status(request_id)  # nothing kept for an answered request
        if self.modern:
            return _revision.without_transport_members(answer.result, keep_hints=keep_hints)
        return answer.result

    async def _notified(self, message: Incoming, read_by: int) -> None:
        """A server's notification: progress goes to the call that asked for it, a log line
        to the context of the request that read it (`read_by`); the rest is dropped (a
        listener that raised would hand the server a way to kill the session).  A server's
        request is answered here."""
        context = self._contexts.get(read_by)
        if message.kind is IncomingKind.REQUEST:
            await self._answer_request(message, context)
            return
        if message.params is None and message.method is not None:
            # A notification may have no params at all (tools/list_changed, as the SDKs
            # send it): it still goes to the listener, with empty ones.
            message = dataclasses.replace(message, params={})
        if not isinstance(message.params, dict):
            return
        if (
            self.modern
            and message.method is not None
            and self.listen.intercept(message.method, message.params)
        ):
            return  # a frame of a listen stream: its events are handed on from there
        if message.method == "notifications/message":
            await self._logged(message.params, context)
            return
        if message.method != "notifications/progress":
            if message.method is not None:
                await self._handed_on(message.method, message.params)
            return
        token = message.params.get("progressToken")
        listener = self._progress.get(token) if isinstance(token, str) else None
        value = message.params.get("progress")
        if listener is None or isinstance(value, bool) or not isinstance(value, (int, Decimal)):
            return
        total = message.params.get("total")
        text = message.params.get("message")
        with anyio.move_on_after(_PROGRESS_CALLBACK_SECONDS), contextlib.suppress(Exception):
            await listener(
                float(value),
                float(total)
                if isinstance(total, (int, Decimal)) and not isinstance(total, bool)
                else None,
                text if isinstance(text, str) else None,
            )

    async def _handed_on(self, method: str, params: dict[str, Any]) -> None:
        """A list change or another notification for `on_notification` (bounded; what it
        raises is dropped), from a session or a listen stream alike."""
        if method.endswith("/list_changed"):
            self._listings.clear()  # whatever was kept per its ttlMs is stale now
        notified = self.on_notification
        if notified is not None:
            with anyio.move_on_after(_PROGRESS_CALLBACK_SECONDS), contextlib.suppress(Exception):
                await notified(method, params)

    async def _answer_request(self, message: Incoming, context: CallContext | None) -> None:
        """Answer the server's request: ping at once; sampling, elicitation or roots through
        the asker of the one call it can belong to, if any; anything else refused.
        `context` is that of the request whose read or stream delivered it."""
        if message.method == "ping":
            await self._transport.send(answer_server_request(message))
            return
        asker: Ask | None = None
        if len(self._askers) == 1:
            asker = self._askers[0]
        elif (
            self.server.endpoint is not None
            and context is not None
            and context.ask is not None
            and context.ask in self._askers
        ):
            # Over HTTP the request arrived on the stream of that call's own request.
            asker = context.ask
        if asker is None:
            await self._transport.send(answer_server_request(message))
            return
        try:
            answer = encode_answer(
                message.server_request_id, result=await asker(message.method or "", message.params)
            )
        except AskRefused as refused:
            answer = encode_answer(
                message.server_request_id,
                error={"code": refused.code, "message": refused.message},
            )
        except Exception:
            answer = encode_answer(
                message.server_request_id,
                error={"code": METHOD_NOT_FOUND, "message": "the request could not be answered"},
            )
        with contextlib.suppress(MCPConnectionError):
            await self._transport.send(answer)

    async def _logged(self, params: dict[str, Any], context: CallContext | None) -> None:
        listener = context.log if context is not None else None
        level = params.get("level")
        if listener is None or not isinstance(level, str):
            return
        logger = params.get("logger")
        with anyio.move_on_after(_PROGRESS_CALLBACK_SECONDS), contextlib.suppress(Exception):
            await listener(level, logger if isinstance(logger, str) else None, params.get("data"))

    def _modern_headers(self, method: str, params_json: str | None) -> dict[str, str]:
        params: Any = None
        if params_json is not None and method in ("tools/call", "prompts/get", "resources/read"):
            with contextlib.suppress(JSONBoundaryError):
                params = parse_json(params_json)
        if not isinstance(params, dict):
            params = None
        tool = params.get("name") if params is not None and method == "tools/call" else None
        header_map = self._header_maps.get(tool) if isinstance(tool, str) else None
        return _revision.request_headers(method, params, header_map)

    def _listens(self, context: CallContext | None) -> bool:
        """Whether a request's standalone stream is held open: a legacy HTTP session whose
        request has an asker for the server's requests, as the client advertised."""
        return (
            context is not None
            and context.ask is not None
            and not self.modern
            and self.server.endpoint is not None
            and bool(self.server.client_capabilities)
        )

    def forget_listings(self) -> None:
        """Drop the listing pages kept per their `ttlMs`: the next listing asks the server."""
        self._listings.clear()

    async def _listing_page(
        self, method: str, cursor: str | None, *, limit: float | None, context: CallContext | None
    ) -> Any:
        """One page of a listing; on a modern connection, the page kept per its `ttlMs`
        while it lasts (a bad hint keeps nothing and is noted once)."""
        key = (method, cursor)
        now = anyio.current_time()
        kept = self._listings.get(key)
        if kept is not None and kept[0] > now:
            return kept[1]
        params = None if cursor is None else canonical_json({"cursor": cursor})
        result = await self._request(method, params, limit=limit, context=context, keep_hints=True)
        if self.modern:
            seconds, note = _revision.listing_lifetime(self.server.name, method, result)
            result = _revision.without_transport_members(result, keep_hints=False)
            if note is not None and note not in self.notes:
                self.notes.append(note)
            if seconds > 0:
                self._listings[key] = (anyio.current_time() + seconds, result)
            else:
                self._listings.pop(key, None)
        return result

    async def _send_cancelled(self, request_id: int, reason: str) -> None:
        if self.modern and self.server.endpoint is not None:
            return  # on the revision's HTTP, closing the request's stream is the cancellation
        notice = encode_notification(
            "notifications/cancelled",
            canonical_json({"requestId": request_id, "reason": reason}),
        )
        # Best effort, bounded, and shielded so it is sent even while the caller is cancelled.
        with (
            anyio.CancelScope(shield=True),
            anyio.move_on_after(CANCEL_NOTICE_TIMEOUT),
            contextlib.suppress(MCPConnectionError),
        ):
            await self._transport.send(notice)

    # -- helpers ---------------------------------------------------------------

    def _name(self) -> str:
        return sanitize(self.server.name)

    def _with_stderr(self, error: MCPConnectionError) -> MCPConnectionError:
        tail = self.stderr_tail()
        if tail and not getattr(error, "_stderr_added", False):
            error.args = (f"{error}; the server's stderr ends with: {tail}",)
            error._stderr_added = True  # type: ignore[attr-defined]
        return error


async def connect(
    server: Server,
    *,
    on_step: Callable[[str], None] | None = None,
    on_started: Callable[[Connection], None] | None = None,
) -> Connection:
    """Start or reach `server`, perform the handshake and return the open `Connection`.

    No timeout of its own: the caller bounds it (`anyio.fail_after`), and
    `on_step` names the step in progress.  On any failure or cancellation
    everything started here is stopped before the exception leaves.
    """
    step = on_step if on_step is not None else (lambda _step: None)
    transport: _Transport
    if server.command is not None:
        step("starting the server")
        transport = start_stdio(server)
    else:
        step("opening the HTTP client")
        from ._http import open_http  # httpx2: only for a server over HTTP (issue 36)

        transport = open_http(server)
    connection = Connection(server, transport)
    try:
        if on_started is not None:
            on_started(connection)
        step("performing the handshake")
        await connection._handshake()
        connection._live = True
        connection.listen.poke()
    except MCPConnectionError as exc:
        with anyio.CancelScope(shield=True):
            await connection.aclose()
        raise connection._with_stderr(exc) from None
    except BaseException:
        with anyio.CancelScope(shield=True):
            await connection.aclose()
        raise
    return connection


def _with_meta(params_json: str | None, meta: Mapping[str, Any]) -> str:
    """`params_json` (the text of an object without `_meta`, or None) with a `_meta` member
    appended, the rest of its text kept as it was."""
    if params_json is None:
        return canonical_json({"_meta": dict(meta)})
    body = params_json.rstrip()
    inner = body[:-1].rstrip()
    separator = "" if inner.endswith("{") else ","
    return f'{inner}{separator}"_meta":{canonical_json(dict(meta))}}}'
