"""The stdio front's plain JSON against the SDK's models (issue 36, decision 0061).

`_plain` reads, checks and shapes a handshake-era host's messages without the models, and
answers only the shapes it can prove the models treat alike; for any other it says
UNDECIDED and the models decide.  Each test feeds the same generated values to both and
asserts: wherever `_plain` decides, the models accept what it accepts and give the same
values, key order included (compared as the JSON bytes a host reads).
"""

from __future__ import annotations

from typing import Any

import mcp_types as types
import mcp_types.jsonrpc as jsonrpc
import pytest
from hypothesis import given
from hypothesis import strategies as st
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from pydantic import ValidationError
from wire_values import SETTINGS, as_read, numbers, objects, schemas, text_blocks
from wire_values import json_values as _json

from agentrt.proxy import _dispatch, _plain
from agentrt.proxy._handlers import INSTRUCTIONS, NAME, VERSION, _empty_list
from agentrt.proxy._host_messages import screen
from agentrt.proxy._plain import UNDECIDED
from agentrt.proxy._revision import cache_hints

_ids = st.integers(-(2**62), 2**62) | st.text(max_size=5) | st.none() | st.booleans() | numbers
_meta = _json | objects(
    {"progressToken": st.text(max_size=3) | st.integers() | st.booleans() | numbers | st.none(),
     "progress_token": st.integers(), "traceparent": st.text(max_size=5)}
)  # fmt: skip


# -- messages ---------------------------------------------------------------------------

_messages = objects(
    {
        "jsonrpc": st.just("2.0"),
        "id": _ids,
        "method": st.sampled_from(["ping", "tools/call"]) | _json,
        "params": st.none() | st.dictionaries(st.text(max_size=4), _json, max_size=3) | _json,
        "result": st.dictionaries(st.text(max_size=4), _json, max_size=3) | _json,
        "error": objects(
            {
                "code": st.integers(-40000, 0) | _json,
                "message": st.text() | _json,
                "data": _json,
            }
        )
        | _json,
    }
)


# And mostly well formed, so that `_plain` decides often (each shape and its neighbours).
_good_ids = st.integers(-(2**62), 2**62) | st.text(max_size=5)
_good_params = st.none() | st.dictionaries(st.text(max_size=4), _json, max_size=3)
_messages = (
    st.fixed_dictionaries({"jsonrpc": st.just("2.0"), "id": _good_ids,
                           "method": st.text(max_size=5)}, optional={"params": _good_params})
    | st.fixed_dictionaries({"jsonrpc": st.just("2.0"), "method": st.text(max_size=5)},
                            optional={"params": _good_params})
    | st.fixed_dictionaries({"jsonrpc": st.just("2.0"), "id": _good_ids,
                             "result": st.dictionaries(st.text(max_size=3), _json)})
    | st.fixed_dictionaries({"jsonrpc": st.just("2.0"), "id": _good_ids | st.none(),
                             "error": st.fixed_dictionaries(
                                 {"code": st.integers(-40000, 0), "message": st.text(max_size=4)},
                                 optional={"data": _json})})
    | _messages
)  # fmt: skip


@SETTINGS
@given(_messages)
def test_a_message_read_plainly_is_the_one_the_sdk_decodes(message: dict[str, Any]) -> None:
    raw = as_read(message).encode()
    if screen(raw) is not None:
        return  # refused before either reads it
    plain = _plain.message_of(raw)
    if plain is UNDECIDED:
        return
    model = jsonrpc.jsonrpc_message_adapter.validate_json(raw, by_name=False)
    assert _plain.message_of_model(model) == plain
    assert _plain.model_of(plain) == model  # as the SDK's server is handed it


@pytest.mark.parametrize(
    "line",
    [
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"}}',
        b'{"jsonrpc":"2.0","method":"notifications/initialized"}',
        b'{"jsonrpc":"2.0","id":"a","result":{}}',
        b'{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"no"}}',
    ],
)
def test_the_common_messages_are_read_plainly(line: bytes) -> None:
    assert screen(line) is None
    assert _plain.message_of(line) is not UNDECIDED


# -- params -------------------------------------------------------------------------------

_capabilities = _json | objects(
    {
        "roots": _json | objects({"listChanged": st.booleans() | _json}),
        "sampling": _json | objects({"context": st.just({}) | _json, "tools": st.just({})}),
        "elicitation": _json | objects({"form": st.just({}) | _json, "url": st.just({})}),
        "experimental": _json | st.dictionaries(st.text(max_size=3), st.just({})),
        "extensions": _json | st.dictionaries(st.text(max_size=3), st.just({"a": 1})),
        "tasks": _json,
    }
)
_client_info = _json | objects(
    {"name": st.text(max_size=4) | _json, "version": st.text(max_size=4) | _json,
     "title": st.text(max_size=4) | _json, "websiteUrl": st.text(max_size=4) | _json,
     "description": st.text(max_size=3) | st.none(), "icons": _json}
)  # fmt: skip
_good_capabilities = st.fixed_dictionaries(
    {},
    optional={
        "roots": st.fixed_dictionaries({}, optional={"listChanged": st.booleans()}),
        "sampling": st.fixed_dictionaries({}, optional={"context": st.just({})}),
        "elicitation": st.fixed_dictionaries({}, optional={"form": st.just({}),
                                                           "url": st.just({}) | st.none()}),
        "experimental": st.dictionaries(st.text(max_size=3), st.just({"a": 1})),
        "extensions": st.dictionaries(st.text(max_size=3), st.just({})),
        "other": _json,
    },
)  # fmt: skip
_good_initialize = st.fixed_dictionaries(
    {
        "protocolVersion": st.sampled_from([*HANDSHAKE_PROTOCOL_VERSIONS, "1999-01-01"]),
        "capabilities": _good_capabilities,
        "clientInfo": st.fixed_dictionaries(
            {"name": st.text(max_size=4), "version": st.text(max_size=4)},
            optional={"title": st.text(max_size=3) | st.none(), "extra": _json},
        ),
    },
    optional={"_meta": _meta},
)
_good_call = st.fixed_dictionaries(
    {"name": st.text(max_size=4)},
    optional={
        "arguments": st.none() | st.dictionaries(st.text(max_size=3), _json),
        "_meta": st.fixed_dictionaries(
            {}, optional={"progressToken": st.text(max_size=3) | st.integers(), "k": _json}
        ),
    },
)
_PARAMS = {
    "initialize": _good_initialize
    | objects(
        {
            "protocolVersion": st.sampled_from([*HANDSHAKE_PROTOCOL_VERSIONS, "1999-01-01"])
            | _json,
            "capabilities": _capabilities,
            "clientInfo": _client_info,
            "_meta": _meta,
        }
    ),
    "tools/call": _good_call
    | objects(
        {
            "name": st.text(max_size=4) | _json,
            "arguments": st.none() | st.dictionaries(st.text(max_size=3), _json) | _json,
            "_meta": _meta,
            "task": _json,
            "requestState": _json,
            "inputResponses": _json,
        }
    ),
    "tools/list": objects({"cursor": st.text(max_size=3) | _json, "_meta": _meta}),
    "prompts/list": objects({"cursor": st.text(max_size=3) | _json, "_meta": _meta}),
    "ping": objects({"_meta": _meta}),
}


@SETTINGS
@given(st.sampled_from(sorted(_PARAMS)).flatmap(
    lambda method: st.tuples(st.just(method), st.none() | _PARAMS[method])
))  # fmt: skip
def test_params_accepted_plainly_are_accepted_alike_by_the_models(
    case: tuple[str, dict[str, Any] | None],
) -> None:
    method, params = case
    checked = _plain.checked_params(method, params)
    if checked is UNDECIDED:
        return
    _dispatch._check(method, params)  # the wire model accepts them too
    if method == "initialize":
        assert params is not None
        _, version, _ = _dispatch.initialize_answer(params)
        assert version == _plain.agreed_version(params)
        assert checked is params
        return
    model = getattr(types, _dispatch._PARAMS_MODELS[method])
    typed = model.model_validate({} if params is None else params, by_name=False)
    if method == "tools/call":
        assert isinstance(checked, _plain.CallParams)
        assert (checked.name, checked.arguments) == (typed.name, typed.arguments)
        assert as_read(checked.meta) == as_read(typed.meta)


def test_a_call_with_a_progress_token_keeps_it_under_the_sdks_name() -> None:
    params = {"name": "t", "arguments": {"a": 1}, "_meta": {"x": 1, "progressToken": "p"}}
    checked = _plain.checked_params("tools/call", params)
    assert isinstance(checked, _plain.CallParams)
    assert checked.meta == {"progress_token": "p", "x": 1}


def test_what_only_the_models_may_refuse_is_left_to_them() -> None:
    for method, params in [
        ("tools/call", {"arguments": {}}),
        ("tools/call", {"name": 7}),
        ("tools/call", {"name": "t", "arguments": "text"}),
        ("tools/list", {"cursor": 3}),
        ("initialize", {"capabilities": {}}),
        ("initialize", None),
    ]:
        assert _plain.checked_params(method, params) is UNDECIDED
        with pytest.raises(ValidationError):
            _dispatch._check(method, params)


# -- results -----------------------------------------------------------------------------

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
                "title": st.text(max_size=2) | _json,
            }
        ),
        "_meta": st.none() | st.dictionaries(st.text(max_size=3), _json),
    }
)
_call_results = objects(
    {
        "content": st.lists(text_blocks, max_size=3) | _json,
        "isError": st.booleans() | st.none() | _json,
        "structuredContent": st.none() | st.dictionaries(st.text(max_size=3), _json) | _json,
        "_meta": st.none() | st.dictionaries(st.text(max_size=3), _json),
        "resultType": st.just("complete") | _json,
    }
)
_RESULTS = {
    "tools/list": objects(
        {
            "tools": st.lists(_tools, max_size=3) | _json,
            "ttlMs": st.just(0),
            "nextCursor": st.none() | st.text(max_size=2),
        }
    ),
    "tools/call": _call_results,
    "prompts/list": objects({"prompts": st.just([]) | _json, "cacheScope": st.just("private")}),
    "resources/list": objects({"resources": st.just([]) | _json}),
    "resources/templates/list": objects({"resourceTemplates": st.just([]) | _json}),
    "ping": objects({}),
}


@SETTINGS
@given(st.sampled_from(sorted(_RESULTS)).flatmap(
    lambda method: st.tuples(st.just(method), _RESULTS[method])
))  # fmt: skip
def test_results_shaped_plainly_are_shaped_alike_by_the_models(
    case: tuple[str, dict[str, Any]],
) -> None:
    method, result = case
    shaped = _plain.shaped_result(method, result)
    if shaped is UNDECIDED:
        return
    assert as_read(shaped) == as_read(_dispatch._shaped(method, result))


@SETTINGS
@given(_call_results)
def test_a_forwarded_result_read_plainly_is_the_models_dump(raw: dict[str, Any]) -> None:
    dumped = _plain.monolith_call_result(raw)
    if dumped is UNDECIDED:
        return
    model = types.CallToolResult.model_validate(raw)
    assert as_read(dumped) == as_read(
        model.model_dump(by_alias=True, mode="json", exclude_none=True)
    )


@SETTINGS
@given(
    st.lists(objects({"text": st.text(max_size=4), "_meta": st.dictionaries(
        st.text(max_size=2), _json)}).map(lambda block: {"type": "text", "text": "", **block}),
        max_size=2),
    st.booleans(),
    st.none() | st.dictionaries(st.text(max_size=3), _json),
    st.none() | st.dictionaries(st.text(max_size=3), _json),
)  # fmt: skip
def test_a_call_result_built_plainly_is_the_models_dump(
    content: list[dict[str, Any]],
    is_error: bool,
    structured: dict[str, Any] | None,
    meta: dict[str, Any] | None,
) -> None:
    blocks = [types.TextContent.model_validate(block) for block in content]
    model = types.CallToolResult(
        content=blocks, is_error=is_error, structured_content=structured, _meta=meta
    )
    expected = model.model_dump(by_alias=True, mode="json", exclude_none=True)
    # The blocks as the handlers hand them over: each the model's dump (`_text_block`).
    dumped = [block.model_dump(by_alias=True, mode="json", exclude_none=True) for block in blocks]
    assert [_plain._text_block(block) for block in content] == dumped
    assert as_read(_plain.call_result(dumped, is_error, structured, meta)) == as_read(expected)


@SETTINGS
@given(
    st.text(max_size=4),
    st.none() | st.text(max_size=3),
    st.none() | st.text(max_size=3),
    st.dictionaries(st.text(max_size=3), _json),
    st.none() | st.dictionaries(st.text(max_size=3), _json),
    st.booleans(),
    st.booleans(),
    st.none() | st.dictionaries(st.text(max_size=3), _json),
)
def test_a_tool_listed_plainly_is_the_models_dump(
    name: str,
    title: str | None,
    description: str | None,
    input_schema: dict[str, Any],
    output_schema: dict[str, Any] | None,
    read_only: bool,
    destructive: bool,
    meta: dict[str, Any] | None,
) -> None:
    model = types.Tool(
        name=name,
        title=title,
        description=description,
        input_schema=input_schema,
        output_schema=output_schema,
        annotations=types.ToolAnnotations(read_only_hint=read_only, destructive_hint=destructive),
        _meta=meta,
    )
    plain = _plain.listed_tool(
        name, title, description, input_schema, output_schema,
        read_only=read_only, destructive=destructive, meta=meta,
    )  # fmt: skip
    assert as_read(plain) == as_read(
        model.model_dump(by_alias=True, mode="json", exclude_none=True)
    )


def test_the_proxys_own_answers_are_the_models_dumps() -> None:
    from agentrt.proxy._status import _STATUS_DESCRIPTION, _STATUS_SCHEMA, GateStatus

    status = types.Tool(
        name="gate_status",
        description=_STATUS_DESCRIPTION,
        input_schema=dict(_STATUS_SCHEMA),
        annotations=types.ToolAnnotations(read_only_hint=True),
    )
    listed = GateStatus.listed(None)  # type: ignore[arg-type]
    assert as_read(listed) == as_read(
        status.model_dump(by_alias=True, mode="json", exclude_none=True)
    )
    for key, model in [
        ("prompts", types.ListPromptsResult(prompts=[], **cache_hints())),
        ("resources", types.ListResourcesResult(resources=[], **cache_hints())),
        (
            "resourceTemplates",
            types.ListResourceTemplatesResult(resource_templates=[], **cache_hints()),
        ),
    ]:
        dumped = model.model_dump(by_alias=True, mode="json", exclude_none=True)
        assert as_read(_empty_list(key)) == as_read(dumped)
    for version in HANDSHAKE_PROTOCOL_VERSIONS:
        expected = _dispatch._shaped("initialize", _dispatch.initialize_result(version))
        plain = _plain.initialize_result(version, INSTRUCTIONS, NAME, VERSION)
        assert as_read(plain) == as_read(expected)


def test_the_error_codes_written_in_agentrt_are_the_sdks() -> None:
    assert (_plain.PARSE_ERROR, _plain.INVALID_REQUEST, _plain.INVALID_PARAMS) == (
        types.PARSE_ERROR, types.INVALID_REQUEST, types.INVALID_PARAMS,
    )  # fmt: skip
    assert (_plain.INTERNAL_ERROR, _plain.CONNECTION_CLOSED) == (
        types.INTERNAL_ERROR, types.CONNECTION_CLOSED,
    )  # fmt: skip
