"""The signed approver channel as an ASGI app (Starlette): routes, checks, answers.

Each request passes, in this order: the rate limit (before anything is read),
the body's declared size, the signing headers and the timestamp's window, the
body read up to its bound, the signature (constant-time), the replay cache; only
then is the path's run looked at.  A thin view: deciding is `Approver`'s, which
decides through `approvals.py`.  Every decision is recorded by the ledger's own
events (`approval_granted`, `approval_rejected`, `operator_cancelled`, with the
body's `by`); every refusal is an `approver_refused` event (its status, code,
reason and path, bounded; never the body of a request that did not verify).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from ..canonical import JSONBoundaryError, parse_json
from ..grants import GrantRequest, grant_request_from
from ..sanitize import sanitize
from ..store import Store, ledger
from ._interface import Approver, ApproverRefusal
from ._signing import (
    DEFAULT_SKEW,
    NONCE_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    ReplayCache,
    TokenBucket,
    claimed,
    verify,
)

if TYPE_CHECKING:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response

__all__ = ["MAX_BODY", "ChannelLimits", "approver_app"]

# A route's work once the request verified: the path's run, its parameters, the body.
_Handler = Callable[[Approver, Mapping[str, Any], bytes, "Request"], Awaitable["Response"]]

MAX_BODY: Final = 16 * 1024
"""Bytes of a request body the channel reads at most."""
MAX_BY: Final = 200
MAX_NOTE: Final = 2000
_DECISION_FIELDS: Final = ("run_id", "approval_id", "hash", "by", "note")
# An approval may give a standing grant: `grant` is `{calls, for, when, scope_hash}`, the
# scope_hash as `…/grant-scope` showed it (docs/approvals.md).
_APPROVE_FIELDS: Final = (*_DECISION_FIELDS, "grant")
_SCOPE_FIELDS: Final = ("run_id", "approval_id", "grant")
_CANCEL_FIELDS: Final = ("run_id", "by")
_MAX_RECORDED_PATH: Final = 200
_MAX_RECORDED_REASON: Final = 300


@dataclass(frozen=True, slots=True)
class ChannelLimits:
    """The channel's bounds: timestamp skew (s), rate (requests/s), burst, body bytes."""

    skew: float = DEFAULT_SKEW
    rate: float = 10.0
    burst: float = 20.0
    max_body: int = MAX_BODY


def _bounded(text: str, limit: int) -> str:
    text = sanitize(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass
class _Channel:
    store: Store
    secret: bytes
    limits: ChannelLimits
    bucket: TokenBucket
    replays: ReplayCache
    # Refusals by the rate limit are recorded at most once a second, with the count of
    # those folded into it: a flood must not become a flood of writes.
    _rate_refused_at: float = 0.0
    _rate_refused_since: int = 0

    async def record_refusal(
        self, request: Request, refusal: ApproverRefusal, *, verified: bool, run_id: str = ""
    ) -> None:
        payload: dict[str, Any] = {
            "status": refusal.status,
            "code": refusal.code,
            "reason": _bounded(str(refusal), _MAX_RECORDED_REASON),
            "method": _bounded(request.method, 16),
            "path": _bounded(_raw_path(request), _MAX_RECORDED_PATH),
            "verified": verified,
        }
        if refusal.status == 429:
            now = time.monotonic()
            if now - self._rate_refused_at < 1.0:
                self._rate_refused_since += 1
                return
            if self._rate_refused_since:
                payload["also_refused"] = self._rate_refused_since
            self._rate_refused_at, self._rate_refused_since = now, 0
        # An unverified request's run id is whatever its sender typed: it names no run.
        await self.store.write(
            functools.partial(ledger.record_approver_refusal, self.store),
            _bounded(run_id, _MAX_RECORDED_PATH) if verified else "",
            payload,
        )


def _raw_path(request: Request) -> str:
    raw = request.scope.get("raw_path")
    if isinstance(raw, bytes):
        return raw.decode("latin-1").partition("?")[0]
    return str(request.scope.get("path", ""))


def _error(refusal: ApproverRefusal) -> Response:
    from starlette.responses import JSONResponse

    return JSONResponse({"error": str(refusal), "code": refusal.code}, status_code=refusal.status)


async def _read_body(request: Request, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApproverRefusal(413, "too_large", f"the request body is over {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def _verified_body(channel: _Channel, request: Request) -> bytes:
    """The body of a request that passed the rate limit, the bounds and its signature."""
    if not channel.bucket.take():
        raise ApproverRefusal(429, "rate_limited", "too many requests; try again in a second")
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > channel.limits.max_body):
        raise ApproverRefusal(
            413, "too_large", f"the request body is over {channel.limits.max_body} bytes"
        )
    try:
        claim = claimed(
            request.headers.get(TIMESTAMP_HEADER),
            request.headers.get(NONCE_HEADER),
            request.headers.get(SIGNATURE_HEADER),
            time.time(),
            channel.limits.skew,
        )
    except ValueError as exc:
        code, sentence = exc.args
        raise ApproverRefusal(401, code, sentence) from None
    body = await _read_body(request, channel.limits.max_body)
    if not verify(channel.secret, claim, request.method, _raw_path(request), body):
        raise ApproverRefusal(401, "bad_signature", "the request's signature does not verify")
    refused = channel.replays.admit(claim.signature, int(claim.timestamp), time.time())
    if refused == "replayed":
        raise ApproverRefusal(401, "replayed", "this signed request was already received")
    if refused is not None:
        raise ApproverRefusal(429, "rate_limited", "too many signed requests in the window")
    return body


def _decision(
    body: bytes, run_id: str, fields: tuple[str, ...], approval_id: str | None
) -> dict[str, Any]:
    """The body's fields, checked: a JSON object of text naming the path's run (and approval)."""
    if not body and approval_id is None:
        return {}
    try:
        document = parse_json(body)
    except JSONBoundaryError as exc:
        raise ApproverRefusal(400, "bad_request", f"the body is not usable JSON: {exc}") from None
    if not isinstance(document, dict):
        raise ApproverRefusal(400, "bad_request", "the body must be a JSON object")
    for name, value in document.items():
        if name not in fields:
            raise ApproverRefusal(
                400, "bad_request", f"the body has a field {_bounded(name, 40)!r} it may not have"
            )
        if name == "grant":
            continue  # checked as a grant by `_grant_of`
        if not isinstance(value, str):
            raise ApproverRefusal(400, "bad_request", f"the body's {name} must be text")
    if len(document.get("by", "")) > MAX_BY or len(document.get("note", "")) > MAX_NOTE:
        raise ApproverRefusal(
            400, "bad_request", f"by is at most {MAX_BY} characters, note {MAX_NOTE}"
        )
    required: tuple[str, ...] = ("run_id",)
    if approval_id is not None:
        required = ("run_id", "approval_id", "hash" if "hash" in fields else "grant")
    for name in required:
        if not document.get(name):
            raise ApproverRefusal(400, "bad_request", f"the body's {name} is required")
    if document["run_id"] != run_id:
        raise ApproverRefusal(
            400, "bad_request", "the body names another run than the request's path"
        )
    if approval_id is not None and document["approval_id"] != approval_id:
        raise ApproverRefusal(
            400, "bad_request", "the body names another approval than the request's path"
        )
    return document


def _grant_of(fields: Mapping[str, Any], *, needs_hash: bool) -> GrantRequest | None:
    """The standing grant a body asks for (None without one); 400 naming what is wrong."""
    if "grant" not in fields:
        return None
    try:
        return grant_request_from(fields["grant"], needs_hash=needs_hash)
    except ValueError as exc:
        raise ApproverRefusal(400, "bad_request", sanitize(str(exc))) from None


def _wants_text(request: Request) -> bool:
    accept = request.headers.get("accept", "")
    return "text/plain" in accept and "application/json" not in accept


def approver_app(
    store: Store, secret: bytes, limits: ChannelLimits | None = None, *, passkey_mode: bool = False
) -> Starlette:
    """The signed approver channel over `store`, deciding with `secret` (see docs/approvals.md).

    `passkey_mode`: refuse every decision (a shared secret signs for a program, not a person);
    `agentrt approver serve` reads it from the database as it starts."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, PlainTextResponse
    from starlette.routing import Route

    limits = limits or ChannelLimits()
    channel = _Channel(
        store, secret, limits, TokenBucket(limits.rate, limits.burst),
        ReplayCache(skew=limits.skew,
                    capacity=int(limits.rate * 2 * limits.skew + limits.burst) + 1000),
    )  # fmt: skip

    def endpoint(handler: _Handler) -> Callable[[Request], Awaitable[Response]]:
        async def serve(request: Request) -> Response:
            try:
                body = await _verified_body(channel, request)
            except ApproverRefusal as refusal:
                await channel.record_refusal(request, refusal, verified=False)
                return _error(refusal)
            params = request.path_params
            run_id = str(params["run_id"])
            try:
                return await handler(Approver(store, run_id), params, body, request)
            except ApproverRefusal as refusal:
                await channel.record_refusal(request, refusal, verified=True, run_id=run_id)
                return _error(refusal)

        return serve

    async def list_approvals(
        approver: Approver, params: Mapping[str, Any], body: bytes, request: Request
    ) -> Response:
        views = await store.run(approver.pending)
        return JSONResponse(
            {"run_id": approver.run_id, "approvals": [view.json() for view in views]}
        )

    async def show(
        approver: Approver, params: Mapping[str, Any], body: bytes, request: Request
    ) -> Response:
        view = await store.run(approver.view, str(params["approval_id"]))
        if _wants_text(request):
            return PlainTextResponse(view.text() + "\n")
        return JSONResponse(view.json())

    def deciding(verdict: str) -> _Handler:
        async def decide(
            approver: Approver, params: Mapping[str, Any], body: bytes, request: Request
        ) -> Response:
            approval_id = str(params["approval_id"])
            if passkey_mode:
                raise ApproverRefusal(
                    403, "passkey_mode",
                    "this database is decided with approvers' passkeys (passkey mode): decide "
                    "in the inbox at http://localhost:PORT, where a passkey signs the decision",
                )  # fmt: skip
            if verdict == "approve":
                fields = _decision(body, approver.run_id, _APPROVE_FIELDS, approval_id)
                grant = _grant_of(fields, needs_hash=True)
                decided = await store.run(
                    functools.partial(
                        approver.approve, approval_id, fields["hash"],
                        by=fields.get("by") or "approver", note=fields.get("note", ""),
                        grant=grant,
                    )
                )  # fmt: skip
            else:
                fields = _decision(body, approver.run_id, _DECISION_FIELDS, approval_id)
                decided = await store.run(
                    functools.partial(
                        approver.reject, approval_id, fields["hash"],
                        by=fields.get("by") or "approver", note=fields.get("note", ""),
                    )
                )  # fmt: skip
            return JSONResponse(decided.json(), status_code=202 if verdict == "approve" else 200)

        return decide

    async def grant_scope(
        approver: Approver, params: Mapping[str, Any], body: bytes, request: Request
    ) -> Response:
        approval_id = str(params["approval_id"])
        fields = _decision(body, approver.run_id, _SCOPE_FIELDS, approval_id)
        asked = _grant_of(fields, needs_hash=False)
        assert asked is not None
        scope = await store.run(approver.grant_scope, approval_id, asked)
        return JSONResponse(
            {"scope": scope.scope, "scope_hash": scope.scope_hash, "lines": scope.lines()}
        )

    async def cancel(
        approver: Approver, params: Mapping[str, Any], body: bytes, request: Request
    ) -> Response:
        fields = _decision(body, approver.run_id, _CANCEL_FIELDS, None)
        run = await store.run(functools.partial(approver.cancel, by=fields.get("by") or "approver"))
        return JSONResponse({"run_id": run.run_id, "status": str(run.status), "reason": run.reason})

    def unrouted(refusal: ApproverRefusal) -> Callable[[Request, Exception], Awaitable[Response]]:
        async def refuse(request: Request, exc: Exception) -> Response:
            # A path or method no route serves is refused like any other request, after
            # the same checks (an unsigned one is told only that), and recorded.
            try:
                await _verified_body(channel, request)
            except ApproverRefusal as unverified:
                await channel.record_refusal(request, unverified, verified=False)
                return _error(unverified)
            await channel.record_refusal(request, refusal, verified=True)
            return _error(refusal)

        return refuse

    base = "/runs/{run_id}"
    return Starlette(
        routes=[
            Route(f"{base}/approvals", endpoint(list_approvals), methods=["GET"]),
            Route(f"{base}/approvals/{{approval_id}}", endpoint(show), methods=["GET"]),
            Route(
                f"{base}/approvals/{{approval_id}}/approve",
                endpoint(deciding("approve")),
                methods=["POST"],
            ),
            Route(
                f"{base}/approvals/{{approval_id}}/reject",
                endpoint(deciding("reject")),
                methods=["POST"],
            ),
            Route(
                f"{base}/approvals/{{approval_id}}/grant-scope",
                endpoint(grant_scope),
                methods=["POST"],
            ),
            Route(f"{base}/cancel", endpoint(cancel), methods=["POST"]),
        ],
        exception_handlers={
            404: unrouted(ApproverRefusal(404, "not_found", "no such run or approval")),
            405: unrouted(
                ApproverRefusal(405, "method_not_allowed", "this path takes another method")
            ),
        },
    )
