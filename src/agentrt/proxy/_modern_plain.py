"""A 2026-07-28 request checked, and its result shaped, as plain JSON (issue 36, decision 0062).

`_modern` answers a host of the 2026-07-28 era (Claude Code) as the SDK's
modern stream does: each request checked against the era's wire type and
the handler's params model, each result shaped by the era's wire type.
Those are pydantic models (`mcp_types` and `mcp_types.methods`: 0.5 s of
CPU to import), and a host of this era waited for them before its first
answer.  This module decides the same for the shapes such a host and the
proxy's own handlers send, as `_plain` does for the handshake era: each
function returns `UNDECIDED` for a shape it cannot prove the models treat
as it does, and `_modern` then asks the models exactly as before.  Nothing
here refuses anything; every refusal is the models'.

The proof: `tests/proxy/test_proxy_modern_plain.py` feeds the same
generated params and results here and to `mcp_types.methods` (the era's
`validate_client_request` and `serialize_server_result`) and the params
models, and asserts that wherever these decide, the models accept alike
and shape alike, value for value and key order included; the front's
2026 transcript (`tests/proxy/golden/front_modern.txt`) holds the bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from ._plain import (
    UNDECIDED,
    _is_int,
    _optional_str,
    _plain_capabilities,
    _text_block,
    _Undecided,
    checked_params,
    shaped_offers,
    shaped_tool,
)
from ._revision import LOG_LEVEL_META_KEY, PROTOCOL_VERSION_META_KEY

__all__ = [
    "CLIENT_CAPABILITIES_META_KEY",
    "CLIENT_INFO_META_KEY",
    "LOG_LEVELS",
    "LOG_LEVEL_META_KEY",
    "METHOD_NOT_FOUND",
    "MODERN_PROTOCOL_VERSIONS",
    "NOT_OF_THE_ERA",
    "PROTOCOL_VERSION_META_KEY",
    "SERVER_INFO_META_KEY",
    "UNSUPPORTED_PROTOCOL_VERSION",
    "checked_request",
    "client_capabilities",
    "client_info",
    "discover_result",
    "honored_filter",
    "shaped_result",
]

# The SDK's names for the era (`mcp_types`; a test holds them equal); the protocol
# version's and the log level's keys are `_revision`'s.
CLIENT_CAPABILITIES_META_KEY: Final = "io.modelcontextprotocol/clientCapabilities"
CLIENT_INFO_META_KEY: Final = "io.modelcontextprotocol/clientInfo"
SERVER_INFO_META_KEY: Final = "io.modelcontextprotocol/serverInfo"
SUBSCRIPTION_ID_META_KEY: Final = "io.modelcontextprotocol/subscriptionId"
MODERN_PROTOCOL_VERSIONS: Final = ("2026-07-28",)
METHOD_NOT_FOUND: Final = -32601
UNSUPPORTED_PROTOCOL_VERSION: Final = -32022
# The wire's logging levels, lowest first (`mcp_types.LoggingLevel`).
LOG_LEVELS: Final = (
    "debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"
)  # fmt: skip

NOT_OF_THE_ERA: Final = frozenset({"ping"})
"""Methods the front takes that the era does not have: the models answer them with
`Method not found` (a test holds this to `mcp_types.methods.CLIENT_REQUESTS`)."""

# -- the request ------------------------------------------------------------------------

_ENVELOPE_KEYS: Final = frozenset(
    {
        PROTOCOL_VERSION_META_KEY,
        CLIENT_CAPABILITIES_META_KEY,
        CLIENT_INFO_META_KEY,
        LOG_LEVEL_META_KEY,
    }
)
# A key spelled as a field's Python name: the models' reading of it is theirs to say.
_PYTHON_NAMES: Final = frozenset(
    {
        "progress_token",
        "io_modelcontextprotocol_client_capabilities",
        "io_modelcontextprotocol_client_info",
        "io_modelcontextprotocol_log_level",
        "io_modelcontextprotocol_protocol_version",
    }
)
_CLIENT_INFO_STRINGS: Final = ("title", "description", "websiteUrl")


def client_info(value: Any) -> dict[str, Any] | _Undecided | None:
    """The envelope's client info as both eras' `Implementation` accept it as it is
    (None when absent); `UNDECIDED` for any other shape."""
    if value is None:
        return None
    if (
        isinstance(value, dict)
        and isinstance(value.get("name"), str)
        and isinstance(value.get("version"), str)
        and "icons" not in value
        and all(_optional_str(value, key) for key in _CLIENT_INFO_STRINGS)
    ):
        return value
    return UNDECIDED


def client_capabilities(value: Any) -> dict[str, Any] | _Undecided:
    """The envelope's client capabilities as both eras' `ClientCapabilities` accept them as
    they are; `UNDECIDED` for any other shape."""
    return value if _plain_capabilities(value) else UNDECIDED  # type: ignore[no-any-return]


def _envelope(meta: Any) -> bool:
    """Whether `_meta` is an envelope the era's `RequestMetaObject` accepts as it is."""
    if not isinstance(meta, dict) or not meta.keys().isdisjoint(_PYTHON_NAMES):
        return False
    token = meta.get("progressToken")
    level = meta.get(LOG_LEVEL_META_KEY)
    return (
        isinstance(meta.get(PROTOCOL_VERSION_META_KEY), str)
        and CLIENT_CAPABILITIES_META_KEY in meta
        and client_capabilities(meta[CLIENT_CAPABILITIES_META_KEY]) is not UNDECIDED
        and client_info(meta.get(CLIENT_INFO_META_KEY)) is not UNDECIDED
        and (level is None or level in LOG_LEVELS)
        and (token is None or isinstance(token, str) or _is_int(token))
    )


_FILTER_FLAGS: Final = ("toolsListChanged", "promptsListChanged", "resourcesListChanged")
_FILTER_KEYS: Final = frozenset({*_FILTER_FLAGS, "resourceSubscriptions"})


def _subscription_filter(value: Any) -> bool:
    """Whether a listen request's `notifications` is a filter both eras accept as it is."""
    if not isinstance(value, dict) or not value.keys() <= _FILTER_KEYS:
        return False
    uris = value.get("resourceSubscriptions")
    return all(
        value.get(flag) is None or isinstance(value[flag], bool) for flag in _FILTER_FLAGS
    ) and (uris is None or (isinstance(uris, list) and all(isinstance(uri, str) for uri in uris)))


_LISTINGS: Final = frozenset(
    {"tools/list", "prompts/list", "resources/list", "resources/templates/list"}
)


def checked_request(method: str, params: dict[str, Any] | None) -> Any:
    """A request of the era the front answers, as the era's wire type and the handler's
    params model accept it: the params as the handler takes them (`_plain.CallParams` for
    `tools/call`, the params object for the others); `UNDECIDED` for any shape only the
    models may judge, refused ones included."""
    if params is None or not _envelope(params.get("_meta")):
        return UNDECIDED
    if method == "server/discover":
        return params if checked_params("ping", params) is not UNDECIDED else UNDECIDED
    if method in _LISTINGS or method == "tools/call":
        return checked_params(method, params)
    if method == "subscriptions/listen":
        if checked_params("ping", params) is UNDECIDED:
            return UNDECIDED
        return params if _subscription_filter(params.get("notifications")) else UNDECIDED
    return UNDECIDED


def honored_filter(requested: Mapping[str, Any]) -> dict[str, Any]:
    """The kinds of a listen request's filter the proxy honours, as the SDK's
    `_honored_subset` dumps them: every kind asked for, falsy ones left out."""
    honored: dict[str, Any] = {flag: True for flag in _FILTER_FLAGS if requested.get(flag)}
    uris = requested.get("resourceSubscriptions")
    if uris:
        honored["resourceSubscriptions"] = list(uris)
    return honored


# -- the result -------------------------------------------------------------------------


def discover_result(instructions: str) -> dict[str, Any]:
    """`server/discover`'s result as the SDK's `DiscoverResult` dumps it for the proxy's
    server (a test holds the two equal): what it serves at the era."""
    return {
        "ttlMs": 0,
        "cacheScope": "private",
        "supportedVersions": list(MODERN_PROTOCOL_VERSIONS),
        "capabilities": {
            "logging": {},
            "prompts": {"listChanged": True},
            "resources": {"subscribe": True, "listChanged": True},
            "tools": {"listChanged": True},
            "completions": {},
        },
        "instructions": instructions,
        "resultType": "complete",
    }


def _plain_meta(meta: Any, *fields: str) -> bool:
    """A result's `_meta` the era keeps as it is: an object without nulls and without the
    keys its model names as fields (which it would move first)."""
    return isinstance(meta, dict) and all(
        value is not None and key not in fields for key, value in meta.items()
    )


def _cache_hints(result: Mapping[str, Any]) -> bool:
    ttl = result.get("ttlMs")
    hinted = isinstance(ttl, int) and not isinstance(ttl, bool) and ttl >= 0
    return hinted and result.get("cacheScope") in ("private", "public")


def _put_meta(shaped: dict[str, Any], result: Mapping[str, Any]) -> bool:
    """`_meta` first, as the era's results dump it; False where it is not plain."""
    meta = result.get("_meta")
    if meta is None:
        return True
    if not _plain_meta(meta, SERVER_INFO_META_KEY):
        return False
    shaped["_meta"] = dict(meta)
    return True


_CAPABILITY_FLAGS: Final = {
    "prompts": ("listChanged",),
    "resources": ("listChanged", "subscribe"),
    "tools": ("listChanged",),
}
_CAPABILITY_ORDER: Final = (
    "completions", "experimental", "extensions", "logging", "prompts", "resources", "tools"
)  # fmt: skip


def _server_capabilities(value: Any) -> dict[str, Any] | _Undecided:
    """Server capabilities as the era's `ServerCapabilities` shapes them, for objects of the
    known capabilities (each null or its known flags) and nothing else."""
    if not isinstance(value, dict) or not value.keys() <= set(_CAPABILITY_ORDER):
        return UNDECIDED
    shaped: dict[str, Any] = {}
    for key in _CAPABILITY_ORDER:
        setting = value.get(key)
        if setting is None:
            continue
        if not isinstance(setting, dict):
            return UNDECIDED
        flags = _CAPABILITY_FLAGS.get(key)
        if flags is None:
            if key in ("experimental", "extensions") and not all(
                isinstance(v, dict) for v in setting.values()
            ):
                return UNDECIDED
            shaped[key] = setting
            continue
        if not setting.keys() <= set(flags):
            return UNDECIDED
        kept = {flag: setting[flag] for flag in flags if setting.get(flag) is not None}
        if not all(isinstance(v, bool) for v in kept.values()):
            return UNDECIDED
        shaped[key] = kept
    return shaped


def _discover(result: Mapping[str, Any]) -> dict[str, Any] | _Undecided:
    versions, instructions = result.get("supportedVersions"), result.get("instructions")
    capabilities = _server_capabilities(result.get("capabilities"))
    if (
        not _cache_hints(result)
        or capabilities is UNDECIDED
        or not isinstance(versions, list)
        or not all(isinstance(v, str) for v in versions)
        or not _optional_str(result, "instructions")
    ):
        return UNDECIDED
    shaped: dict[str, Any] = {}
    if not _put_meta(shaped, result):
        return UNDECIDED
    shaped["cacheScope"] = result["cacheScope"]
    shaped["capabilities"] = capabilities
    if instructions is not None:
        shaped["instructions"] = instructions
    shaped["resultType"] = result["resultType"]
    shaped["supportedVersions"] = list(versions)
    shaped["ttlMs"] = result["ttlMs"]
    return shaped


def _schema(schema: Any, *, input_schema: bool) -> dict[str, Any] | _Undecided:
    """An `inputSchema` (its `$schema` and `type` fields first) or `outputSchema` (its
    `$schema` first) as the era shapes it: the rest as given, nulls left out."""
    if not isinstance(schema, dict) or (input_schema and schema.get("type") != "object"):
        return UNDECIDED
    dialect = schema.get("$schema")
    if not (dialect is None or isinstance(dialect, str)):
        return UNDECIDED
    shaped: dict[str, Any] = {} if dialect is None else {"$schema": dialect}
    if input_schema:
        shaped["type"] = "object"
    for key, value in schema.items():
        if key not in shaped and key != "$schema" and value is not None:
            shaped[key] = value
    return shaped


def _tool(tool: Any) -> dict[str, Any] | _Undecided:
    """A listed tool as the era's `Tool` shapes it (its fields in their order)."""
    return shaped_tool(
        tool,
        lambda schema: _schema(schema, input_schema=True),
        lambda schema: _schema(schema, input_schema=False),
        _plain_meta,
    )


# Each listing's items: the key they are listed under.
_LISTED: Final = {
    "tools/list": "tools",
    "prompts/list": "prompts",
    "resources/list": "resources",
    "resources/templates/list": "resourceTemplates",
}


def _listing(method: str, result: Mapping[str, Any]) -> dict[str, Any] | _Undecided:
    """A listing as the era's `List…Result` shapes it: `_meta`, then its fields in
    alphabetical order (the items' key among them)."""
    key = _LISTED[method]
    items, cursor = result.get(key), result.get("nextCursor")
    if (
        not _cache_hints(result)
        or not isinstance(items, list)
        or not _optional_str(result, "nextCursor")
    ):
        return UNDECIDED
    listed: list[Any] | _Undecided
    if method == "tools/list":
        listed = [_tool(tool) for tool in items]
        if UNDECIDED in listed:
            return UNDECIDED
    else:
        # An item's `_meta` is the era's `MetaObject`: the models shape those.
        listed = shaped_offers(key, items, lambda meta: False)
        if listed is UNDECIDED:
            return UNDECIDED
    fields: dict[str, Any] = {
        "cacheScope": result["cacheScope"],
        "resultType": result["resultType"],
        "ttlMs": result["ttlMs"],
        key: listed,
    }
    if cursor is not None:
        fields["nextCursor"] = cursor
    shaped: dict[str, Any] = {}
    if not _put_meta(shaped, result):
        return UNDECIDED
    shaped.update(sorted(fields.items()))
    return shaped


def _call(result: Mapping[str, Any]) -> dict[str, Any] | _Undecided:
    """A complete call result of text blocks as the era's `CallToolResult` shapes it."""
    content, is_error = result.get("content"), result.get("isError")
    if (
        result.get("resultType") != "complete"
        or not isinstance(content, list)
        or not (is_error is None or isinstance(is_error, bool))
        or not isinstance(result.get("structuredContent", {}), dict)
    ):
        return UNDECIDED
    blocks: list[dict[str, Any]] = []
    for block in content:
        kept = _text_block(block)
        if kept is UNDECIDED:
            return UNDECIDED
        assert isinstance(kept, dict)
        if "_meta" in kept and not _plain_meta(kept["_meta"]):
            return UNDECIDED
        blocks.append(kept)  # `_meta`, then text, then type: the model's order
    shaped: dict[str, Any] = {}
    if not _put_meta(shaped, result):
        return UNDECIDED
    shaped["content"] = [
        {**({"_meta": b["_meta"]} if "_meta" in b else {}), "text": b["text"], "type": "text"}
        for b in blocks
    ]
    if is_error is not None:
        shaped["isError"] = is_error
    shaped["resultType"] = "complete"
    if result.get("structuredContent") is not None:
        shaped["structuredContent"] = result["structuredContent"]
    return shaped


def _listen(result: Mapping[str, Any]) -> dict[str, Any] | _Undecided:
    """A listen stream's last result (its `_meta` the subscription id alone)."""
    meta = result.get("_meta")
    if not isinstance(meta, dict) or meta.keys() != {SUBSCRIPTION_ID_META_KEY}:
        return UNDECIDED
    subscription = meta[SUBSCRIPTION_ID_META_KEY]
    if not (isinstance(subscription, str) or _is_int(subscription)):
        return UNDECIDED
    return {"_meta": dict(meta), "resultType": result["resultType"]}


def shaped_result(method: str, result: Mapping[str, Any]) -> dict[str, Any] | _Undecided:
    """`mcp_types.methods.serialize_server_result(method, "2026-07-28", result)` for a
    handler's result (its dump, `resultType` a core one) of the plain shapes;
    `UNDECIDED` for any other."""
    if not isinstance(result.get("resultType"), str):
        return UNDECIDED
    if method == "server/discover":
        return _discover(result)
    if method in _LISTED:
        return _listing(method, result)
    if method == "tools/call":
        return _call(result)
    if method == "subscriptions/listen":
        return _listen(result)
    return UNDECIDED
