"""Schema-driven argument fuzzing: Hypothesis strategies from a tool's JSON Schema.

`arguments_for(tool)` draws JSON text for arguments the tool's input schema
accepts (through `hypothesis-jsonschema`), in the canonical form the gate
records; use it to check that a policy never raises, that a tool handles
every valid input, or that the gate takes what the schema says it takes.
Needs the `testkit` extra (`pip install 'agentrt[testkit]'`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..canonical import canonical_json
from ..tools import ToolSpec

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

__all__ = ["arguments_for"]


def arguments_for(tool: Any) -> SearchStrategy[str]:
    """A strategy of JSON texts (canonical) valid for `tool`'s input schema (a spec or a tool)."""
    try:
        from hypothesis_jsonschema import from_schema
    except ImportError as missing:  # pragma: no cover - the extra is in dev
        raise ImportError(
            "agentrt.testkit.arguments_for needs the testkit extra (pip install 'agentrt[testkit]')"
        ) from missing
    spec = tool if isinstance(tool, ToolSpec) else tool.spec
    return from_schema(dict(spec.input_schema)).map(canonical_json)
