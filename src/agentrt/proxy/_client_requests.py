"""A server's sampling, elicitation and roots requests, under the operator's rule.

Per server, `"client_requests": {"elicitation": "forward" | "refuse" |
"forward_url", "sampling": ..., "roots": ...}` (default refuse).  A
forwarded request goes to the host only while the call that caused it is
in flight and its host is still waiting, and only if that host advertised
the capability; a URL-mode elicitation only under `"forward_url"`.  The
server's request and the host's answer (or the refusal) are recorded as
events of that call's run, bounded.  A host on the 2026-07-28 revision is
asked through an input-required result of its call (`_input_required`).
Nothing here touches an approval: an answer from the host is data for the
server, never a decision of the gate.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import anyio

from ..canonical import canonical_bytes, plain_json
from ..mcp._context import Ask, AskRefused
from ..mcp._jsonrpc import METHOD_NOT_FOUND
from ..store import Connection, Store
from ..store.events import EventType
from ._input_required import HostCall, is_stateless
from ._plain import field
from ._revision import narrowed_sampling
from .config import UpstreamConfig

if TYPE_CHECKING:
    # The SDK's request context, or the stdio front's (`_dispatch`), which has its shape.
    from mcp.server.context import ServerRequestContext

__all__ = ["CLIENT_REQUEST_ANSWERED", "CLIENT_REQUEST_EVENT", "asker_for"]

CLIENT_REQUEST_EVENT: Final = EventType.CLIENT_REQUEST.value
CLIENT_REQUEST_ANSWERED: Final = EventType.CLIENT_REQUEST_ANSWERED.value
# How much of a request's params or an answer's content an event keeps.
_RECORDED_BYTES: Final = 4096
_KINDS: Final = {
    "sampling/createMessage": "sampling",
    "elicitation/create": "elicitation",
    "roots/list": "roots",
}
# Recorded when the call ends (or its timeout passes) before the host answers.
_UNANSWERED: Final = "the call ended unanswered"


def _bounded_json(value: Any) -> Any:
    """A JSON value as recorded: as sent when small, else its first bytes as text."""
    data = canonical_bytes(value)
    if len(data) <= _RECORDED_BYTES:
        return value
    return {"truncated": data[:_RECORDED_BYTES].decode("utf-8", "ignore")}


def _host_has(ctx: ServerRequestContext[Any], kind: str) -> bool:
    return field(ctx.session.client_capabilities, kind) is not None


def asker_for(
    upstream: UpstreamConfig,
    call: HostCall,
    store: Store,
    runs: list[str],
    timeout: float,
) -> Ask:
    """The answerer of `upstream`'s requests during one host call (`call`, whose `ctx` is the
    host request waiting on it); `runs` receives the call's run id once the gate sends it."""
    server = upstream.server.name

    async def record(type_: str, payload: dict[str, Any]) -> None:
        if not runs:
            return
        run_id = runs[-1]

        def append(connection: Connection) -> None:
            store.append_event(connection, run_id, type_, payload)

        await store.write(append)

    async def refuse(method: str, params: Any, reason: str) -> None:
        await record(
            CLIENT_REQUEST_EVENT,
            {
                "server": server,
                "method": method,
                "params": _bounded_json(params),
                "forwarded": False,
                "reason": reason,
            },
        )
        raise AskRefused(METHOD_NOT_FOUND, reason)

    async def ask(method: str, params: Any) -> Any:
        kind = _KINDS.get(method)
        if kind is None:
            raise AskRefused(METHOD_NOT_FOUND, f"this client does not answer {method} requests")
        rule = upstream.forwards(kind)
        if rule == "refuse":
            await refuse(method, params, f"the operator's rule refuses {kind} requests")
        url_mode = (
            kind == "elicitation" and isinstance(params, dict) and params.get("mode") == "url"
        )
        if url_mode and rule != "forward_url":
            await refuse(method, params, "the operator's rule refuses URL-mode elicitation")
        if not runs or not call.waiting:
            await refuse(method, params, "the call that caused the request is no longer waited for")
        ctx: ServerRequestContext[Any] = call.ctx
        if not _host_has(ctx, kind):
            await refuse(method, params, f"the host did not advertise the {kind} capability")
        stateless = is_stateless(ctx.protocol_version)
        if stateless and call.asking:
            # One question per round: the host answers the first before it sees another.
            await refuse(method, params, "the host is already asked another question for this call")
        params, wide_context = narrowed_sampling(params) if kind == "sampling" else (params, None)
        forwarded_request: dict[str, Any] = {
            "server": server,
            "method": method,
            "params": _bounded_json(params),
            "forwarded": True,
        }
        if wide_context is not None:
            forwarded_request["include_context_asked"] = wide_context  # and sent as "none"
        await record(CLIENT_REQUEST_EVENT, forwarded_request)
        # Parsed with literals kept (Decimal); the SDK's writer wants plain JSON.
        plain = plain_json(params) if isinstance(params, dict) else None
        try:
            if stateless:
                # No channel to a stateless host: the question rides its call's result.
                answer = await call.ask(method, plain, timeout)
                if answer is None:
                    raise RuntimeError(_UNANSWERED)
            else:
                # Raw, on the call's own channel: the SDK's typed models would drop fields the
                # server sent (an elicitation's legacy enumNames).  SDK 2.3 has no public raw
                # send for a request's channel, hence the private attribute.
                answer = await ctx.session._request_outbound.send_raw_request(method, plain, None)
        except anyio.get_cancelled_exc_class():
            # The call ended (its timeout) while the host was still asked: said in its run.
            with anyio.CancelScope(shield=True):
                await record(
                    CLIENT_REQUEST_ANSWERED,
                    {"server": server, "method": method, "error": _UNANSWERED},
                )
            raise
        except Exception as exc:
            await record(
                CLIENT_REQUEST_ANSWERED,
                {"server": server, "method": method, "error": str(exc)[:_RECORDED_BYTES]},
            )
            raise AskRefused(METHOD_NOT_FOUND, "the host did not answer the request") from None
        recorded: dict[str, Any] = {"server": server, "method": method}
        if kind == "elicitation":
            recorded["action"] = answer.get("action")
            # The form's fields, as the user filled them (bounded).
            recorded["content"] = _bounded_json(answer.get("content"))
        else:
            recorded["answer"] = _bounded_json(answer)
        await record(CLIENT_REQUEST_ANSWERED, recorded)
        return answer

    return ask
