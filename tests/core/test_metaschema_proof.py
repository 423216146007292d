"""The fast metaschema proof agrees with jsonschema's `check_schema` on 2020-12 schemas.

`agentrt.metaschema.proves_valid` lets `compile_schema` skip jsonschema's
walk of the 2020-12 metaschema.  A wrong "valid" would let a malformed
schema register, so every generated schema here, valid or not, is judged by
both and the verdicts must be the same.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema_specifications import REGISTRY

from agentrt import metaschema
from agentrt.canonical import parse_json
from agentrt.errors import SchemaError
from agentrt.metaschema import METASCHEMA_KEYWORDS, proves_valid
from agentrt.schema import compile_schema

CHECKER = jsonschema.Draft202012Validator


def _full_check_passes(schema: Any) -> bool:
    try:
        CHECKER.check_schema(schema)
    except jsonschema.exceptions.SchemaError:
        return False
    return True


# Values chosen to sit on the metaschema's edges: negative and fractional
# counts, Decimal (what parse_json yields), type names and near-misses,
# regular expressions and broken ones, URIs, anchors and fragments.
_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-3, max_value=5),
    st.sampled_from([0.0, 1.0, 2.5, -1.5, Decimal("1.0"), Decimal("3"), Decimal("0.5")]),
    st.sampled_from(
        [
            "string", "integer", "object", "array", "number", "boolean", "null", "strin",
            "", "a", "^a+$", "[", "(?P<x>a)", "#", "#foo", "#/$defs/x", "foo#bar",
            "http://example.com/s", "https://json-schema.org/draft/2020-12/schema",
            "urn:x", "a b", "_anchor", "1anchor", "x-y.z", "\\",
        ]
    ),
)  # fmt: skip
_KEYWORDS = st.sampled_from([*sorted(METASCHEMA_KEYWORDS), "x-extension", "nullable", "id"])


def _extend(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.lists(children, max_size=3),
        st.dictionaries(_KEYWORDS, children, max_size=4),
        st.dictionaries(st.sampled_from(["a", "b", "[", "^x"]), children, max_size=2),
    )


_VALUES = st.recursive(_SCALARS, _extend, max_leaves=12)
_SCHEMAS = st.dictionaries(_KEYWORDS, _VALUES, max_size=5)


# Mostly well-formed schemas: each keyword gets a value of the kind the
# metaschema wants, with an edge case or a wrong kind now and then.
_COUNTS = st.sampled_from([0, 1, 7, -1, 1.0, 2.5, Decimal("2"), Decimal("2.0"), True])
_NUMBERS = st.sampled_from([0, 1, -1, 0.5, Decimal("0.1"), Decimal("-2"), "1", None])
_NAMES = st.lists(st.sampled_from(["a", "b", "c"]), max_size=3)
_STRINGS = st.sampled_from(["x", "", "^a", "[", "http://example.com/", "#a", "a b", 1])
_TYPE_NAMES = st.sampled_from(["string", "integer", "object", "null", "strin", 3])
_LEAVES: dict[str, st.SearchStrategy[Any]] = {
    **{key: _COUNTS for key in ("minLength", "maxLength", "minItems", "maxItems",
                               "minProperties", "maxProperties", "minContains", "maxContains")},
    **{key: _NUMBERS for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                                "multipleOf")},
    **{key: _STRINGS for key in ("title", "description", "$comment", "format", "pattern",
                                "$anchor", "$dynamicAnchor", "$ref", "$dynamicRef", "$id",
                                "$schema", "contentEncoding", "contentMediaType")},
    **{key: st.sampled_from([True, False, 1, None]) for key in ("uniqueItems", "deprecated",
                                                               "readOnly", "writeOnly")},
    "type": st.one_of(_TYPE_NAMES, st.lists(_TYPE_NAMES, max_size=3)),
    "required": st.one_of(_NAMES, st.lists(st.sampled_from(["a", 1]), max_size=2)),
    "enum": st.one_of(st.lists(_SCALARS, max_size=3), _SCALARS),
    "const": _SCALARS,
    "default": _SCALARS,
    "examples": st.one_of(st.lists(_SCALARS, max_size=2), _SCALARS),
    "dependentRequired": st.dictionaries(st.sampled_from(["a", "b"]), _NAMES, max_size=2),
}  # fmt: skip


def _schema_node(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    names = st.sampled_from(["a", "b", "^x", "["])
    applied: dict[str, st.SearchStrategy[Any]] = {
        **{key: children for key in ("items", "contains", "additionalProperties", "not", "if",
                                    "then", "else", "propertyNames", "unevaluatedItems",
                                    "unevaluatedProperties", "contentSchema")},
        **{key: st.lists(children, max_size=2) for key in ("allOf", "anyOf", "oneOf",
                                                          "prefixItems")},
        **{key: st.dictionaries(names, children, max_size=2) for key in (
            "properties", "$defs", "definitions", "dependentSchemas", "patternProperties")},
        "dependencies": st.dictionaries(names, st.one_of(children, _NAMES), max_size=2),
    }  # fmt: skip
    values = {**_LEAVES, **applied}
    keyword = st.sampled_from([*sorted(values), "x-extension"])
    return keyword.flatmap(lambda name: values.get(name, _SCALARS).map(lambda value: {name: value}))


def _merged(parts: list[dict[str, Any]]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for part in parts:
        merged.update(part)
    return merged


_WELL_FORMED = st.recursive(
    st.booleans() | st.just({}),
    lambda children: st.lists(_schema_node(children), max_size=4).map(_merged),
    max_leaves=10,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_SCHEMAS)
def test_the_fast_metaschema_proof_agrees_with_check_schema(schema: dict[str, Any]) -> None:
    assert proves_valid(schema) == _full_check_passes(schema)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_WELL_FORMED)
def test_the_proof_agrees_on_mostly_well_formed_schemas(schema: Any) -> None:
    assert proves_valid(schema) == _full_check_passes(schema)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"a": {"type": "strin"}}},
        {"type": "object", "properties": {"a": {"minLength": -1}}},
        {"type": "object", "properties": {"a": {"maxLength": Decimal("1.5")}}},
        {"type": "object", "required": ["a", "a"]},
        {"type": "object", "properties": {"a": {"pattern": "["}}},
        {"type": "object", "anyOf": []},
        {"type": "object", "multipleOf": 0},
        {"type": "object", "patternProperties": {"(": {}}},
        {"type": "object", "$defs": {"x": 3}},
        {"type": "object", "dependencies": {"a": ["b", 1]}},
        {"type": "object", "$anchor": "1bad"},
        {"type": ["object", "object"]},
        {"type": "object", "properties": {"a": {"items": {"type": "strin"}}}},
    ],
)
def test_a_schema_the_metaschema_refuses_is_never_proven_valid(schema: dict[str, Any]) -> None:
    assert not _full_check_passes(schema)
    assert not proves_valid(schema)
    # compile_schema still refuses it with jsonschema's own sentence.
    with pytest.raises(SchemaError, match="does not compile"):
        compile_schema(schema)


def test_common_tool_schemas_are_proven_without_jsonschema() -> None:
    schemas = [
        {"type": "object"},
        {
            "type": "object",
            "properties": {
                "n": {"type": "integer", "minimum": 0, "description": "any number"},
                "text": {"type": "string", "maxLength": 4096, "pattern": "^[a-z]*$"},
                "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
                "mode": {"enum": ["a", "b"], "default": "a"},
                "when": {"anyOf": [{"type": "string", "format": "date-time"}, {"type": "null"}]},
            },
            "required": ["n"],
            "additionalProperties": False,
            "$defs": {"unused": True},
        },
    ]
    for schema in schemas:
        parsed = parse_json(json.dumps(schema))
        assert proves_valid(parsed)
        assert _full_check_passes(parsed)


def test_the_proof_handles_every_keyword_the_metaschema_constrains() -> None:
    # A new metaschema keyword (a jsonschema-specifications upgrade) would
    # otherwise fall back to jsonschema silently; this says so instead.
    assert metaschema._HANDLED == METASCHEMA_KEYWORDS
    # The metaschema documents constrain keywords only through `properties`
    # (and the node type); a document with any other constraint would need
    # the proof revised.
    structural = {
        "$schema", "$id", "$vocabulary", "$dynamicAnchor", "title", "$comment", "type",
        "properties", "$defs", "allOf",
    }  # fmt: skip
    uris = [metaschema.DIALECT] + [
        f"https://json-schema.org/draft/2020-12/meta/{name}" for name in metaschema._VOCABULARIES
    ]
    for uri in uris:
        document = REGISTRY.contents(uri)
        assert set(document) <= structural, uri
        assert document["type"] == ["object", "boolean"]


def test_a_dangling_reference_is_still_refused_when_the_schema_compiles() -> None:
    # The validator of a schema without references is built at its first check;
    # one with references is built at once, so a dangling one is refused at load.
    with pytest.raises(SchemaError, match="does not resolve inside the document"):
        compile_schema({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}})
    referring = compile_schema(
        {
            "type": "object",
            "properties": {"a": {"$ref": "#/$defs/text"}},
            "$defs": {"text": {"type": "string"}},
        }
    )
    assert referring.first_error({"a": "fine"}) is None
    assert referring.first_error({"a": 1}) == "1 is not of type 'string' at /a"
    plain = compile_schema(
        parse_json('{"type": "object", "properties": {"n": {"type": "integer", "maximum": 3}}}')
    )
    assert plain.first_error(parse_json('{"n": 3.0}')) is None
    assert plain.first_error({"n": 4}) == "4 is greater than the maximum of 3 at /n"


def test_the_written_keywords_are_the_metaschema_documents_keywords() -> None:
    # METASCHEMA_KEYWORDS is written out so the proof needs no jsonschema import; it must
    # stay what the metaschema documents (root and vocabularies) constrain.
    uris = [metaschema.DIALECT] + [
        f"https://json-schema.org/draft/2020-12/meta/{name}" for name in metaschema._VOCABULARIES
    ]
    read: set[str] = set()
    for uri in uris:
        read.update(REGISTRY.contents(uri).get("properties", {}))
    assert read == METASCHEMA_KEYWORDS


_ANY_JSON_VALUE = st.recursive(
    st.one_of(
        _SCALARS,
        st.integers(),
        st.floats(allow_nan=True, allow_infinity=True),
        st.decimals(allow_nan=False),
        st.text(max_size=8),
    ),
    lambda children: st.one_of(
        st.lists(children, max_size=3), st.dictionaries(st.text(max_size=3), children, max_size=3)
    ),
    max_leaves=6,
)


@settings(max_examples=400, deadline=None)
@given(_ANY_JSON_VALUE)
def test_the_type_checks_are_jsonschemas_2020_12_type_checks(value: Any) -> None:
    for kind in ("array", "boolean", "integer", "null", "number", "object", "string"):
        assert metaschema._is(value, kind) == CHECKER.TYPE_CHECKER.is_type(value, kind), kind


_REGEX_TEXTS = st.one_of(
    st.sampled_from(["^a+$", "[", "(?P<x>a)", "(?<x>a)", "\\p{L}", "a{2,1}", "(", ")", "\\"]),
    st.text(alphabet="ab()[]{}^$*+?|\\.-,0123456789PL<>=!:", max_size=8),
)


@settings(max_examples=400, deadline=None)
@given(st.one_of(_REGEX_TEXTS, _SCALARS))
def test_the_regex_format_is_jsonschemas(value: Any) -> None:
    assert metaschema._conforms(value, "regex") == CHECKER.FORMAT_CHECKER.conforms(value, "regex")


def test_the_dialect_uris_taken_without_jsonschema_are_uris_to_jsonschema() -> None:
    for uri in metaschema._DIALECT_URIS:
        for format_name in ("uri", "uri-reference"):
            assert metaschema._conforms(uri, format_name)
            assert CHECKER.FORMAT_CHECKER.conforms(uri, format_name)
