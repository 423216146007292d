"""The inbox's web application: a guard in front of everything, a few JSON routes, one stream.

The guard answers before any route: a Host that is not this listener is
refused (a DNS-rebinding page names its own host), a request for data
without the token is refused, and a POST whose Origin is not this page or
that lacks the CSRF token is refused.  Every answer carries a strict
Content-Security-Policy.  Decisions go through `agentrt.approvals.approve`
and `reject`, exactly as the command's do.
"""

from __future__ import annotations

import hmac
import json
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import anyio
import jinja2
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from .. import approvals
from ..canonical import JSONBoundaryError, parse_json
from ..errors import AgentrtError, RunNotFound
from ..grants import GrantRequest, GrantScope, grant_request_from, grant_scope
from ..sanitize import sanitize
from ..store import ApprovalRecord, Store
from ._chain import ChainCheck
from ._views import (
    ToolInfo,
    approval_view,
    chain_view,
    head_seq,
    run_detail,
    run_view,
    waiting_approvals,
)

if TYPE_CHECKING:
    from ..passkeys import PasskeyMode

__all__ = ["CSP", "InboxState", "create_app"]

CSP: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
)
_HERE: Final = Path(__file__).parent
_SECURITY_HEADERS: Final = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
]
_MAX_BODY: Final = 64 * 1024
_MAX_NOTE: Final = 4000
_MAX_BY: Final = 200
_POLL_SECONDS: Final = 0.5
_KEEPALIVE_SECONDS: Final = 15.0

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


@dataclass
class InboxState:
    """What one inbox serves: its store, its secrets, and who may address it."""

    store: Store
    token: str
    allowed_hosts: frozenset[str] | None
    """The Host headers answered; None (a remote listener on every interface) answers any,
    and then only the page's own origin may post."""
    scheme: str = "http"
    login: str = ""
    tools: Mapping[str, ToolInfo] = field(default_factory=dict)
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    passkeys: PasskeyMode | None = None
    """Passkey mode: a decision needs an approver's WebAuthn assertion (`passkeys/`)."""

    def origin_allowed(self, origin: str, host: str) -> bool:
        return origin == f"{self.scheme}://{host}"


async def _plain(send: Send, status: int, message: str) -> None:
    body = json.dumps({"error": message}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *_SECURITY_HEADERS,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class _Guard:
    """ASGI middleware: Host, token, Origin and CSRF checks, and the security headers."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], state: InboxState):
        self.app = app
        self.state = state
        self.bearer = f"Bearer {state.token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers: dict[bytes, bytes] = {}
        for name, value in scope.get("headers") or []:
            # A repeated Host or Origin is refused below rather than one of them chosen.
            headers[name] = value if name not in headers else b"\x00repeated"
        host = headers.get(b"host", b"").decode("latin-1")
        allowed = self.state.allowed_hosts
        if not host or (allowed is not None and host not in allowed):
            await _plain(send, 403, "this inbox does not answer to that Host")
            return
        path: str = scope["path"]
        method: str = scope["method"]
        if method not in ("GET", "HEAD", "POST"):
            await _plain(send, 405, "only GET and POST are served")
            return
        if path.startswith("/static/") and method in ("GET", "HEAD"):
            await self.app(scope, receive, _with_headers(send))
            return
        if path == "/" and method in ("GET", "HEAD"):
            # The shell holds no data: it is the same for everyone, and it is
            # what a request without the token is answered with (a 401 whose
            # body reads the token from the address's fragment).
            await self.app(scope, receive, _with_headers(send, status=401))
            return
        if not path.startswith("/api/"):
            await _plain(send, 404, "there is nothing here")
            return
        if not hmac.compare_digest(headers.get(b"authorization", b""), self.bearer):
            await _plain(send, 401, "the inbox token is required")
            return
        if method == "POST":
            origin = headers.get(b"origin", b"").decode("latin-1")
            if not self.state.origin_allowed(origin, host):
                await _plain(send, 403, "a decision must come from the inbox page itself")
                return
            csrf = headers.get(b"x-csrf-token", b"")
            if not hmac.compare_digest(csrf, self.state.csrf.encode()):
                await _plain(send, 403, "the CSRF token is missing or wrong; reload the page")
                return
            if headers.get(b"content-type", b"").split(b";")[0].strip() != b"application/json":
                await _plain(send, 415, "a decision is sent as application/json")
                return
        await self.app(scope, receive, _with_headers(send))


def _with_headers(send: Send, status: int | None = None) -> Send:
    async def wrapped(message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            message = dict(message)
            if status is not None:
                message["status"] = status
            message["headers"] = [*message.get("headers", []), *_SECURITY_HEADERS]
        await send(message)

    return wrapped


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


async def _json_object(request: Request, what: str) -> dict[str, Any] | Response:
    """The request's body as a JSON object, or the error answer: bounded, and read with
    `parse_json` like every other JSON input (with a repeated "verdict", a reader keeping
    the last would approve what a reader keeping the first rejects)."""
    body = await request.body()
    if len(body) > _MAX_BODY:
        return _error(413, f"{what} is too large")
    try:
        document = parse_json(body)
    except JSONBoundaryError as exc:
        return _error(400, f"{what} is refused: {exc}")
    if not isinstance(document, dict):
        return _error(400, f"{what} must be a JSON object")
    return document


def create_app(state: InboxState) -> Any:
    """The inbox as an ASGI application (the guard around a Starlette app)."""
    templates = jinja2.Environment(
        loader=jinja2.FileSystemLoader(_HERE / "templates"),
        autoescape=jinja2.select_autoescape(["html"], default=True),
        undefined=jinja2.StrictUndefined,
    )
    shell = templates.get_template("index.html")
    store = state.store
    chain = ChainCheck(store)

    async def index(request: Request) -> Response:
        return Response(shell.render(), media_type="text/html; charset=utf-8")

    async def session(request: Request) -> Response:
        return JSONResponse(
            {
                "csrf": state.csrf,
                "login": sanitize(state.login),
                "database": sanitize(store.path),
                "approval_auth": "passkey" if state.passkeys is not None else "label",
            }
        )

    def _approvals() -> dict[str, Any]:
        waiting = waiting_approvals(store)
        return {
            "head": head_seq(store),
            "approvals": [approval_view(store, approval, state.tools) for approval in waiting],
        }

    async def list_approvals(request: Request) -> Response:
        return JSONResponse(await store.run(_approvals))

    def _runs(limit: int, offset: int) -> dict[str, Any]:
        page = store.list_runs(limit=limit, offset=offset)
        return {
            "runs": [run_view(store, run) for run in page],
            "offset": offset,
            "total": store.count_runs(),
        }

    async def list_runs(request: Request) -> Response:
        try:
            limit = min(max(int(request.query_params.get("limit", "50")), 1), 500)
            offset = max(int(request.query_params.get("offset", "0")), 0)
        except ValueError:
            return _error(400, "limit and offset must be whole numbers")
        return JSONResponse(await store.run(_runs, limit, offset))

    async def show_run(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        try:
            detail = await store.run(run_detail, store, run_id, state.tools)
        except RunNotFound as exc:
            return _error(404, sanitize(str(exc)))
        return JSONResponse(detail)

    async def verify(request: Request) -> Response:
        return JSONResponse(chain_view(await store.run(chain.report)))

    async def decide(request: Request) -> Response:
        decision = await _json_object(request, "the decision")
        if isinstance(decision, Response):
            return decision
        verdict = decision.get("verdict")
        fields = {name: decision.get(name) for name in ("run_id", "approval_id", "approval_hash")}
        run_id, approval_id, shown_hash = (fields[name] for name in fields)
        by, note = decision.get("by", ""), decision.get("note", "")
        if verdict not in ("approve", "reject"):
            return _error(400, "verdict must be approve or reject")
        if not (
            isinstance(run_id, str) and isinstance(approval_id, str) and isinstance(shown_hash, str)
        ) or not (run_id and approval_id and shown_hash):
            return _error(400, "run_id, approval_id and approval_hash are required")
        if not isinstance(by, str) or not isinstance(note, str):
            return _error(400, "by and note must be text")
        if len(note) > _MAX_NOTE or len(by) > _MAX_BY:
            return _error(400, f"a note is at most {_MAX_NOTE} characters, a name {_MAX_BY}")
        grant: GrantRequest | None = None
        if decision.get("grant") is not None:
            if verdict != "approve":
                return _error(400, "a standing grant is given only with an approval")
            try:
                grant = grant_request_from(decision["grant"], needs_hash=True)
            except ValueError as exc:
                return _error(400, str(exc))
        if state.passkeys is not None:
            from ..passkeys import decide_in_inbox

            origin = f"{state.scheme}://{request.headers.get('host', '')}"
            return await decide_in_inbox(
                store, state.passkeys, decision, run_id, approval_id, shown_hash, verdict,
                note, grant, origin,
            )  # fmt: skip

        def chosen() -> ApprovalRecord:
            who = by.strip() or state.login
            if verdict == "approve":
                return approvals.approve(store, run_id, approval_hash=shown_hash,
                                         approval_id=approval_id, by=who, note=note,
                                         grant=grant)  # fmt: skip
            return approvals.reject(store, run_id, approval_hash=shown_hash,
                                    approval_id=approval_id, by=who, note=note)  # fmt: skip

        try:
            decided = await store.run(chosen)
        except AgentrtError as exc:
            return _error(409, sanitize(str(exc)))
        return JSONResponse(
            {
                "approval_id": sanitize(decided.approval_id),
                "status": str(decided.status),
                "by": sanitize(decided.decided_by),
                "approval_hash": decided.approval_hash,
            }
        )

    async def clear_taint(request: Request) -> Response:
        """The operator's reset of a host session's taint: the same function as
        `agentrt taint clear`, recorded in the chain as `taint_cleared`."""
        asked = await _json_object(request, "the request")
        if isinstance(asked, Response):
            return asked
        host_session, by, note = asked.get("session"), asked.get("by", ""), asked.get("note", "")
        if not isinstance(host_session, str) or not host_session:
            return _error(400, "session is required")
        if not isinstance(by, str) or not isinstance(note, str):
            return _error(400, "by and note must be text")
        if len(note) > _MAX_NOTE or len(by) > _MAX_BY:
            return _error(400, f"a note is at most {_MAX_NOTE} characters, a name {_MAX_BY}")
        from ..proxy._flows import TaintStore

        labels = await store.run(
            lambda: TaintStore(store).clear(host_session, by.strip() or state.login, note)
        )
        if not labels:
            return _error(409, f"host session {sanitize(host_session)} holds no taint")
        return JSONResponse({"session": sanitize(host_session), "labels": list(labels)})

    async def scope_of_grant(request: Request) -> Response:
        """The scope a standing grant asked with an approval would have, and its hash: shown
        before the grant is given (the decision names the hash)."""
        asked = await _json_object(request, "the request")
        if isinstance(asked, Response):
            return asked
        run_id, approval_id = asked.get("run_id"), asked.get("approval_id")
        if not (isinstance(run_id, str) and isinstance(approval_id, str)):
            return _error(400, "run_id and approval_id are required")
        try:
            request_ = grant_request_from(asked, needs_hash=False)
        except ValueError as exc:
            return _error(400, str(exc))

        def scope() -> GrantScope:
            approval = store.get_approval(approval_id)
            if approval.run_id != run_id:
                raise RunNotFound(f"approval {sanitize(approval_id)} is not of this run")
            return grant_scope(store, approval, request_)

        try:
            found = await store.run(scope)
        except AgentrtError as exc:
            return _error(409, sanitize(str(exc)))
        return JSONResponse(
            {"scope": found.scope, "scope_hash": found.scope_hash, "lines": found.lines()}
        )

    async def passkey_challenge(request: Request) -> Response:
        """What the page's `navigator.credentials.get` signs for one decision: the challenge
        derived from the approval and the verdict (nothing is kept; decision 0041)."""
        if state.passkeys is None:
            return _error(404, "this inbox decides without passkeys")
        asked = await _json_object(request, "the request")
        if isinstance(asked, Response):
            return asked
        from ..passkeys import challenge_options

        return await store.run(challenge_options, store, state.passkeys, asked)

    async def stream(request: Request) -> Response:
        async def changes() -> AsyncIterator[bytes]:
            last: tuple[int, int] | None = None
            quiet = 0.0
            while True:
                current = await store.run(
                    lambda: (head_seq(store), store.count_pending_approvals())
                )
                if current != last:
                    last = current
                    quiet = 0.0
                    data = json.dumps({"head": current[0], "pending": current[1]})
                    yield f"event: change\ndata: {data}\n\n".encode()
                elif quiet >= _KEEPALIVE_SECONDS:
                    quiet = 0.0
                    yield b": still here\n\n"
                if await request.is_disconnected():
                    return
                await anyio.sleep(_POLL_SECONDS)
                quiet += _POLL_SECONDS

        return StreamingResponse(
            changes(),
            media_type="text/event-stream",
            headers={"x-accel-buffering": "no"},
        )

    app = Starlette(
        routes=[
            Route("/", index, methods=["GET", "HEAD"]),
            Route("/api/session", session),
            Route("/api/approvals", list_approvals),
            Route("/api/runs", list_runs),
            Route("/api/runs/{run_id:path}", show_run),
            Route("/api/verify", verify),
            Route("/api/decide", decide, methods=["POST"]),
            Route("/api/taint/clear", clear_taint, methods=["POST"]),
            Route("/api/grant-scope", scope_of_grant, methods=["POST"]),
            Route("/api/passkey/challenge", passkey_challenge, methods=["POST"]),
            Route("/api/stream", stream),
            Mount("/static", StaticFiles(directory=_HERE / "static"), name="static"),
        ]
    )
    return _Guard(app, state)
