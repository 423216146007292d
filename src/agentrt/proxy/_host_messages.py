"""The host's raw messages, checked before the SDK decodes them.

The SDK's parser keeps the last of a repeated key, accepts a byte-order
mark's absence of meaning, NaN, and ids of any JSON type, and a message it
cannot decode is dropped without a word.  Every line (or HTTP body) the host
sends passes `screen` first, over the raw bytes: it is one JSON-RPC 2.0
message the runtime's JSON boundary (`agentrt.canonical.parse_json`) accepts,
or the host is answered with the error JSON-RPC names for it — `-32700` when
it is not JSON the gate accepts, `-32600` when it is JSON but not one valid
request — with the request's id where one can be read and `null` where none
can.  A `tools/call` whose payload the boundary refuses (a repeated key in
the arguments, a repeated `name`, an unpaired surrogate) is answered as an
`INVALID` call instead, so the model learns what to correct.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final

from ..canonical import JSONBoundaryError, canonical_json, parse_json
from ..sanitize import sanitize
from ._answers import Answer, bounded
from ._plain import (
    INVALID_REQUEST,
    PARSE_ERROR,
    UNDECIDED,
    Message,
    call_result,
    message_of,
    message_of_model,
)

__all__ = ["MAX_ID_MAGNITUDE", "Refusal", "decode", "refusal_of_oversized", "screen"]

# JSON-RPC ids are echoed back: an integer no peer can hold (a 4,000-digit
# literal) is as unusable as a fractional one.
MAX_ID_MAGNITUDE: Final = 2**63


@dataclass(frozen=True, slots=True)
class Refusal:
    """The answer to a message that is not passed on, and the operator's line about it."""

    reply: dict[str, Any]  # a JSON-RPC error, or the answer to a call refused
    log_line: str

    def body(self) -> bytes:
        # As pydantic writes the SDK's messages: compact, UTF-8 unescaped.
        return json.dumps(self.reply, separators=(",", ":"), ensure_ascii=False).encode()


RequestId = int | str


def _valid_id(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return -MAX_ID_MAGNITUDE < value < MAX_ID_MAGNITUDE
    return isinstance(value, str)


def _error(code: int, request_id: RequestId | None, message: str, why: str) -> Refusal:
    label = "parse error" if code == PARSE_ERROR else "invalid request"
    shown = "null" if request_id is None else bounded(json.dumps(request_id), 80)
    return Refusal(
        {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}},
        f"agentrt proxy: refused a message from the host ({label}, id {shown}): {why}",
    )


def _lenient(text: str) -> Any:
    """The message as a permissive reader sees it, only to find its id and method."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _readable_id(value: Any) -> RequestId | None:
    if isinstance(value, dict):
        request_id = value.get("id")
        if _valid_id(request_id):
            return request_id  # type: ignore[no-any-return]
    return None


def _invalid_call(request_id: RequestId, value: dict[str, Any], problem: str) -> Refusal:
    params = value.get("params")
    tool = params.get("name") if isinstance(params, dict) else None
    shown_tool = tool if isinstance(tool, str) else "a tool"
    answer = Answer.invalid(shown_tool, problem)
    result = call_result([{"type": "text", "text": answer.text}], is_error=True)
    return Refusal(
        {"jsonrpc": "2.0", "id": request_id, "result": result},
        f"agentrt proxy: a call to {bounded(shown_tool, 80)} was refused before the gate: "
        f"{problem}",
    )


def _boundary_problem(lenient: Any, exc: JSONBoundaryError) -> str:
    # NaN and infinities pass a permissive reader; the encoder names them best.
    try:
        canonical_json(lenient)
    except (JSONBoundaryError, TypeError, ValueError, RecursionError) as encoding:
        return f"its arguments are not JSON the gate accepts ({sanitize(str(encoding))})"
    return f"the request is not JSON the gate accepts ({sanitize(str(exc))})"


def screen(raw: bytes) -> Refusal | None:
    """None if `raw` is one JSON-RPC message the SDK may decode; else the answer to send."""
    try:
        text = raw.decode("utf-8", errors="strict")
    except UnicodeDecodeError as exc:
        why = f"the message is not valid UTF-8 (byte {exc.start})"
        return _error(PARSE_ERROR, None, f"Parse error: {why}", why)
    try:
        value = parse_json(text)
    except JSONBoundaryError as exc:
        # Read permissively only to name the refused message's id and method.
        lenient = _lenient(text)
        request_id = _readable_id(lenient)
        if (
            request_id is not None
            and isinstance(lenient, dict)
            and lenient.get("method") == "tools/call"
            and lenient.get("jsonrpc") == "2.0"
        ):
            return _invalid_call(request_id, lenient, _boundary_problem(lenient, exc))
        why = sanitize(str(exc))
        if text.startswith("\ufeff"):
            why = "the message starts with a byte-order mark"
        return _error(PARSE_ERROR, request_id, f"Parse error: {why}", why)
    if isinstance(value, list):
        why = "a batch (a JSON array of messages) is not accepted; send one message per line"
        return _error(INVALID_REQUEST, None, f"Invalid Request: {why}", why)
    if not isinstance(value, dict):
        why = "the message is not a JSON object"
        return _error(INVALID_REQUEST, None, f"Invalid Request: {why}", why)
    request_id = value.get("id")
    if "id" in value and not _valid_id(request_id):
        why = (
            "the id is not a string or an integer"
            if not isinstance(request_id, (int, Decimal)) or isinstance(request_id, bool)
            else "the id is not an integer a peer can hold"
        )
        if request_id is None and "method" not in value:
            request_id = None  # an error response to us may carry id null
        else:
            return _error(INVALID_REQUEST, None, f"Invalid Request: {why}", why)
    readable = request_id if _valid_id(request_id) else None
    if value.get("jsonrpc") != "2.0":
        why = 'the message does not say "jsonrpc": "2.0"'
        return _error(INVALID_REQUEST, readable, f"Invalid Request: {why}", why)
    return None


def decode(raw: bytes) -> Message | Refusal:
    """Screen `raw`, then decode it as the SDK does (`_plain` for the plain shapes, the
    SDK's models for the rest); a shape the SDK refuses is answered."""
    refused = screen(raw)
    if refused is not None:
        return refused
    plain = message_of(raw)
    if plain is not UNDECIDED:
        return plain  # type: ignore[return-value]
    import mcp_types as types

    try:
        return message_of_model(types.jsonrpc_message_adapter.validate_json(raw, by_name=False))
    except Exception:
        value = _lenient(raw.decode("utf-8"))
        why = "the message is not a JSON-RPC request, notification or response"
        return _error(INVALID_REQUEST, _readable_id(value), f"Invalid Request: {why}", why)


def refusal_of_oversized(limit: int) -> Refusal:
    why = f"the message is longer than {limit // (1024 * 1024)} MiB and was discarded whole"
    return _error(INVALID_REQUEST, None, f"Invalid Request: {why}", why)
