"""agentrt: the model asks, the runtime decides."""

from .agent import Agent, Decision, DecisionKind, Observation, StepInput
from .canonical import JSONBoundaryError, canonical_json, parse_json
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
from .policy import (
    ClassPolicy,
    DefaultPolicy,
    Outcome,
    Policy,
    PolicyDecision,
    RunView,
    ToolRequest,
)
from .sanitize import sanitize
from .tools import SideEffect, Tool, ToolCall, ToolResult, ToolSpec

__all__ = [
    "Agent",
    "AgentrtError",
    "ApprovalError",
    "ApprovalHashMismatch",
    "ClassPolicy",
    "Decision",
    "DecisionKind",
    "DefaultPolicy",
    "JSONBoundaryError",
    "Observation",
    "Outcome",
    "Policy",
    "PolicyDecision",
    "RegistrationError",
    "RunLeased",
    "RunNotFound",
    "RunStateError",
    "RunView",
    "SchemaError",
    "SideEffect",
    "StepInput",
    "StoreError",
    "Tool",
    "ToolCall",
    "ToolRequest",
    "ToolResult",
    "ToolSpec",
    "UnsafeDatabase",
    "canonical_json",
    "parse_json",
    "sanitize",
]
