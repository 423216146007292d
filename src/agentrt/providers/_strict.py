"""Which tool schemas Anthropic's strict tool use can take, and one sentence for the others.

Strict tool use constrains the model's tool input to the schema by grammar,
over a documented subset of JSON Schema: the basic types, `enum` of
primitives, `const`, `anyOf`, `allOf`, local non-recursive `$ref` with
`$defs`/`definitions`, `required`, `additionalProperties: false` (which every
object must set), the string formats below, and `minItems` of 0 or 1.  Not
numerical or string length constraints, other array constraints, recursive
or external references, or enums of compound values.  agentrt never rewrites
a schema to fit (the gate validates against the tool's own schema either
way); a schema outside the subset is refused, naming where.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from ..sanitize import sanitize

__all__ = ["strict_refusal"]

_ANNOTATIONS: Final = frozenset(
    {"description", "title", "default", "examples", "$schema", "$comment"}
)
_KEYWORDS: Final = _ANNOTATIONS | {
    "type", "properties", "required", "additionalProperties", "items", "enum", "const",
    "anyOf", "allOf", "$ref", "$defs", "definitions", "format", "minItems",
}  # fmt: skip
_FORMATS: Final = frozenset(
    {"date-time", "time", "date", "duration", "email", "hostname", "uri", "ipv4", "ipv6", "uuid"}
)


class _Refused(Exception):
    pass


def strict_refusal(tool: str, schema: Mapping[str, Any]) -> str | None:
    """Why `schema` falls outside the strict subset (one sentence), or None when it fits."""
    try:
        definitions = _definitions(schema)
        _check(schema, "", definitions)
        for name in definitions:
            _no_cycle(f"#/$defs/{name}", definitions, ())
    except _Refused as refused:
        return (
            f"the tool {sanitize(tool)} cannot use Anthropic's strict tool use: its input schema "
            f"{refused}; turn strict_tools off or change the schema"
        )
    return None


def _where(path: str) -> str:
    return f"at {sanitize(path)}" if path else "at its top"


def _definitions(schema: Mapping[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key in ("$defs", "definitions"):
        block = schema.get(key)
        if isinstance(block, Mapping):
            found.update({str(name): value for name, value in block.items()})
    return found


def _check(node: Any, path: str, definitions: Mapping[str, Any]) -> None:
    if isinstance(node, bool):
        raise _Refused(f"has a boolean schema {_where(path)}")
    if not isinstance(node, Mapping):
        raise _Refused(f"has something other than a schema {_where(path)}")
    for key in node:
        if key not in _KEYWORDS:
            raise _Refused(f'uses "{sanitize(str(key))}" {_where(path)}, which it does not support')
    kinds = node.get("type")
    kinds = [kinds] if isinstance(kinds, str) else kinds if isinstance(kinds, list) else []
    if "object" in kinds or "properties" in node:
        if node.get("additionalProperties") is not False:
            raise _Refused(f"does not set additionalProperties to false {_where(path)}")
    elif "additionalProperties" in node and node["additionalProperties"] is not False:
        raise _Refused(f"sets additionalProperties to something other than false {_where(path)}")
    if "format" in node and node["format"] not in _FORMATS:
        raise _Refused(f'uses the format "{sanitize(str(node["format"]))}" {_where(path)}')
    if "minItems" in node and node["minItems"] not in (0, 1):
        raise _Refused(f"sets minItems to something other than 0 or 1 {_where(path)}")
    enum = node.get("enum")
    if enum is not None and (
        not isinstance(enum, list) or any(isinstance(value, dict | list) for value in enum)
    ):
        raise _Refused(f"has an enum of values that are not all primitive {_where(path)}")
    reference = node.get("$ref")
    if reference is not None:
        if not isinstance(reference, str) or not reference.startswith(
            ("#/$defs/", "#/definitions/")
        ):
            raise _Refused(f"has a reference that is not local {_where(path)}")
        if reference.split("/", 2)[2] not in definitions:
            raise _Refused(f"has a reference that does not resolve {_where(path)}")
    properties = node.get("properties")
    if isinstance(properties, Mapping):
        for name, value in properties.items():
            _check(value, f"{path}/properties/{name}", definitions)
    if "items" in node:
        _check(node["items"], f"{path}/items", definitions)
    for key in ("anyOf", "allOf"):
        branches = node.get(key)
        if branches is not None:
            if not isinstance(branches, list):
                raise _Refused(f"has a {key} that is not a list {_where(path)}")
            for index, branch in enumerate(branches):
                _check(branch, f"{path}/{key}/{index}", definitions)
    for key in ("$defs", "definitions"):
        block = node.get(key)
        if isinstance(block, Mapping):
            for name, value in block.items():
                _check(value, f"{path}/{key}/{name}", definitions)


def _references(node: Any) -> list[str]:
    found: list[str] = []
    if isinstance(node, Mapping):
        reference = node.get("$ref")
        if isinstance(reference, str):
            found.append(reference.split("/", 2)[2])
        for key, value in node.items():
            if key not in ("$defs", "definitions"):
                found.extend(_references(value))
    elif isinstance(node, list):
        for value in node:
            found.extend(_references(value))
    return found


def _no_cycle(start: str, definitions: Mapping[str, Any], seen: tuple[str, ...]) -> None:
    name = start.split("/", 2)[2]
    if name in seen:
        raise _Refused(f'is recursive (through "{sanitize(name)}")')
    for target in _references(definitions.get(name)):
        _no_cycle(f"#/$defs/{target}", definitions, (*seen, name))
