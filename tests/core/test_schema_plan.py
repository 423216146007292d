"""The schema check's shortcut for simple schemas answers exactly as jsonschema does.

`CompiledSchema.first_error` proves common values valid without jsonschema's walk
when the schema uses only types, properties, required, closed objects and bounds;
every other value (and every other schema) goes through jsonschema, which alone
words a refusal.  These tests compare the two paths over many values.
"""

from __future__ import annotations

import random
from decimal import Decimal
from typing import Any

import pytest

from agentrt.schema import CompiledSchema, compile_schema

_SIMPLE: list[dict[str, Any]] = [
    {
        "type": "object",
        "properties": {
            "n": {"type": "integer", "minimum": 0, "description": "a count"},
            "text": {"type": "string", "maxLength": 5},
        },
        "required": ["n"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "x": {"type": ["number", "null"], "maximum": 3.5},
            "s": {"type": "string", "minLength": 2},
        },
    },
    {
        "type": "object",
        "properties": {
            "o": {
                "type": "object",
                "properties": {"b": {"type": "boolean"}},
                "required": ["b"],
                "additionalProperties": False,
            }
        },
    },
    {"properties": {"a": {"type": "array"}}, "required": ["a"]},
]

_VALUES: list[Any] = [
    0, 1, -1, Decimal("1.0"), Decimal("2.5"), Decimal("-3"), 3.5, 4, True, False, None,
    "", "a", "ab", "abcdef", "é" * 5, [], {}, {"b": True}, {"b": 1}, {"b": True, "c": 1},
]  # fmt: skip
_KEYS = ["n", "text", "x", "s", "o", "a", "zz"]


def _through_jsonschema(compiled: CompiledSchema) -> CompiledSchema:
    """The same schema with no shortcut: every value goes through jsonschema."""
    return CompiledSchema(schema=compiled.schema, _dialect=compiled._dialect, _planned=[None])


@pytest.mark.parametrize("schema", _SIMPLE)
def test_the_shortcut_refuses_and_accepts_exactly_what_jsonschema_does(
    schema: dict[str, Any],
) -> None:
    compiled = compile_schema(schema)
    assert compiled._plan() is not None, "the schema should take the shortcut"
    slow = _through_jsonschema(compiled)
    chooser = random.Random(15)
    refused = accepted = 0
    for _ in range(1500):
        instance: Any = {
            key: chooser.choice(_VALUES) for key in chooser.sample(_KEYS, chooser.randint(0, 3))
        }
        if chooser.random() < 0.05:
            instance = chooser.choice(_VALUES)
        expected = slow.first_error(instance)
        assert compiled.first_error(instance) == expected, instance
        refused += expected is not None
        accepted += expected is None
    # Both paths were exercised: some values pass, some are refused.
    assert refused >= 5 and accepted >= 5


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"p": {"type": "string", "pattern": "^a"}}},
        {"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 2}}},
        {"type": "object", "additionalProperties": {"type": "string"}},
        {"type": "object", "properties": {"e": {"enum": ["a", "b"]}}},
        {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object"},
        {"type": "object", "properties": {"n": True}},
    ],
)
def test_a_schema_outside_the_shortcut_goes_through_jsonschema(schema: dict[str, Any]) -> None:
    compiled = compile_schema(schema)
    assert compiled._plan() is None


def test_a_refusal_through_the_shortcut_names_the_value_as_before() -> None:
    compiled = compile_schema(_SIMPLE[0])
    assert compiled.first_error({"n": 3, "text": "ok"}) is None
    assert compiled.first_error({"n": 1.0}) is None  # JSON Schema's integer 1.0
    assert compiled.first_error({"n": True}) == "True is not of type 'integer' at /n"
    assert compiled.first_error({"n": -1}) == "-1 is less than the minimum of 0 at /n"
    assert "additional properties are not allowed" in (compiled.first_error({"n": 1, "m": 2}) or "")
    assert compiled.first_error({}) == "'n' is a required property"
