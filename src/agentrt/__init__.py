"""agentrt: the model asks, the runtime decides."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from ._lazy import lazy_names

# Bound now: `agentrt.sanitize` is also a submodule's name, and the first import of a
# submodule binds it on its package, so a lazily bound function would be shadowed.
from .sanitize import sanitize

if TYPE_CHECKING:
    from .agent import Agent, Decision, DecisionKind, Observation, StepInput
    from .approvals import approve, cancel, reject
    from .canonical import JSONBoundaryError, canonical_json, parse_json
    from .driver import Driver, RunResult
    from .errors import (
        AgentrtError,
        ApprovalError,
        ApprovalHashMismatch,
        RegistrationError,
        RunLeased,
        RunNotFound,
        RunStateError,
        SchemaError,
        StoreError,
        UnsafeDatabase,
    )
    from .gate import Gate, Limits, StepOutcome
    from .policy import (
        ClassPolicy,
        DefaultPolicy,
        Outcome,
        Policy,
        PolicyDecision,
        RunView,
        ToolRequest,
    )
    from .store import (
        ApprovalRecord,
        ApprovalStatus,
        Event,
        RunRecord,
        RunStatus,
        StepRecord,
        StepStatus,
        Store,
        open_store,
    )
    from .tools import SideEffect, StateRead, Tool, ToolCall, ToolResult, ToolSpec
    from .trace import JsonlTrace, TextTrace

__all__ = [
    "Agent",
    "AgentrtError",
    "ApprovalError",
    "ApprovalHashMismatch",
    "ApprovalRecord",
    "ApprovalStatus",
    "ClassPolicy",
    "Decision",
    "DecisionKind",
    "DefaultPolicy",
    "Driver",
    "Event",
    "Gate",
    "JSONBoundaryError",
    "JsonlTrace",
    "Limits",
    "Observation",
    "Outcome",
    "Policy",
    "PolicyDecision",
    "RegistrationError",
    "RunLeased",
    "RunNotFound",
    "RunRecord",
    "RunResult",
    "RunStateError",
    "RunStatus",
    "RunView",
    "SchemaError",
    "SideEffect",
    "StateRead",
    "StepInput",
    "StepOutcome",
    "StepRecord",
    "StepStatus",
    "Store",
    "StoreError",
    "TextTrace",
    "Tool",
    "ToolCall",
    "ToolRequest",
    "ToolResult",
    "ToolSpec",
    "UnsafeDatabase",
    "approve",
    "cancel",
    "canonical_json",
    "open_store",
    "parse_json",
    "reject",
    "sanitize",
]

# Each name is imported on first use, so a command or a proxy that needs the
# store pays neither for the gate's JSON Schema validators nor for the driver.
_WHERE: Final = {
    "Agent": ".agent",
    "Decision": ".agent",
    "DecisionKind": ".agent",
    "Observation": ".agent",
    "StepInput": ".agent",
    "approve": ".approvals",
    "cancel": ".approvals",
    "reject": ".approvals",
    "JSONBoundaryError": ".canonical",
    "canonical_json": ".canonical",
    "parse_json": ".canonical",
    "Driver": ".driver",
    "RunResult": ".driver",
    "AgentrtError": ".errors",
    "ApprovalError": ".errors",
    "ApprovalHashMismatch": ".errors",
    "RegistrationError": ".errors",
    "RunLeased": ".errors",
    "RunNotFound": ".errors",
    "RunStateError": ".errors",
    "SchemaError": ".errors",
    "StoreError": ".errors",
    "UnsafeDatabase": ".errors",
    "Gate": ".gate",
    "Limits": ".gate",
    "StepOutcome": ".gate",
    "ClassPolicy": ".policy",
    "DefaultPolicy": ".policy",
    "Outcome": ".policy",
    "Policy": ".policy",
    "PolicyDecision": ".policy",
    "RunView": ".policy",
    "ToolRequest": ".policy",
    "ApprovalRecord": ".store",
    "ApprovalStatus": ".store",
    "Event": ".store",
    "RunRecord": ".store",
    "RunStatus": ".store",
    "StepRecord": ".store",
    "StepStatus": ".store",
    "Store": ".store",
    "open_store": ".store",
    "SideEffect": ".tools",
    "Tool": ".tools",
    "ToolCall": ".tools",
    "StateRead": ".tools",
    "ToolResult": ".tools",
    "ToolSpec": ".tools",
    "JsonlTrace": ".trace",
    "TextTrace": ".trace",
}


__getattr__ = lazy_names(__name__, _WHERE, globals())
