"""A 2026-07-28 host's requests checked and results shaped in plain JSON, against the SDK's
models (issue 36, decision 0062).

`_modern_plain` decides only the shapes it can prove the era's wire types
(`mcp_types.methods`) and the handlers' params models treat alike, and says UNDECIDED for
any other (the models then decide, as before).  Each test feeds the same generated values
to both and asserts: wherever `_modern_plain` decides, the models accept what it accepts
and give the same values, key order included (compared as the JSON bytes a host reads).
"""

from __future__ import annotations

from typing import Any, get_args

import mcp_types as types
import mcp_types.methods as wire
import pytest
from hypothesis import given
from hypothesis import strategies as st
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError
from wire_values import SETTINGS, as_read, numbers, objects, schemas, text_blocks
from wire_values import json_values as _json

from agentrt.proxy import _listen, _modern
from agentrt.proxy import _modern_plain as plain
from agentrt.proxy._apps import renders_apps
from agentrt.proxy._handlers import INSTRUCTIONS, _empty_list
from agentrt.proxy._plain import UNDECIDED, CallParams, field

_ERA = "2026-07-28"


# -- the envelope -------------------------------------------------------------------------

_good_capabilities = st.fixed_dictionaries(
    {},
    optional={
        "roots": st.fixed_dictionaries({}, optional={"listChanged": st.booleans()}),
        "sampling": st.fixed_dictionaries({}, optional={"context": st.just({}),
                                                        "tools": st.just({}) | st.none()}),
        "elicitation": st.fixed_dictionaries({}, optional={"form": st.just({}),
                                                           "url": st.just({}) | st.none()}),
        "experimental": st.dictionaries(st.text(max_size=3), st.just({"a": 1})),
        "extensions": st.dictionaries(st.text(max_size=3), st.just({}))
        | st.just({"io.modelcontextprotocol/ui": {"mimeTypes": ["text/html;profile=mcp-app"]}}),
        "other": _json,
    },
)  # fmt: skip
_capabilities = (
    _good_capabilities
    | _json
    | objects(
        {
            "roots": _json | objects({"listChanged": st.booleans() | _json}),
            "sampling": _json | objects({"context": st.just({}) | _json, "tools": _json}),
            "elicitation": _json | objects({"form": st.just({}) | _json, "url": _json}),
            "experimental": _json | st.dictionaries(st.text(max_size=3), _json),
            "extensions": _json | st.dictionaries(st.text(max_size=3), _json),
            "tasks": _json,
        }
    )
)
_good_info = st.fixed_dictionaries(
    {"name": st.text(max_size=4), "version": st.text(max_size=4)},
    optional={"title": st.text(max_size=3) | st.none(), "extra": _json,
              "websiteUrl": st.text(max_size=3)},
)  # fmt: skip
_info = (
    _good_info
    | _json
    | objects(
        {"name": st.text(max_size=4) | _json, "version": st.text(max_size=4) | _json,
         "title": st.text(max_size=4) | _json, "websiteUrl": st.text(max_size=4) | _json,
         "description": st.text(max_size=3) | st.none(), "icons": _json}
    )
)  # fmt: skip
_good_envelope = st.fixed_dictionaries(
    {
        plain.PROTOCOL_VERSION_META_KEY: st.just(_ERA),
        plain.CLIENT_CAPABILITIES_META_KEY: _good_capabilities,
    },
    optional={
        plain.CLIENT_INFO_META_KEY: _good_info | st.none(),
        plain.LOG_LEVEL_META_KEY: st.sampled_from(plain.LOG_LEVELS) | st.none(),
        "progressToken": st.text(max_size=3) | st.integers() | st.none(),
        "traceparent": st.text(max_size=5),
    },
)
_envelope = _good_envelope | objects(
    {
        plain.PROTOCOL_VERSION_META_KEY: st.just(_ERA),
        plain.CLIENT_CAPABILITIES_META_KEY: _capabilities,
        plain.CLIENT_INFO_META_KEY: _info,
        plain.LOG_LEVEL_META_KEY: st.sampled_from(plain.LOG_LEVELS) | _json,
        "progressToken": st.text(max_size=3) | st.integers() | st.booleans() | numbers | _json,
        "progress_token": st.integers(),
        "io_modelcontextprotocol_log_level": st.just("debug"),
    }
).map(
    # What reaches the check passed the ladder (`_modern._classify`): both keys, a version.
    lambda meta: {
        plain.PROTOCOL_VERSION_META_KEY: _ERA,
        plain.CLIENT_CAPABILITIES_META_KEY: {},
        **meta,
    }
)


def _with_envelope(
    body: st.SearchStrategy[dict[str, Any]],
) -> st.SearchStrategy[dict[str, Any]]:
    return st.tuples(body, _envelope).map(lambda pair: {**pair[0], "_meta": pair[1]})


_filters = st.fixed_dictionaries(
    {},
    optional={
        "toolsListChanged": st.booleans() | st.none(),
        "promptsListChanged": st.booleans(),
        "resourcesListChanged": st.booleans(),
        "resourceSubscriptions": st.lists(st.text(max_size=3), max_size=3) | st.none(),
    },
) | objects(
    {
        "toolsListChanged": st.booleans() | _json,
        "resourceSubscriptions": st.lists(st.text(max_size=3) | _json, max_size=2) | _json,
        "tools_list_changed": st.just(True),
    }
)
_PARAMS = {
    "server/discover": _with_envelope(objects({})),
    "tools/list": _with_envelope(objects({"cursor": st.text(max_size=3) | _json})),
    "prompts/list": _with_envelope(objects({"cursor": st.text(max_size=3) | st.none()})),
    "resources/list": _with_envelope(objects({})),
    "resources/templates/list": _with_envelope(objects({"cursor": st.text(max_size=2)})),
    "tools/call": _with_envelope(
        st.fixed_dictionaries(
            {"name": st.text(max_size=4)},
            optional={"arguments": st.none() | st.dictionaries(st.text(max_size=3), _json)},
        )
        | objects(
            {
                "name": st.text(max_size=4) | _json,
                "arguments": st.none() | st.dictionaries(st.text(max_size=3), _json) | _json,
                "requestState": _json,
                "inputResponses": _json,
            }
        )
    ),
    "subscriptions/listen": _with_envelope(
        st.fixed_dictionaries({"notifications": _filters}) | objects({"notifications": _json})
    ),
}


@SETTINGS
@given(st.sampled_from(sorted(_PARAMS)).flatmap(
    lambda method: st.tuples(st.just(method), _PARAMS[method])
))  # fmt: skip
def test_requests_accepted_plainly_are_accepted_alike_by_the_models(
    case: tuple[str, dict[str, Any]],
) -> None:
    method, params = case
    checked = plain.checked_request(method, params)
    if checked is UNDECIDED:
        return
    # The era's wire type accepts the request, and the handler's params model its params.
    wire.validate_client_request(method, _ERA, params)
    typed = getattr(types, _modern.PARAMS_MODELS[method]).model_validate(params, by_name=False)
    if method == "tools/call":
        assert isinstance(checked, CallParams)
        assert (checked.name, checked.arguments) == (typed.name, typed.arguments)
        assert as_read(checked.meta) == as_read(typed.meta)
    else:
        assert checked is params
    if method == "subscriptions/listen":
        # What the stream honours, read from either.
        assert as_read(plain.honored_filter(_listen._requested(checked))) == as_read(
            plain.honored_filter(_listen._requested(typed))
        )
        model_honored = types.SubscriptionFilter(
            tools_list_changed=True if typed.notifications.tools_list_changed else None,
            prompts_list_changed=True if typed.notifications.prompts_list_changed else None,
            resources_list_changed=True if typed.notifications.resources_list_changed else None,
            resource_subscriptions=list(typed.notifications.resource_subscriptions)
            if typed.notifications.resource_subscriptions
            else None,
        )  # the SDK's `_honored_subset`
        assert as_read(plain.honored_filter(params["notifications"])) == as_read(
            model_honored.model_dump(by_alias=True, mode="json", exclude_none=True)
        )


@SETTINGS
@given(_envelope)
def test_an_envelopes_identity_kept_plainly_reads_as_the_models(meta: dict[str, Any]) -> None:
    route = _modern._classify({"_meta": meta})
    assert isinstance(route, _modern.Envelope)
    info = plain.client_info(route.client_info)
    capabilities = plain.client_capabilities(route.client_capabilities)
    if info is UNDECIDED or capabilities is UNDECIDED:
        return
    typed_info = _modern._typed("Implementation", route.client_info)
    typed_capabilities = _modern._typed("ClientCapabilities", route.client_capabilities)
    assert typed_capabilities is not None
    assert (info is None) == (typed_info is None)
    # What the proxy reads of them (`_apps`, `_client_requests`, `_host_approval`).
    assert renders_apps(capabilities) == renders_apps(typed_capabilities)
    for kind in ("elicitation", "sampling", "roots"):
        assert (field(capabilities, kind) is None) == (field(typed_capabilities, kind) is None)
    elicitation = field(capabilities, "elicitation")
    typed_elicitation = field(typed_capabilities, "elicitation")
    for mode in ("form", "url"):
        assert (field(elicitation, mode) is None) == (field(typed_elicitation, mode) is None)
    if info is not None:
        assert field(info, "name") == typed_info.name


def test_a_session_of_a_plain_envelope_holds_what_the_host_sent() -> None:
    info = {"name": "claude-code", "version": "2.1"}
    capabilities = {"roots": {}, "elicitation": {"form": {}}}
    route = _modern.Envelope(_ERA, info, capabilities)
    session = _modern.ModernSession(route, {}, None, _no_notify)
    assert session.client_capabilities is capabilities
    assert session.client_params == {
        "protocolVersion": _ERA, "capabilities": capabilities, "clientInfo": info,
    }  # fmt: skip
    # A shape only the models may judge is read by them, as before.
    odd = _modern.ModernSession(
        _modern.Envelope(_ERA, {**info, "icons": [{"src": "x"}]}, capabilities), {}, None,
        _no_notify,
    )  # fmt: skip
    assert isinstance(odd.client_params, types.InitializeRequestParams)
    assert isinstance(odd.client_capabilities, types.ClientCapabilities)


async def _no_notify(method: str, params: Any) -> None:
    raise AssertionError("nothing is sent")


def test_what_only_the_models_may_refuse_is_left_to_them() -> None:
    envelope = {plain.PROTOCOL_VERSION_META_KEY: _ERA, plain.CLIENT_CAPABILITIES_META_KEY: {}}
    for method, params in [
        ("tools/call", {"_meta": envelope}),
        ("tools/call", {"name": 7, "_meta": envelope}),
        ("tools/call", {"name": "t", "arguments": "text", "_meta": envelope}),
        ("tools/list", {"cursor": 3, "_meta": envelope}),
        ("tools/list", {"_meta": {**envelope, plain.LOG_LEVEL_META_KEY: "loud"}}),
        ("tools/list", {"_meta": {**envelope, plain.CLIENT_CAPABILITIES_META_KEY: []}}),
        ("tools/list", {"_meta": {**envelope, plain.CLIENT_INFO_META_KEY: {"name": "x"}}}),
        ("subscriptions/listen", {"_meta": envelope}),
        ("subscriptions/listen", {"notifications": {"toolsListChanged": 3}, "_meta": envelope}),
    ]:
        assert plain.checked_request(method, params) is UNDECIDED
        with pytest.raises(ValidationError):
            wire.validate_client_request(method, _ERA, params)


def test_the_methods_the_era_lacks_are_the_sdks() -> None:
    surface = {method for method, version in wire.CLIENT_REQUESTS if version == _ERA}
    assert _modern.MODERN_METHODS - surface == plain.NOT_OF_THE_ERA
    assert set(_modern.PARAMS_MODELS) == set(_modern.MODERN_METHODS)


# -- results -------------------------------------------------------------------------------

_metas = (
    st.none()
    | st.dictionaries(st.text(max_size=3), _json)
    | objects({plain.SERVER_INFO_META_KEY: _json, "k": _json})
)
_tools = objects(
    {
        "name": st.text(max_size=4) | _json,
        "title": st.none() | st.text(max_size=3) | _json,
        "description": st.none() | st.text(max_size=3),
        "inputSchema": schemas,
        "outputSchema": st.none() | schemas,
        "annotations": _json
        | objects(
            {
                "readOnlyHint": st.booleans() | _json,
                "destructiveHint": st.booleans() | st.none(),
                "idempotentHint": st.booleans(),
                "title": st.text(max_size=2) | _json,
            }
        ),
        "_meta": _metas,
        "icons": _json,
    }
)
_hints = {
    "ttlMs": st.just(0) | st.integers(-2, 10**6) | _json,
    "cacheScope": st.sampled_from(["private", "public"]) | _json,
    "resultType": st.just("complete") | _json,
    "_meta": _metas,
}
_RESULTS = {
    "tools/list": objects(
        {**_hints, "tools": st.lists(_tools, max_size=3) | _json,
         "nextCursor": st.none() | st.text(max_size=2) | _json}
    ),
    "tools/call": objects(
        {
            "content": st.lists(text_blocks, max_size=3) | _json,
            "isError": st.booleans() | st.none() | _json,
            "structuredContent": st.none() | st.dictionaries(st.text(max_size=3), _json) | _json,
            "_meta": _metas,
            "resultType": st.just("complete") | st.just("input_required") | _json,
        }
    ),
    "prompts/list": objects({**_hints, "prompts": st.just([]) | _json}),
    "resources/list": objects({**_hints, "resources": st.just([]) | _json}),
    "resources/templates/list": objects({**_hints, "resourceTemplates": st.just([]) | _json}),
    "server/discover": objects(
        {
            **_hints,
            "supportedVersions": st.lists(st.text(max_size=3), max_size=2) | _json,
            "instructions": st.none() | st.text(max_size=3) | _json,
            "capabilities": _json
            | objects(
                {
                    "tools": objects({"listChanged": st.booleans() | _json}) | _json,
                    "resources": objects(
                        {"subscribe": st.booleans() | st.none(), "listChanged": st.booleans()}
                    ),
                    "logging": st.just({}) | _json,
                    "extensions": st.dictionaries(st.text(max_size=2), st.just({})) | _json,
                }
            ),
        }
    ),
    "subscriptions/listen": objects(
        {
            "_meta": objects({plain.SUBSCRIPTION_ID_META_KEY: st.integers() | st.text(max_size=2)
                               | _json, "k": _json}),
            "resultType": st.just("complete") | _json,
        }
    ),
}  # fmt: skip


# And mostly well formed, so that `_modern_plain` decides often (each shape and its
# neighbours).
_good_hints = {
    "ttlMs": st.integers(0, 10**6),
    "cacheScope": st.sampled_from(["private", "public"]),
    "resultType": st.just("complete"),
}
_good_schemas = st.fixed_dictionaries(
    {"type": st.just("object")},
    optional={"properties": st.dictionaries(st.text(max_size=3), st.just({"type": "string"})),
              "$schema": st.text(max_size=3), "additionalProperties": st.none() | st.booleans(),
              "required": st.lists(st.text(max_size=2), max_size=2)},
)  # fmt: skip
_good_tools = st.fixed_dictionaries(
    {"name": st.text(max_size=4), "inputSchema": _good_schemas},
    optional={
        "title": st.none() | st.text(max_size=3),
        "description": st.text(max_size=3),
        "outputSchema": _good_schemas | st.dictionaries(st.text(max_size=3), _json),
        "annotations": st.fixed_dictionaries({}, optional={
            "readOnlyHint": st.booleans(), "destructiveHint": st.booleans() | st.none(),
            "openWorldHint": st.booleans(), "title": st.text(max_size=2)}),
        "_meta": st.dictionaries(st.text(max_size=3), _json),
    },
)  # fmt: skip
_good_blocks = st.fixed_dictionaries(
    {"type": st.just("text"), "text": st.text(max_size=4)},
    optional={"_meta": st.dictionaries(st.text(max_size=3), _json)},
)
_good_meta = st.dictionaries(st.text(max_size=3), _json)
# fmt: off
_GOOD_RESULTS = {
    "tools/list": st.fixed_dictionaries(
        {**_good_hints, "tools": st.lists(_good_tools, max_size=3)},
        optional={"nextCursor": st.none() | st.text(max_size=2), "_meta": _good_meta},
    ),
    "tools/call": st.fixed_dictionaries(
        {"content": st.lists(_good_blocks, max_size=3), "resultType": st.just("complete")},
        optional={"isError": st.booleans(), "_meta": _good_meta,
                  "structuredContent": st.dictionaries(st.text(max_size=3), _json)},
    ),
    "prompts/list": st.fixed_dictionaries({**_good_hints, "prompts": st.just([])},
                                          optional={"_meta": _good_meta}),
    "resources/list": st.fixed_dictionaries({**_good_hints, "resources": st.just([])},
                                            optional={"nextCursor": st.text(max_size=2)}),
    "resources/templates/list": st.fixed_dictionaries(
        {**_good_hints, "resourceTemplates": st.just([])}),
    "server/discover": st.fixed_dictionaries(
        {**_good_hints, "supportedVersions": st.lists(st.text(max_size=3), max_size=2),
         "capabilities": st.fixed_dictionaries({}, optional={
             "tools": st.fixed_dictionaries({}, optional={"listChanged": st.booleans()}),
             "resources": st.fixed_dictionaries({}, optional={"subscribe": st.booleans(),
                                                              "listChanged": st.none()}),
             "logging": st.just({}), "completions": st.just({"x": 1}),
             "experimental": st.dictionaries(st.text(max_size=2), st.just({}))})},
        optional={"instructions": st.text(max_size=3), "_meta": _good_meta},
    ),
    "subscriptions/listen": st.fixed_dictionaries(
        {"_meta": st.fixed_dictionaries(
            {plain.SUBSCRIPTION_ID_META_KEY: st.integers() | st.text(max_size=2)}),
         "resultType": st.just("complete")}),
}
# fmt: on
_RESULTS = {method: _GOOD_RESULTS[method] | strategy for method, strategy in _RESULTS.items()}


@SETTINGS
@given(st.sampled_from(sorted(_RESULTS)).flatmap(
    lambda method: st.tuples(st.just(method), _RESULTS[method])
))  # fmt: skip
def test_results_shaped_plainly_are_shaped_alike_by_the_models(
    case: tuple[str, dict[str, Any]],
) -> None:
    method, result = case
    shaped = plain.shaped_result(method, result)
    if shaped is UNDECIDED:
        return
    assert as_read(shaped) == as_read(wire.serialize_server_result(method, _ERA, result))


def _surface(method: str, result: dict[str, Any]) -> dict[str, Any]:
    shaped = plain.shaped_result(method, result)
    assert shaped is not UNDECIDED, (method, result)
    assert isinstance(shaped, dict)
    return shaped


def test_the_proxys_own_answers_are_shaped_plainly_and_as_the_models_shape_them() -> None:
    discovered = types.DiscoverResult(
        supported_versions=list(MODERN_PROTOCOL_VERSIONS),
        capabilities=types.ServerCapabilities.model_validate(
            {"prompts": {"listChanged": True},
             "resources": {"subscribe": True, "listChanged": True},
             "tools": {"listChanged": True}, "logging": {}, "completions": {}}
        ),
        instructions=INSTRUCTIONS,
    )  # fmt: skip
    dumped = discovered.model_dump(by_alias=True, mode="json", exclude_none=True)
    assert as_read(plain.discover_result(INSTRUCTIONS)) == as_read(dumped)
    expected = wire.serialize_server_result("server/discover", _ERA, dumped)
    assert as_read(_surface("server/discover", dumped)) == as_read(expected)
    for method, key in [
        ("prompts/list", "prompts"),
        ("resources/list", "resources"),
        ("resources/templates/list", "resourceTemplates"),
    ]:
        listing = _empty_list(key)
        expected = wire.serialize_server_result(method, _ERA, listing)
        assert as_read(_surface(method, listing)) == as_read(expected)
    result = types.SubscriptionsListenResult(_meta={plain.SUBSCRIPTION_ID_META_KEY: 7})
    listened = {"_meta": {plain.SUBSCRIPTION_ID_META_KEY: 7}, "resultType": "complete"}
    assert as_read(listened) == as_read(
        result.model_dump(by_alias=True, mode="json", exclude_none=True)
    )
    expected = wire.serialize_server_result("subscriptions/listen", _ERA, listened)
    assert as_read(_surface("subscriptions/listen", listened)) == as_read(expected)


def test_a_listen_streams_frames_are_the_models_dumps() -> None:
    meta = {plain.SUBSCRIPTION_ID_META_KEY: "s"}
    honored = {"toolsListChanged": True, "resourceSubscriptions": ["file:///a"]}
    acknowledged = types.SubscriptionsAcknowledgedNotificationParams(
        notifications=types.SubscriptionFilter.model_validate(honored), _meta=meta
    )
    assert as_read({"_meta": meta, "notifications": honored}) == as_read(
        acknowledged.model_dump(by_alias=True, mode="json", exclude_none=True)
    )
    for event, model in [
        (_listen._Event("tools"), types.ToolListChangedNotification(
            params=types.NotificationParams(_meta=meta))),
        (_listen._Event("prompts"), types.PromptListChangedNotification(
            params=types.NotificationParams(_meta=meta))),
        (_listen._Event("resources"), types.ResourceListChangedNotification(
            params=types.NotificationParams(_meta=meta))),
        (_listen._Event("updated", "file:///a"), types.ResourceUpdatedNotification(
            params=types.ResourceUpdatedNotificationParams(uri="file:///a", _meta=meta))),
    ]:  # fmt: skip
        method, params = _listen._frame(event, meta)
        assert method == model.method
        assert as_read(params) == as_read(
            model.params.model_dump(by_alias=True, mode="json", exclude_none=True)
        )


@pytest.mark.anyio
async def test_a_frame_reaches_the_sdks_session_as_its_model() -> None:
    sent: list[tuple[Any, Any]] = []

    class SDKSession:  # takes models only, as the SDK's `ServerSession` does
        async def send_notification(self, notification: Any, related_request_id: Any) -> None:
            sent.append((notification, related_request_id))

    meta = {plain.SUBSCRIPTION_ID_META_KEY: 3}
    await _listen._send(SDKSession(), (_listen._ACKNOWLEDGED, {
        "_meta": meta, "notifications": {"promptsListChanged": True}}), 3)  # fmt: skip
    await _listen._send(SDKSession(), _listen._frame(_listen._Event("updated", "u"), meta), 3)
    acknowledged, updated = sent
    assert isinstance(acknowledged[0], types.SubscriptionsAcknowledgedNotification)
    assert acknowledged[0].params.notifications.prompts_list_changed is True
    assert isinstance(updated[0], types.ResourceUpdatedNotification)
    assert (updated[0].params.uri, updated[1]) == ("u", 3)


def test_the_names_written_in_agentrt_are_the_sdks() -> None:
    assert (
        plain.PROTOCOL_VERSION_META_KEY, plain.CLIENT_CAPABILITIES_META_KEY,
        plain.CLIENT_INFO_META_KEY, plain.LOG_LEVEL_META_KEY, plain.SERVER_INFO_META_KEY,
    ) == (
        types.PROTOCOL_VERSION_META_KEY, types.CLIENT_CAPABILITIES_META_KEY,
        types.CLIENT_INFO_META_KEY, types.LOG_LEVEL_META_KEY, types.SERVER_INFO_META_KEY,
    )  # fmt: skip
    from mcp.shared.subscriptions import SUBSCRIPTION_ID_META_KEY

    assert plain.SUBSCRIPTION_ID_META_KEY == SUBSCRIPTION_ID_META_KEY
    assert tuple(MODERN_PROTOCOL_VERSIONS) == plain.MODERN_PROTOCOL_VERSIONS
    assert (plain.METHOD_NOT_FOUND, plain.UNSUPPORTED_PROTOCOL_VERSION) == (
        types.METHOD_NOT_FOUND, types.UNSUPPORTED_PROTOCOL_VERSION,
    )  # fmt: skip
    assert get_args(types.LoggingLevel) == plain.LOG_LEVELS
    assert types.CORE_RESULT_TYPES == _modern._CORE_RESULT_TYPES
