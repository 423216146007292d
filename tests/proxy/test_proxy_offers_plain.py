"""A server's prompts, resources and templates checked without the SDK's models where the
check can be sure (issue 36: `mcp_types` cost a proxy ~0.2 s of its start whenever its
server offered any).

`plainly_listable` says yes only for shapes the SDK's `Prompt`, `Resource` and
`ResourceTemplate` certainly accept; for every other shape the model decides, as before.
The differential test feeds the same generated items to both: wherever the plain check
says yes, the model accepts.
"""

from __future__ import annotations

from typing import Any

import mcp_types as types
import mcp_types.methods as wire
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError
from wire_values import SETTINGS, as_read, json_values, objects

from agentrt.mcp._offers import Offers
from agentrt.proxy import _dispatch, _modern_plain, _plain
from agentrt.proxy._offers import Offered
from agentrt.proxy._plain import UNDECIDED, listed_plainly, plainly_listable
from agentrt.proxy._upstreams import take_offers

_ERA = "2026-07-28"

_MODELS: dict[str, Any] = {
    "prompts": types.Prompt,
    "resources": types.Resource,
    "resourceTemplates": types.ResourceTemplate,
}

_text = st.text(max_size=4)
# Mostly the right kind, now and then any JSON value: each member's plain kinds, and the
# ones the plain check must leave to the model.
_maybe_text = _text | st.none() | json_values
_mostly_text = _text | _text | json_values


def _members(required: dict[str, Any], optional: dict[str, Any]) -> Any:
    """Items whose required members are mostly of their kind, with any subset of the
    optional ones and now and then a stray member."""
    return st.fixed_dictionaries(required, optional={**optional, "stray": json_values}) | objects(
        {**required, **optional}
    )


_argument = _members(
    {"name": _mostly_text},
    {"title": _maybe_text, "description": _maybe_text,
     "required": st.booleans() | st.none() | json_values},
)  # fmt: skip
_common = {
    "title": _maybe_text,
    "description": _maybe_text,
    "_meta": st.none() | st.dictionaries(_text, json_values, max_size=2) | json_values,
    "meta": st.none() | json_values,
    "icons": st.none() | st.just([{"src": "https://example.com/a.png"}]) | json_values,
    "annotations": st.none() | st.just({"audience": ["user"]}) | json_values,
    "mimeType": _maybe_text,
}
_items = {
    "prompts": _members(
        {"name": _mostly_text},
        {**_common, "arguments": st.none() | st.lists(_argument, max_size=2) | json_values},
    ),
    "resources": _members(
        {"name": _mostly_text, "uri": _mostly_text},
        {
            **_common,
            "mime_type": _maybe_text,
            "size": st.none()
            | st.integers()
            | st.sampled_from([2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 5.0, True])
            | json_values,
        },
    ),
    "resourceTemplates": _members(
        {"name": _mostly_text, "uriTemplate": _mostly_text},
        {**_common, "uri_template": _maybe_text},
    ),
}


# Items the plain check lists: every member of its plain kind, often all of them.
_good_argument = st.fixed_dictionaries(
    {"name": _text},
    optional={"title": _text, "description": _text, "required": st.booleans()},
)
_good_common = {
    "title": _text,
    "description": _text,
    "_meta": st.dictionaries(_text, json_values, max_size=2),
}
_good_items = {
    "prompts": st.fixed_dictionaries(
        {"name": _text},
        optional={**_good_common, "arguments": st.lists(_good_argument, max_size=2)},
    ),
    "resources": st.fixed_dictionaries(
        {"name": _text, "uri": _text},
        optional={**_good_common, "mimeType": _text, "size": st.integers(-(2**63), 2**63 - 1)},
    ),
    "resourceTemplates": st.fixed_dictionaries(
        {"name": _text, "uriTemplate": _text}, optional={**_good_common, "mimeType": _text}
    ),
}


def _model_accepts(noun: str, item: Any) -> bool:
    try:
        _MODELS[noun].model_validate(item)
    except ValidationError:
        return False
    return True


@pytest.mark.parametrize("noun", list(_MODELS))
@SETTINGS
@given(data=st.data())
def test_what_the_plain_check_lists_the_sdks_model_accepts(noun: str, data: st.DataObject) -> None:
    item = data.draw(_items[noun] | json_values)
    if plainly_listable(noun, item):
        assert _model_accepts(noun, item), item


@pytest.mark.parametrize(
    ("noun", "item"),
    [
        ("prompts", {"name": "greet", "description": "Say hello", "arguments": [
            {"name": "who", "description": "whom", "required": True}]}),
        ("prompts", {"name": "bare"}),
        ("resources", {"name": "note", "uri": "file:///note.txt", "mimeType": "text/plain",
                      "size": 12, "_meta": {"k": 1}}),
        ("resourceTemplates", {"name": "notes", "uriTemplate": "file:///{name}",
                               "title": None}),
    ],
)  # fmt: skip
def test_ordinary_offers_are_decided_without_the_models(noun: str, item: Any) -> None:
    # The plain check must say yes for what servers ordinarily offer, or the models load.
    assert plainly_listable(noun, item)
    assert _model_accepts(noun, item)


@pytest.mark.parametrize(
    ("noun", "item"),
    [
        # Members of models of their own, and the Python names the models also take.
        ("resources", {"name": "r", "uri": "u", "annotations": {"priority": 0.5}}),
        ("resources", {"name": "r", "uri": "u", "icons": [{"src": "https://e.com/i.png"}]}),
        ("resourceTemplates", {"name": "t", "uri_template": "u/{x}"}),
        # Kinds the model may coerce or refuse: it decides.
        ("resources", {"name": "r", "uri": "u", "size": 5.0}),
        ("resources", {"name": "r", "uri": "u", "size": True}),
        ("resources", {"name": "r", "uri": "u", "size": 2**63}),
        ("prompts", {"name": "p", "arguments": [{"name": "a", "required": "yes"}]}),
        ("prompts", {"name": 7}),
    ],
)  # fmt: skip
def test_what_the_plain_check_cannot_be_sure_of_goes_to_the_model(noun: str, item: Any) -> None:
    assert not plainly_listable(noun, item)


def test_a_refused_offer_is_refused_alone_with_the_models_reason_and_the_rest_listed() -> None:
    offers = Offers(
        prompts=[{"name": "good"}, {"name": "bad", "arguments": [{"name": 3}]}],
        resources=[{"name": "note", "uri": "file:///n", "size": "twelve"}],
        resource_templates=[{"name": "t", "uriTemplate": "file:///{x}"}],
        lines=[],
    )
    offered = Offered()
    lines = take_offers(offered, "up", offers)
    assert list(offered.prompts) == ["good"]
    assert offered.resources == []
    assert [template for template, _ in offered.templates] == [
        {"name": "t", "uriTemplate": "file:///{x}"}
    ]
    assert len(lines) == 2
    assert lines[0].startswith("up: refused prompt bad: the host could not be sent it (")
    assert lines[1].startswith("up: refused resource note: the host could not be sent it (")


# -- listed to the host without the models: the handler's dump, each era's shape -----------

_LISTINGS = {
    "prompts": "prompts/list",
    "resources": "resources/list",
    "resourceTemplates": "resources/templates/list",
}


@pytest.mark.parametrize("noun", list(_MODELS))
@SETTINGS
@given(data=st.data())
def test_what_is_listed_plainly_is_what_the_models_list(noun: str, data: st.DataObject) -> None:
    # The handler's plain listing equals the SDK model's dump, item by item; and where
    # either era's front shapes a listing plainly (the handler's dump, or any other items),
    # the bytes are those the era's wire types give.
    items = data.draw(st.lists(_good_items[noun] | _items[noun], max_size=3))
    listed = listed_plainly(noun, items)
    if listed is not None:
        assert as_read(listed) == as_read(
            [_MODELS[noun].model_validate(item).model_dump(by_alias=True, mode="json",
                                                           exclude_none=True)
             for item in items]
        )  # fmt: skip
    method, key = _LISTINGS[noun], noun
    for shown in (listed, items):
        if shown is None:
            continue
        result = {"ttlMs": 0, "cacheScope": "private", key: shown, "resultType": "complete"}
        handshake = _plain.shaped_result(method, result)
        if handshake is not UNDECIDED:
            assert as_read(handshake) == as_read(_dispatch._shaped(method, result))
        modern = _modern_plain.shaped_result(method, result)
        if modern is not UNDECIDED:
            assert as_read(modern) == as_read(wire.serialize_server_result(method, _ERA, result))
        if shown is listed:
            # What the handler lists plainly, the handshake era shapes plainly too, and the
            # 2026 era unless an item has a `_meta` (the era's own model).
            assert handshake is not UNDECIDED
            assert (modern is UNDECIDED) == any("_meta" in item for item in shown)
