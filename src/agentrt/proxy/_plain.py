"""The stdio front's JSON-RPC read, checked and shaped as plain JSON (issue 36, decision 0061).

The SDK's pydantic models (`mcp_types`: 0.44 s of CPU and 25 MiB to import)
decide how a handshake-era host's message is read, which params are refused
with `-32602`, and how a result is shaped (which keys, in which order, which
defaults).  This module answers the same for the shapes a host and the
proxy's own handlers send every session, and for nothing else: each function
returns `UNDECIDED` for a shape it cannot prove the models treat as it does,
and its caller then imports the models and asks them (`_dispatch`).  It never
refuses anything itself: every refusal is the models'.

What "prove" means here: `tests/proxy/test_proxy_plain_wire.py` feeds the
same generated messages, params and results to these functions and to the
models and asserts that wherever these decide, they decide alike, value for
value and key order included; the front's transcripts
(`tests/proxy/test_proxy_front_golden.py`) hold the bytes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

from ..mcp._handshake import HANDSHAKE_PROTOCOL_VERSIONS, LATEST_HANDSHAKE_VERSION

__all__ = [
    "CONNECTION_CLOSED",
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "PARSE_ERROR",
    "UNDECIDED",
    "CallParams",
    "ErrorReply",
    "Message",
    "Notification",
    "Request",
    "RequestId",
    "Response",
    "checked_params",
    "field",
    "initialize_result",
    "listed_plainly",
    "listed_tool",
    "message_of",
    "message_of_model",
    "model_of",
    "monolith_call_result",
    "plainly_listable",
    "shaped_offers",
    "shaped_result",
    "shaped_tool",
    "wire_form",
]

# The SDK's `mcp_types` error codes (a test holds them equal).
PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600
INVALID_PARAMS: Final = -32602
INTERNAL_ERROR: Final = -32603
CONNECTION_CLOSED: Final = -32000


class _Undecided:
    """What a function returns for a shape only the SDK's models may judge (one instance,
    `UNDECIDED`, compared with `is`)."""

    def __repr__(self) -> str:
        return "UNDECIDED"


UNDECIDED: Final = _Undecided()

RequestId = int | str


@dataclass(slots=True)
class Request:
    id: RequestId
    method: str
    params: dict[str, Any] | None = None


@dataclass(slots=True)
class Notification:
    method: str
    params: dict[str, Any] | None = None


@dataclass(slots=True)
class Response:
    id: RequestId
    result: dict[str, Any]


@dataclass(slots=True)
class ErrorReply:
    id: RequestId | None
    error: dict[str, Any]


Message = Request | Notification | Response | ErrorReply

_REQUEST_KEYS: Final = frozenset({"jsonrpc", "id", "method", "params"})
_NOTIFICATION_KEYS: Final = frozenset({"jsonrpc", "method", "params"})
_RESPONSE_KEYS: Final = frozenset({"jsonrpc", "id", "result"})
_ERROR_KEYS: Final = frozenset({"jsonrpc", "id", "error"})


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def message_of(raw: bytes) -> Message | _Undecided:
    """A screened line (`_host_messages.screen`: one JSON object, `"jsonrpc": "2.0"`, a
    usable id) as `jsonrpc_message_adapter.validate_json` reads it, for the four plain
    shapes; `UNDECIDED` for any other (extra keys, a `params` that is not an object, ...)."""
    value = json.loads(raw)
    keys = value.keys()
    params = value.get("params")
    if params is not None and not isinstance(params, dict):
        return UNDECIDED
    method = value.get("method")
    if "method" in value:
        if not isinstance(method, str):
            return UNDECIDED
        if "id" in value:
            request_id = value["id"]
            if keys <= _REQUEST_KEYS and (isinstance(request_id, str) or _is_int(request_id)):
                return Request(request_id, method, params)
            return UNDECIDED
        if keys <= _NOTIFICATION_KEYS:
            return Notification(method, params)
        return UNDECIDED
    request_id = value.get("id")
    if "result" in value:
        result = value["result"]
        if (
            keys == _RESPONSE_KEYS
            and isinstance(result, dict)
            and (isinstance(request_id, str) or _is_int(request_id))
        ):
            return Response(request_id, result)
        return UNDECIDED
    error = value.get("error")
    if (
        keys == _ERROR_KEYS
        and (request_id is None or isinstance(request_id, str) or _is_int(request_id))
        and isinstance(error, dict)
        and error.keys() <= {"code", "message", "data"}
        and _is_int(error.get("code"))
        and isinstance(error.get("message"), str)
    ):
        return ErrorReply(request_id, dict(error))
    return UNDECIDED


def wire_form(message: Message) -> dict[str, Any]:
    """The message as a JSON object, with only the members it was given."""
    match message:
        case Request(request_id, method, params):
            body: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
            if params is not None:
                body["params"] = params
            return body
        case Notification(method, params):
            body = {"jsonrpc": "2.0", "method": method}
            if params is not None:
                body["params"] = params
            return body
        case Response(request_id, result):
            return {"jsonrpc": "2.0", "id": request_id, "result": result}
        case ErrorReply(request_id, error):
            return {"jsonrpc": "2.0", "id": request_id, "error": error}
    raise TypeError(f"not a message: {message!r}")  # pragma: no cover


def message_of_model(model: Any) -> Message:
    """The SDK's decoding of a message (`mcp_types.JSONRPCMessage`) as a plain one."""
    body = model.model_dump(by_alias=True, exclude_unset=True)
    if "method" in body:
        if "id" in body:
            return Request(body["id"], body["method"], body.get("params"))
        return Notification(body["method"], body.get("params"))
    if "result" in body:
        return Response(body["id"], body["result"])
    return ErrorReply(body.get("id"), body["error"])


def model_of(message: Message) -> Any:
    """The message as the SDK's server takes it (`mcp_types.JSONRPCMessage`)."""
    import mcp_types as types

    return types.jsonrpc_message_adapter.validate_python(wire_form(message), by_name=False)


def field(value: Any, key: str, attribute: str | None = None) -> Any:
    """A member of the host's `initialize` params as the stdio front keeps them (the JSON
    object, `key`) or as the SDK's session does (its model, `attribute`, `key` by default);
    None where absent."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        return value.get(key)
    return getattr(value, attribute or key, None)


# -- the params of the methods the front answers --------------------------------------


@dataclass(slots=True)
class CallParams:
    """A `tools/call`'s params as the handlers read them (`types.CallToolRequestParams`'
    `name`, `arguments` and `meta`)."""

    name: str
    arguments: dict[str, Any] | None
    meta: dict[str, Any] | None


def _meta(params: Mapping[str, Any]) -> dict[str, Any] | _Undecided | None:
    """A request's `_meta` as `RequestParamsMeta` validates it (the progress token under
    its Python name, first), for a plain token; `UNDECIDED` otherwise."""
    meta = params.get("_meta")
    if meta is None:
        return None
    if not isinstance(meta, dict) or "progress_token" in meta:
        return UNDECIDED
    if "progressToken" not in meta:
        return dict(meta)
    token = meta["progressToken"]
    if not (isinstance(token, str) or _is_int(token)):
        return UNDECIDED
    return {"progress_token": token, **{k: v for k, v in meta.items() if k != "progressToken"}}


def _optional_str(params: Mapping[str, Any], key: str) -> bool:
    value = params.get(key)
    return value is None or isinstance(value, str)


_SUBCAPABILITIES: Final = {
    "roots": frozenset({"listChanged"}),
    "sampling": frozenset({"context", "tools"}),
    "elicitation": frozenset({"form", "url"}),
}
_CLIENT_INFO_STRINGS: Final = frozenset({"title", "description", "websiteUrl"})


def _plain_capabilities(capabilities: Any) -> bool:
    """Client capabilities both eras' models accept as they are: each known capability
    absent, null, or an object of its known members, each null or `{}` (`listChanged` a
    boolean); `experimental` and `extensions` objects of objects."""
    if not isinstance(capabilities, dict):
        return False
    for key, value in capabilities.items():
        if value is None:
            continue
        if key in ("experimental", "extensions"):
            if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
                return False
        elif key == "tasks":
            return False
        elif key in _SUBCAPABILITIES:
            if not isinstance(value, dict) or not value.keys() <= _SUBCAPABILITIES[key]:
                return False
            for member, setting in value.items():
                if setting is None:
                    continue
                if member == "listChanged":
                    if not isinstance(setting, bool):
                        return False
                elif setting != {}:
                    return False
    return True


def _plain_initialize(params: Mapping[str, Any]) -> bool:
    client = params.get("clientInfo")
    return (
        isinstance(params.get("protocolVersion"), str)
        and _plain_capabilities(params.get("capabilities"))
        and isinstance(client, dict)
        and isinstance(client.get("name"), str)
        and isinstance(client.get("version"), str)
        and "icons" not in client
        and all(_optional_str(client, key) for key in _CLIENT_INFO_STRINGS)
    )


_PAGINATED: Final = frozenset({"tools/list", "prompts/list", "resources/list",
                               "resources/templates/list"})  # fmt: skip
_RETRY_KEYS: Final = ("task", "inputResponses", "requestState")


def checked_params(method: str, params: dict[str, Any] | None) -> Any:
    """The params of a request the front answers as the models accept them: for
    `tools/call` a `CallParams`, for `initialize` the params themselves, for `ping` and
    the listings the params (their handlers read none); `UNDECIDED` for any shape only
    the models may judge, refused ones included."""
    if params is None:
        return None if method == "ping" or method in _PAGINATED else UNDECIDED
    meta = _meta(params)
    if meta is UNDECIDED:
        return UNDECIDED
    if method == "tools/call":
        name, arguments = params.get("name"), params.get("arguments")
        if (
            not isinstance(name, str)
            or not (arguments is None or isinstance(arguments, dict))
            or any(key in params for key in _RETRY_KEYS)
        ):
            return UNDECIDED
        return CallParams(name, None if arguments is None else dict(arguments), meta)  # type: ignore[arg-type]
    if method in _PAGINATED:
        return params if _optional_str(params, "cursor") else UNDECIDED
    if method == "ping":
        return params
    if method == "initialize":
        return params if _plain_initialize(params) else UNDECIDED
    return UNDECIDED


def agreed_version(params: Mapping[str, Any]) -> str:
    """The version a handshake agrees on, as the SDK's runner agrees it."""
    requested = params.get("protocolVersion")
    return requested if requested in HANDSHAKE_PROTOCOL_VERSIONS else LATEST_HANDSHAKE_VERSION  # type: ignore[return-value]


# -- results ---------------------------------------------------------------------------


def initialize_result(
    version: str, instructions: str, name: str, server_version: str
) -> dict[str, Any]:
    """The proxy's `initialize` answer as the handshake era's `InitializeResult` shapes it:
    the capabilities of `_dispatch.SERVER_CAPABILITIES` that era names (a test holds the two
    equal, for every handshake version)."""
    return {
        "capabilities": {
            "completions": {},
            "logging": {},
            "prompts": {"listChanged": True},
            "resources": {"listChanged": True, "subscribe": True},
            "tools": {"listChanged": True},
        },
        "instructions": instructions,
        "protocolVersion": version,
        "serverInfo": {"name": name, "version": server_version},
    }


def _text_block(block: Any) -> dict[str, Any] | _Undecided:
    """A `{"type": "text", ...}` content block as the `TextContent` models both take it."""
    if not isinstance(block, dict) or block.get("type") != "text" or "annotations" in block:
        return UNDECIDED
    text, meta = block.get("text"), block.get("_meta")
    if not isinstance(text, str) or not (meta is None or isinstance(meta, dict)):
        return UNDECIDED
    kept: dict[str, Any] = {"type": "text", "text": text}
    if meta is not None:
        kept["_meta"] = meta
    return kept


def monolith_call_result(raw: Mapping[str, Any]) -> dict[str, Any] | _Undecided:
    """`types.CallToolResult.model_validate(raw).model_dump(by_alias=True, mode="json",
    exclude_none=True)` for a result of text blocks; `UNDECIDED` for any other."""
    content, meta = raw.get("content"), raw.get("_meta")
    structured, is_error = raw.get("structuredContent"), raw.get("isError", False)
    if (
        not isinstance(content, list)
        or not (meta is None or isinstance(meta, dict))
        or not (structured is None or isinstance(structured, dict))
        or not isinstance(is_error, bool)
        or raw.get("resultType", "complete") != "complete"
    ):
        return UNDECIDED
    blocks = [_text_block(block) for block in content]
    if UNDECIDED in blocks:
        return UNDECIDED
    return call_result(blocks, is_error, structured, meta)  # type: ignore[arg-type]


def call_result(
    content: list[dict[str, Any]],
    is_error: bool,
    structured: dict[str, Any] | None = None,
    meta: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A call result as the `CallToolResult` model dumps it (its fields' order)."""
    result: dict[str, Any] = {} if meta is None else {"_meta": meta}
    result["content"] = content
    if structured is not None:
        result["structuredContent"] = structured
    result["isError"] = is_error
    result["resultType"] = "complete"
    return result


def listed_tool(
    name: str,
    title: str | None,
    description: str | None,
    input_schema: dict[str, Any],
    output_schema: dict[str, Any] | None,
    *,
    read_only: bool,
    destructive: bool,
    meta: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A tool as the `Tool` model dumps it (its fields' order), with the operator's hints."""
    tool: dict[str, Any] = {"name": name}
    if title is not None:
        tool["title"] = title
    if description is not None:
        tool["description"] = description
    tool["inputSchema"] = input_schema
    if output_schema is not None:
        tool["outputSchema"] = output_schema
    tool["annotations"] = {"readOnlyHint": read_only, "destructiveHint": destructive}
    if meta is not None:
        tool["_meta"] = meta
    return tool


_SCHEMA_FIELDS: Final = ("$schema", "properties", "required", "type")


def _object_schema(schema: Any) -> dict[str, Any] | _Undecided:
    """An `inputSchema`/`outputSchema` as the handshake era's schema model shapes it: its
    fields first, in their order, then the rest as given, nulls among them left out."""
    if not isinstance(schema, dict) or schema.get("type") != "object":
        return UNDECIDED
    dialect, properties, required = (
        schema.get("$schema"), schema.get("properties"), schema.get("required")
    )  # fmt: skip
    if not (dialect is None or isinstance(dialect, str)):
        return UNDECIDED
    if properties is not None and not (
        isinstance(properties, dict)
        and all(isinstance(v, (dict, bool)) for v in properties.values())
    ):
        return UNDECIDED
    if required is not None and not (
        isinstance(required, list) and all(isinstance(v, str) for v in required)
    ):
        return UNDECIDED
    shaped: dict[str, Any] = {}
    if dialect is not None:
        shaped["$schema"] = dialect
    if properties is not None:
        shaped["properties"] = {k: (dict(v) if isinstance(v, dict) else v)
                                for k, v in properties.items()}  # fmt: skip
    if required is not None:
        shaped["required"] = list(required)
    shaped["type"] = "object"
    for key, value in schema.items():
        if key not in _SCHEMA_FIELDS and value is not None:
            shaped[key] = value
    return shaped


_TOOL_KEYS: Final = frozenset(
    {"name", "title", "description", "inputSchema", "outputSchema", "annotations", "_meta"}
)
_HINTS: Final = ("destructiveHint", "idempotentHint", "openWorldHint", "readOnlyHint")


def _tool(tool: Any) -> dict[str, Any] | _Undecided:
    """A listed tool (the `Tool` model's dump) as the handshake era's `Tool` shapes it."""
    return shaped_tool(tool, _object_schema, _object_schema, lambda meta: isinstance(meta, dict))


def shaped_tool(
    tool: Any,
    input_schema: Callable[[Any], dict[str, Any] | _Undecided],
    output_schema: Callable[[Any], dict[str, Any] | _Undecided],
    meta_kept: Callable[[Any], bool],
) -> dict[str, Any] | _Undecided:
    """A listed tool as an era's `Tool` shapes it, its fields in their order (both eras
    order them alike): the schemas as the era shapes them, a `_meta` the era keeps as it
    is; `UNDECIDED` for any other shape."""
    if not isinstance(tool, dict) or not tool.keys() <= _TOOL_KEYS:
        return UNDECIDED
    name, title, description = tool.get("name"), tool.get("title"), tool.get("description")
    annotations, meta = tool.get("annotations"), tool.get("_meta")
    if (
        not isinstance(name, str)
        or not _optional_str(tool, "title")
        or not _optional_str(tool, "description")
        or not (meta is None or meta_kept(meta))
    ):
        return UNDECIDED
    shaped: dict[str, Any] = {} if meta is None else {"_meta": meta}
    if annotations is not None:
        if not isinstance(annotations, dict) or not annotations.keys() <= {*_HINTS, "title"}:
            return UNDECIDED
        hints = {k: annotations[k] for k in _HINTS if annotations.get(k) is not None}
        if not all(isinstance(v, bool) for v in hints.values()) or not _optional_str(
            annotations, "title"
        ):
            return UNDECIDED
        if annotations.get("title") is not None:
            hints["title"] = annotations["title"]
        shaped["annotations"] = hints
    if description is not None:
        shaped["description"] = description
    listed_input = input_schema(tool.get("inputSchema"))
    if listed_input is UNDECIDED:
        return UNDECIDED
    shaped["inputSchema"] = listed_input
    shaped["name"] = name
    if tool.get("outputSchema") is not None:
        listed_output = output_schema(tool["outputSchema"])
        if listed_output is UNDECIDED:
            return UNDECIDED
        shaped["outputSchema"] = listed_output
    if title is not None:
        shaped["title"] = title
    return shaped


_LISTS: Final = {
    "prompts/list": "prompts",
    "resources/list": "resources",
    "resources/templates/list": "resourceTemplates",
}


class _Offer(NamedTuple):
    """A listed prompt's, resource's or template's members: in the order the SDK's model
    dumps them (`by_alias`, nulls left out), in the order both eras' wire types do
    (`_meta` first, then by field name), the ones it must have (strings), and those whose
    values `plainly_listable` checks in a server's item."""

    dumped: tuple[str, ...]
    wire: tuple[str, ...]
    required: tuple[str, ...]
    checked: frozenset[str]


# A server's prompts, resources and templates in plain JSON (decision 0068), by the key
# their listing gives them; an item with a member of neither order (icons, annotations)
# is left to the models.
_OFFERS: Final = {
    "prompts": _Offer(
        dumped=("name", "title", "description", "arguments", "_meta"),
        wire=("_meta", "arguments", "description", "name", "title"),
        required=("name",),
        checked=frozenset({"title", "description", "mimeType", "_meta", "arguments"}),
    ),
    "resources": _Offer(
        dumped=("name", "title", "uri", "description", "mimeType", "size", "_meta"),
        wire=("_meta", "description", "mimeType", "name", "size", "title", "uri"),
        required=("name", "uri"),
        checked=frozenset({"title", "description", "mimeType", "_meta", "size"}),
    ),
    "resourceTemplates": _Offer(
        dumped=("name", "title", "uriTemplate", "description", "mimeType", "_meta"),
        wire=("_meta", "description", "mimeType", "name", "title", "uriTemplate"),
        required=("name", "uriTemplate"),
        checked=frozenset({"title", "description", "mimeType", "_meta"}),
    ),
}
_ARGUMENT: Final = _Offer(
    dumped=("name", "title", "description", "required"),
    wire=("description", "name", "required", "title"),
    required=("name",),
    checked=frozenset({"title", "description", "required"}),
)
# Python names the models also accept for a member (`populate_by_name`), and the members
# whose values are models of their own: where one is present, the model decides.
_TO_THE_MODEL: Final = frozenset({"mime_type", "uri_template", "meta", "icons", "annotations"})


def _plain_kind(member: str, value: Any) -> bool:
    """Whether an offer's (not null) member is of the plain kind the models take."""
    if member == "_meta":
        return type(value) is dict
    if member == "arguments":
        return type(value) is list and all(
            _plainly(argument, _ARGUMENT, frozenset()) for argument in value
        )
    if member == "size":
        return type(value) is int and -(2**63) <= value < 2**63
    if member == "required":
        return type(value) is bool
    return type(value) is str


def _plainly(item: Any, offer: _Offer, to_the_model: frozenset[str]) -> bool:
    if type(item) is not dict:
        return False
    if any(type(item.get(member)) is not str for member in offer.required):
        return False
    for member, value in item.items():
        if value is None:
            continue
        if member in to_the_model:
            return False
        if member in offer.checked and not _plain_kind(member, value):
            return False
    return True


def plainly_listable(key: str, item: Any) -> bool:
    """Whether a server's prompt, resource or resource template (`key`: its listing's,
    the item its plain JSON) is one the SDK's model certainly accepts, decided without
    importing the models (issue 36: `mcp_types` costs ~0.2 s at start): its required
    members strings, the others it has of the plain kinds the model takes (text or null,
    a 64-bit integer or null, an object or null for `_meta`, a prompt's arguments of the
    same).  False is not a refusal: the model decides whatever this cannot."""
    return _plainly(item, _OFFERS[key], _TO_THE_MODEL)


def listed_plainly(key: str, items: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """`items` as the SDK's model dumps each (`by_alias`, `mode="json"`, nulls left out),
    when every one is `plainly_listable`; None when the models must."""
    if not all(plainly_listable(key, item) for item in items):
        return None
    return [_dumped(item, _OFFERS[key].dumped) for item in items]


def _dumped(item: dict[str, Any], order: tuple[str, ...]) -> dict[str, Any]:
    kept = {member: item[member] for member in order if item.get(member) is not None}
    if "arguments" in kept:
        kept["arguments"] = [_dumped(argument, _ARGUMENT.dumped) for argument in kept["arguments"]]
    return kept


def shaped_offers(
    key: str, items: list[Any], meta_kept: Callable[[Any], bool]
) -> list[dict[str, Any]] | _Undecided:
    """A listing's prompts, resources or templates (`key`, each a handler's dump of the
    SDK's model) as an era's wire type shapes them, their members in its order; a `_meta`
    kept as it is where `meta_kept` says the era keeps it; `UNDECIDED` for any other
    shape."""

    def shaped_value(member: str, value: Any) -> Any:
        if member == "_meta":
            return value if meta_kept(value) else UNDECIDED
        if member == "arguments":
            if not isinstance(value, list):
                return UNDECIDED
            arguments = [_in_wire_order(argument, _ARGUMENT, shaped_value) for argument in value]
            return UNDECIDED if UNDECIDED in arguments else arguments
        return value if _plain_kind(member, value) else UNDECIDED

    shaped: list[dict[str, Any]] = []
    for item in items:
        kept = _in_wire_order(item, _OFFERS[key], shaped_value)
        if not isinstance(kept, dict):
            return UNDECIDED
        shaped.append(kept)
    return shaped


def _in_wire_order(
    item: Any, offer: _Offer, shaped_value: Callable[[str, Any], Any]
) -> dict[str, Any] | _Undecided:
    """`item`'s members in the wire order, nulls left out, each as `shaped_value` gives
    it; `UNDECIDED` for an item of other members, without one it must have, or with a
    value `shaped_value` does not decide."""
    if not isinstance(item, dict) or not item.keys() <= set(offer.wire):
        return UNDECIDED
    if any(not isinstance(item.get(member), str) for member in offer.required):
        return UNDECIDED
    kept: dict[str, Any] = {}
    for member in offer.wire:
        value = item.get(member)
        if value is None:
            continue
        shaped = shaped_value(member, value)
        if isinstance(shaped, _Undecided):
            return UNDECIDED
        kept[member] = shaped
    return kept


def shaped_result(method: str, result: Mapping[str, Any]) -> dict[str, Any] | _Undecided:
    """`methods.serialize_server_result(method, <a handshake-era version>, result)` for a
    handler's result of the plain shapes; `UNDECIDED` for any other."""
    if any(result.get(key) is not None for key in ("_meta", "nextCursor")):
        return UNDECIDED
    if method == "ping":
        return {} if not result else UNDECIDED
    if method == "tools/list":
        tools = result.get("tools")
        if not isinstance(tools, list):
            return UNDECIDED
        shaped = [_tool(tool) for tool in tools]
        return UNDECIDED if UNDECIDED in shaped else {"tools": shaped}
    if method == "tools/call":
        content = result.get("content")
        structured, is_error = result.get("structuredContent"), result.get("isError")
        if (
            not isinstance(content, list)
            or not (structured is None or isinstance(structured, dict))
            or not (is_error is None or isinstance(is_error, bool))
        ):
            return UNDECIDED
        blocks: list[Any] = []
        for block in content:
            kept = _text_block(block)
            if kept is UNDECIDED:
                return UNDECIDED
            assert isinstance(kept, dict)
            blocks.append(
                {"_meta": kept["_meta"], "text": kept["text"], "type": "text"}
                if "_meta" in kept
                else {"text": kept["text"], "type": "text"}
            )
        call: dict[str, Any] = {"content": blocks}
        if is_error is not None:
            call["isError"] = is_error
        if structured is not None:
            call["structuredContent"] = structured
        return call
    key = _LISTS.get(method)
    if key is not None and isinstance(result.get(key), list):
        offers = shaped_offers(key, result[key], lambda meta: isinstance(meta, dict))
        return UNDECIDED if offers is UNDECIDED else {key: offers}
    return UNDECIDED
