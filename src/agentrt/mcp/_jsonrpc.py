"""JSON-RPC 2.0 messages as bytes: what this client writes and how it reads what a server sent.

Everything a server sends is parsed with `agentrt.canonical.parse_json`, so
number literals survive, repeated keys are refused and keys match exactly.
Outgoing messages are written as text this module assembles; the arguments of
a tool call are spliced in as the exact JSON text the caller gave, never
re-encoded.  The transports (`_stdio`, `_http`) move these bytes; `_connection`
decides what a message means for the caller.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from ..canonical import JSONBoundaryError, canonical_json, parse_json

__all__ = [
    "METHOD_NOT_FOUND",
    "Incoming",
    "IncomingKind",
    "OverlongMessage",
    "answer_server_request",
    "encode_answer",
    "encode_notification",
    "encode_request",
    "one_line",
    "read_message",
]

METHOD_NOT_FOUND: Final = -32601

_encode_string = json.JSONEncoder(ensure_ascii=False).encode


class IncomingKind(StrEnum):
    """What one message from a server is, as far as this client cares."""

    RESPONSE = "response"  # an answer to one of our requests (result or error)
    BAD_RESPONSE = "bad_response"  # looks like an answer to our request, but its bytes are refused
    REQUEST = "request"  # the server asks us something (ping, sampling, elicitation, roots, ...)
    NOTIFICATION = "notification"  # progress (handed to its caller), logging, list_changed
    INVALID = "invalid"  # not a JSON-RPC message we can attribute to anything


@dataclass(frozen=True, slots=True)
class Incoming:
    """One parsed message from a server.

    `request_id` is set for a response (always an `int`: this client only
    issues integer ids, and `True` or `1.0` is not `1`).  `server_request_id`
    is the id of a server's request exactly as parsed, to be echoed back.
    `problem` says why a message is `BAD_RESPONSE` or `INVALID`.
    """

    kind: IncomingKind
    request_id: int | None = None
    result: Any = None
    error: dict[str, Any] | None = None
    method: str | None = None
    server_request_id: Any = None
    problem: str = ""
    params: Any = None
    """A notification's or a server request's `params` as parsed."""


def one_line(json_text: str) -> str:
    """Return `json_text` with its line breaks turned into spaces.

    A raw line break can only be insignificant whitespace in valid JSON (the
    boundary refuses control characters inside strings), so this keeps the
    meaning and every literal while making the text safe for newline framing.
    """
    return json_text.replace("\r", " ").replace("\n", " ")


def encode_request(request_id: int, method: str, params_json: str | None) -> bytes:
    """One request; `params_json` is spliced in verbatim (already validated JSON text)."""
    params = "" if params_json is None else f',"params":{one_line(params_json)}'
    text = f'{{"jsonrpc":"2.0","id":{request_id},"method":{_encode_string(method)}{params}}}'
    return text.encode("utf-8")


def encode_notification(method: str, params_json: str | None) -> bytes:
    """One notification (no id, no answer expected)."""
    params = "" if params_json is None else f',"params":{one_line(params_json)}'
    return f'{{"jsonrpc":"2.0","method":{_encode_string(method)}{params}}}'.encode()


def answer_server_request(message: Incoming) -> bytes:
    """The answer to a request the server sent: `{}` for ping, an error for anything else.

    Nothing answers sampling, elicitation or roots on the operator's behalf:
    this client advertises none of those capabilities and refuses them here.
    """
    if message.method == "ping":
        return encode_answer(message.server_request_id, result={})
    method = message.method if message.method is not None else ""
    refusal = f"this client does not answer {method} requests"
    return encode_answer(
        message.server_request_id, error={"code": METHOD_NOT_FOUND, "message": refusal}
    )


def encode_answer(server_request_id: Any, result: Any = None, error: Any = None) -> bytes:
    """The answer to a server's request: `result` (a JSON value) or `error` (code, message)."""
    echoed_id = canonical_json(server_request_id)
    if error is not None:
        return f'{{"jsonrpc":"2.0","id":{echoed_id},"error":{canonical_json(error)}}}'.encode()
    return f'{{"jsonrpc":"2.0","id":{echoed_id},"result":{canonical_json(result)}}}'.encode()


def read_message(data: bytes) -> Incoming:
    """Classify one message from a server; never raises.

    A message that fails the JSON boundary but still names one of our integer
    ids as a response is returned as `BAD_RESPONSE`, so the request it answers
    fails at once with the reason instead of waiting for its timeout.
    """
    try:
        value = parse_json(data)
    except JSONBoundaryError as exc:
        return _bad_bytes(data, str(exc))
    if not isinstance(value, dict):
        kind = "a batch" if isinstance(value, list) else "not an object"
        return Incoming(IncomingKind.INVALID, problem=f"the message is {kind}")
    if value.get("jsonrpc") != "2.0":
        return _attributed(value, 'the message is not JSON-RPC 2.0 ("jsonrpc" is not "2.0")')
    method = value.get("method")
    if "method" in value:
        if not isinstance(method, str):
            return Incoming(IncomingKind.INVALID, problem="the message's method is not a string")
        if "id" in value:
            server_id = value["id"]
            if not isinstance(server_id, (str, int)) or isinstance(server_id, bool):
                return Incoming(IncomingKind.INVALID, problem="a request id is not a string or int")
            return Incoming(
                IncomingKind.REQUEST,
                method=method,
                server_request_id=server_id,
                params=value.get("params"),
            )
        return Incoming(IncomingKind.NOTIFICATION, method=method, params=value.get("params"))
    request_id = value.get("id")
    if type(request_id) is not int:
        return Incoming(IncomingKind.INVALID, problem="a response id is not one of this client's")
    has_result, has_error = "result" in value, "error" in value
    if has_result == has_error:
        return Incoming(
            IncomingKind.BAD_RESPONSE,
            request_id=request_id,
            problem="the response carries neither or both of result and error",
        )
    if has_error:
        error = value["error"]
        if (
            not isinstance(error, dict)
            or type(error.get("code")) is not int
            or not isinstance(error.get("message"), str)
        ):
            return Incoming(
                IncomingKind.BAD_RESPONSE,
                request_id=request_id,
                problem="the error response is not an object with an integer code and a message",
            )
        return Incoming(IncomingKind.RESPONSE, request_id=request_id, error=error)
    return Incoming(IncomingKind.RESPONSE, request_id=request_id, result=value["result"])


def _attributed(value: dict[str, Any], problem: str) -> Incoming:
    request_id = value.get("id")
    if type(request_id) is int and "method" not in value:
        return Incoming(IncomingKind.BAD_RESPONSE, request_id=request_id, problem=problem)
    return Incoming(IncomingKind.INVALID, problem=problem)


def _bad_bytes(data: bytes, problem: str) -> Incoming:
    # A second, lenient read only to learn which request (if any) this answers;
    # nothing from it is ever used as a result.
    try:
        lenient = json.loads(data.decode("utf-8", errors="replace"))
    except (ValueError, RecursionError):
        return Incoming(IncomingKind.INVALID, problem=problem)
    if isinstance(lenient, dict):
        return _attributed(lenient, problem)
    return Incoming(IncomingKind.INVALID, problem=problem)


# Scanning an over-long message: outside a string only quotes and brackets
# matter; inside one, only a quote (escaped or not) stops the scan.
_STRUCTURE: Final = re.compile(rb'["{}\[\]]')
_KEPT_STRING_BYTES: Final = 256
_KEPT_TOP_LEVEL_BYTES: Final = 64 * 1024
_SCAN_BUDGET: Final = 100_000


class OverlongMessage:
    """The top level of a message too long to read, kept while its bytes are discarded.

    Only the outermost object is kept: every nested value becomes `0`, a
    long top-level string becomes `""`, so what is left is a few bytes that
    `parse_json` reads exactly, whatever order the server wrote its members
    in (the TypeScript SDK writes `id` after a result of any size).  The scan
    is bounded (`_SCAN_BUDGET` quotes and brackets); a message that spends it
    names no request.
    """

    def __init__(self) -> None:
        self.size = 0
        self._depth = 0
        self._in_string = False
        self._escaped = False  # the string so far ends in an odd run of backslashes
        self._string = bytearray()
        self._kept = bytearray()
        self._budget = _SCAN_BUDGET
        self._given_up = False

    def feed(self, data: bytes) -> None:
        """Scan the next bytes of the message (never a newline: the line ends there)."""
        self.size += len(data)
        position, end = 0, len(data)
        while position < end and not self._given_up:
            self._budget -= 1
            if self._budget < 0:
                self._given_up = True
                return
            if self._in_string:
                position = self._scan_string(data, position)
                continue
            found = _STRUCTURE.search(data, position)
            stop = end if found is None else found.start()
            if self._depth == 1:
                self._keep(data[position:stop])
            elif self._depth == 0 and data[position:stop].strip():
                self._given_up = True  # text outside the object: nothing to attribute
                return
            if found is None:
                return
            char = data[stop]
            position = stop + 1
            if char == 0x22:  # '"'
                self._in_string = True
                self._escaped = False
                self._string.clear()
            elif char in b"{[":
                self._depth += 1
                if self._depth == 1:
                    self._keep(bytes([char]))
                elif self._depth == 2:
                    self._keep(b"0")
            else:
                if self._depth == 1:
                    self._keep(bytes([char]))
                self._depth -= 1
                if self._depth < 0:
                    self._given_up = True

    def request_id(self) -> int | None:
        """The id of the request this message answers, when its top level can be read."""
        if self._given_up or self._depth != 0 or self._in_string:
            return None
        try:
            value = parse_json(bytes(self._kept))
        except JSONBoundaryError:
            return None
        if not isinstance(value, dict) or "method" in value:
            return None  # not an answer: a request or a notification of the server's own
        request_id = value.get("id")
        return request_id if type(request_id) is int else None

    def _scan_string(self, data: bytes, position: int) -> int:
        """Consume string bytes from `position`; return where scanning goes on."""
        end = len(data)
        while True:
            quote = data.find(b'"', position)
            stop = end if quote < 0 else quote
            segment = data[position:stop]
            self._keep_string(segment)
            # A quote is escaped by an odd run of backslashes before it, which
            # may have begun in the previous chunk.
            run = len(segment) - len(segment.rstrip(b"\\"))
            escaped = (run % 2 == 1) if run < len(segment) else (self._escaped != (run % 2 == 1))
            if quote < 0:
                self._escaped = escaped
                return end
            if escaped:
                self._keep_string(b'"')
                self._escaped = False
                position = quote + 1
                self._budget -= 1
                if self._budget < 0:
                    self._given_up = True
                    return end
                continue
            self._escaped = False
            self._in_string = False
            self._end_string()
            return quote + 1

    def _keep(self, data: bytes) -> None:
        self._kept += data
        if len(self._kept) > _KEPT_TOP_LEVEL_BYTES:
            self._given_up = True

    def _keep_string(self, data: bytes) -> None:
        if self._depth == 1 and len(self._string) <= _KEPT_STRING_BYTES:
            self._string += data

    def _end_string(self) -> None:
        if self._depth != 1:
            return
        if len(self._string) > _KEPT_STRING_BYTES:
            self._keep(b'""')
        else:
            self._keep(b'"' + bytes(self._string) + b'"')
