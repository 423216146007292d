"""A fast proof that a schema satisfies the JSON Schema 2020-12 metaschema.

jsonschema's `check_schema` walks the 2020-12 metaschema through its
`$dynamicRef`s, about a millisecond and a half per tool schema here: most of
the cost of loading a server's tools.  That metaschema constrains a schema
keyword by keyword (each keyword's value has a type, a bound, or is itself a
schema), so the same verdict can be reached by one walk over the schema with
a table of those constraints.

The walk only ever *proves validity*: `proves_valid` answers True when every
keyword the metaschema constrains was checked and held, and False otherwise
(a keyword failed, or anything it does not handle).  False means "ask
jsonschema", so every refusal, and its message, still comes from
`check_schema` itself.

The walk does not import jsonschema (about 60 ms of a proxy's start-up, issue 36):
the 2020-12 types and the "regex" format are checked here as jsonschema's
`Draft202012Validator.TYPE_CHECKER` and `FORMAT_CHECKER` define them (a test holds
them to those), and the "uri" and "uri-reference" formats, whose checks depend on
which optional libraries are installed, are asked of jsonschema's own checker, which
is imported only then.  `METASCHEMA_KEYWORDS` is written out, and a test holds it
equal to the metaschema documents' keywords.
"""

from __future__ import annotations

import functools
import numbers
import re
from collections.abc import Callable
from typing import Any, Final

__all__ = ["DIALECT", "METASCHEMA_KEYWORDS", "proves_valid"]

DIALECT: Final = "https://json-schema.org/draft/2020-12/schema"
_VOCABULARIES: Final = (
    "core",
    "applicator",
    "unevaluated",
    "validation",
    "meta-data",
    "format-annotation",
    "content",
)


METASCHEMA_KEYWORDS: Final = frozenset(
    {
        "$anchor", "$comment", "$defs", "$dynamicAnchor", "$dynamicRef", "$id",
        "$recursiveAnchor", "$recursiveRef", "$ref", "$schema", "$vocabulary",
        "additionalProperties", "allOf", "anyOf", "const", "contains", "contentEncoding",
        "contentMediaType", "contentSchema", "default", "definitions", "dependencies",
        "dependentRequired", "dependentSchemas", "deprecated", "description", "else", "enum",
        "examples", "exclusiveMaximum", "exclusiveMinimum", "format", "if", "items",
        "maxContains", "maxItems", "maxLength", "maxProperties", "maximum", "minContains",
        "minItems", "minLength", "minProperties", "minimum", "multipleOf", "not", "oneOf",
        "pattern", "patternProperties", "prefixItems", "properties", "propertyNames",
        "readOnly", "required", "then", "title", "type", "unevaluatedItems",
        "unevaluatedProperties", "uniqueItems", "writeOnly",
    }
)  # fmt: skip
"""Every keyword the 2020-12 metaschema (its root and seven vocabularies) constrains."""

_SIMPLE_TYPES: Final = frozenset(
    {"array", "boolean", "integer", "null", "number", "object", "string"}
)
# The metaschema's own patterns (meta/core), applied as its `pattern` keyword is: re.search.
_ANCHOR: Final = re.compile(r"^[A-Za-z_][-A-Za-z0-9._]*$")
_ID_WITHOUT_FRAGMENT: Final = re.compile(r"^[^#]*#?$")


def _is_integer(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and value.is_integer())


def _is_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, numbers.Number)


# jsonschema's 2020-12 type checks (`jsonschema._types`): bool is neither an integer nor
# a number, and a float with no fraction is an integer.
_TYPE_CHECKS: Final[dict[str, Callable[[Any], bool]]] = {
    "array": lambda value: isinstance(value, list),
    "boolean": lambda value: isinstance(value, bool),
    "integer": _is_integer,
    "null": lambda value: value is None,
    "number": _is_number,
    "object": lambda value: isinstance(value, dict),
    "string": lambda value: isinstance(value, str),
}


def _is(value: Any, kind: str) -> bool:
    return _TYPE_CHECKS[kind](value)


def _is_regex(value: Any) -> bool:
    # jsonschema's "regex" format: what is not a string conforms; a string must compile
    # with `re` (re.error is a non-conforming value; any other error propagates).
    if not isinstance(value, str):
        return True
    try:
        return bool(re.compile(value))
    except re.error:
        return False


# The dialect URIs, which are URIs and URI references whichever library checks them (a
# test asks jsonschema's checker), so the common `$schema` needs no import.
_DIALECT_URIS: Final = frozenset({DIALECT, DIALECT + "#"})


@functools.cache
def _format_checker() -> Any:
    import jsonschema

    return jsonschema.Draft202012Validator.FORMAT_CHECKER


def _conforms(value: Any, format_name: str) -> bool:
    if format_name == "regex":
        return _is_regex(value)
    if isinstance(value, str) and value in _DIALECT_URIS:
        return True
    return bool(_format_checker().conforms(value, format_name))


def _string(value: Any) -> bool:
    return _is(value, "string")


def _number(value: Any) -> bool:
    return _is(value, "number")


def _boolean(value: Any) -> bool:
    return _is(value, "boolean")


def _array(value: Any) -> bool:
    return _is(value, "array")


def _anything(value: Any) -> bool:
    return True


def _non_negative_integer(value: Any) -> bool:
    return _is(value, "integer") and not value < 0


def _positive_number(value: Any) -> bool:
    # multipleOf: {"type": "number", "exclusiveMinimum": 0}
    return _number(value) and not value <= 0


def _string_array(value: Any) -> bool:
    # stringArray: {"type": "array", "items": {"type": "string"}, "uniqueItems": true}
    return _array(value) and all(_string(item) for item in value) and len(set(value)) == len(value)


def _type(value: Any) -> bool:
    # anyOf: one of the simple types, or a non-empty array of distinct ones.
    if _string(value):
        return value in _SIMPLE_TYPES
    return _string_array(value) and len(value) >= 1 and set(value) <= _SIMPLE_TYPES


def _uri(value: Any) -> bool:
    return _string(value) and _conforms(value, "uri")


def _uri_reference(value: Any) -> bool:
    return _string(value) and _conforms(value, "uri-reference")


def _anchor(value: Any) -> bool:
    return _string(value) and _ANCHOR.search(value) is not None


def _identifier(value: Any) -> bool:
    return _uri_reference(value) and _ID_WITHOUT_FRAGMENT.search(value) is not None


def _vocabulary(value: Any) -> bool:
    return _is(value, "object") and all(
        _uri(name) and _boolean(flag) for name, flag in value.items()
    )


def _pattern(value: Any) -> bool:
    return _string(value) and _conforms(value, "regex")


def _dependent_required(value: Any) -> bool:
    return _is(value, "object") and all(_string_array(names) for names in value.values())


# Keywords whose value is checked on its own (no schema inside it).
_VALUES: Final[dict[str, Callable[[Any], bool]]] = {
    "$id": _identifier,
    "$schema": _uri,
    "$ref": _uri_reference,
    "$anchor": _anchor,
    "$dynamicRef": _uri_reference,
    "$dynamicAnchor": _anchor,
    "$vocabulary": _vocabulary,
    "$comment": _string,
    "$recursiveAnchor": _anchor,
    "$recursiveRef": _uri_reference,
    "type": _type,
    "const": _anything,
    "enum": _array,
    "multipleOf": _positive_number,
    "maximum": _number,
    "exclusiveMaximum": _number,
    "minimum": _number,
    "exclusiveMinimum": _number,
    "maxLength": _non_negative_integer,
    "minLength": _non_negative_integer,
    "pattern": _pattern,
    "maxItems": _non_negative_integer,
    "minItems": _non_negative_integer,
    "uniqueItems": _boolean,
    "maxContains": _non_negative_integer,
    "minContains": _non_negative_integer,
    "maxProperties": _non_negative_integer,
    "minProperties": _non_negative_integer,
    "required": _string_array,
    "dependentRequired": _dependent_required,
    "title": _string,
    "description": _string,
    "default": _anything,
    "deprecated": _boolean,
    "readOnly": _boolean,
    "writeOnly": _boolean,
    "examples": _array,
    "format": _string,
    "contentEncoding": _string,
    "contentMediaType": _string,
}
# Keywords whose value is one schema, a non-empty array of them, or an object of them.
_SCHEMA: Final = frozenset(
    {
        "items",
        "contains",
        "additionalProperties",
        "propertyNames",
        "if",
        "then",
        "else",
        "not",
        "unevaluatedItems",
        "unevaluatedProperties",
        "contentSchema",
    }
)
_SCHEMA_ARRAY: Final = frozenset({"prefixItems", "allOf", "anyOf", "oneOf"})
_SCHEMA_MAP: Final = frozenset({"properties", "$defs", "definitions", "dependentSchemas"})
_HANDLED: Final = frozenset(
    {*_VALUES, *_SCHEMA, *_SCHEMA_ARRAY, *_SCHEMA_MAP, "patternProperties", "dependencies"}
)


def proves_valid(schema: Any) -> bool:
    """True when `schema` is proven valid against the 2020-12 metaschema; False when unsure.

    False is not a refusal: the caller then runs jsonschema's `check_schema`.
    """
    try:
        return _walk(schema)
    except Exception:  # a value no check foresaw (RecursionError in a regex, say)
        return False


def _walk(root: Any) -> bool:
    pending = [root]
    while pending:
        node = pending.pop()
        if _boolean(node):
            continue
        if not _is(node, "object"):
            return False
        for keyword, value in node.items():
            if keyword not in METASCHEMA_KEYWORDS:
                continue  # the metaschema says nothing about keywords it does not define
            if keyword not in _HANDLED:
                return False
            check = _VALUES.get(keyword)
            if check is not None:
                if not check(value):
                    return False
            elif keyword in _SCHEMA:
                pending.append(value)
            elif keyword in _SCHEMA_ARRAY:
                if not _array(value) or len(value) < 1:
                    return False
                pending.extend(value)
            elif keyword in _SCHEMA_MAP:
                if not _is(value, "object"):
                    return False
                pending.extend(value.values())
            elif keyword == "patternProperties":
                if not _is(value, "object") or not all(_pattern(name) for name in value):
                    return False
                pending.extend(value.values())
            elif keyword == "dependencies":
                if not _is(value, "object"):
                    return False
                for dependency in value.values():
                    # anyOf a schema or a stringArray: an array is only ever the latter.
                    if _array(dependency):
                        if not _string_array(dependency):
                            return False
                    else:
                        pending.append(dependency)
    return True
