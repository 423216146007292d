"""agentrt: the model asks, the runtime decides."""

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
from .sanitize import sanitize
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
from .tools import SideEffect, Tool, ToolCall, ToolResult, ToolSpec
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
