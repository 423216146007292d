"""A rule's `precondition`, as the configuration writes it: the read-only tool of the
same server that reads the state a call will act on, so its approval binds that state
(`_preconditions.py` reads it; `agentrt.gate` binds it).

A rule writes it as `{"tool": "read_text_file", "arguments": {"path": "$.path"},
"absent_when": "ENOENT"}`: each argument of the read is either `"$.name"` (the
call's own argument `name`; `"$.a.b"` reaches into an object) or a literal JSON
value; a read whose error text contains `absent_when` is the state *absent* (the
stock filesystem server answers a missing file with an error naming `ENOENT`), any
other error fails closed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from ..sanitize import sanitize

__all__ = ["Precondition", "PreconditionError", "parse_precondition"]

_FIELDS: Final = frozenset({"tool", "arguments", "absent_when"})
# `$.name` or `$.name.inner`: a parameter of the call, or a key inside one.
_PATH: Final = re.compile(r"^\$(?:\.[A-Za-z0-9_-]+)+\Z")


class PreconditionError(Exception):
    """A precondition could not read the state; the message names its tool."""


@dataclass(frozen=True, slots=True)
class Precondition:
    """A rule's precondition, checked: the server's read tool, the read's arguments
    (`"$.path"` paths or literal values) and the error text that means absent."""

    tool: str
    arguments: Mapping[str, Any] = field(default_factory=dict)
    absent_when: str | None = None

    def read_arguments(self, call_arguments: Any) -> dict[str, Any]:
        """The read's arguments for one call; `PreconditionError` if a path is missing."""
        built: dict[str, Any] = {}
        for name, source in self.arguments.items():
            if isinstance(source, str) and _PATH.match(source):
                value = call_arguments
                for key in source[2:].split("."):
                    if not isinstance(value, dict) or key not in value:
                        raise PreconditionError(
                            f"the precondition {self.tool} needs the call's argument "
                            f"{source[2:]}, which it does not have"
                        )
                    value = value[key]
                built[name] = value
            else:
                built[name] = source
        return built


def parse_precondition(raw: Any, where: str) -> Precondition:
    """A rule's `precondition` as written; `ValueError` naming the field when malformed."""
    if not isinstance(raw, dict):
        raise ValueError(f"{where} precondition must be an object with a tool")
    for key in raw:
        if key not in _FIELDS:
            raise ValueError(f'{where} precondition has the unknown field "{sanitize(key)}"')
    tool = raw.get("tool")
    if not isinstance(tool, str) or not tool:
        raise ValueError(f"{where} precondition needs the name of a read-only tool")
    arguments = raw.get("arguments", {})
    if not isinstance(arguments, dict):
        raise ValueError(f"{where} precondition arguments must be an object of name to value")
    for name, source in arguments.items():
        if isinstance(source, str) and source.startswith("$") and not _PATH.match(source):
            raise ValueError(
                f"{where} precondition argument {sanitize(repr(name))} is "
                f'{sanitize(repr(source))}, not a path such as "$.path"'
            )
    absent_when = raw.get("absent_when")
    if absent_when is not None and (not isinstance(absent_when, str) or not absent_when):
        raise ValueError(f"{where} precondition absent_when must be non-empty text")
    return Precondition(tool, dict(arguments), absent_when)
