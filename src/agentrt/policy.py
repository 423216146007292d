"""Policy: the consumer's code that decides what a requested tool call may do."""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from .tools import SideEffect, ToolSpec

if TYPE_CHECKING:
    from .store import Connection, Principal

Claim = Callable[["Connection", str, int], None]
"""Work an `allow` depends on, done in the transaction that records the step (connection,
run id, step): a standing grant's call spent.  Raising rolls the step back whole."""

__all__ = [
    "ClassPolicy",
    "DefaultPolicy",
    "Outcome",
    "Policy",
    "PolicyDecision",
    "RunView",
    "ToolRequest",
]


class Outcome(enum.StrEnum):
    """The four things a policy may say about a request."""

    ALLOW = "allow"
    DENY = "deny"
    ABORT = "abort"
    REQUIRE_APPROVAL = "require_approval"


@dataclass(frozen=True, slots=True)
class ToolRequest:
    """A validated tool call the policy is asked about.

    `args` is the exact JSON text the model sent; `arguments` is its parsed
    form (numbers as int/Decimal).  `spec.name` is the name the model used.
    """

    spec: ToolSpec
    args: str
    arguments: Any
    run_id: str
    step: int


@dataclass(frozen=True, slots=True)
class RunView:
    """What a policy may know of the run so far (read-only)."""

    run_id: str
    goal: str
    step_count: int
    consecutive_failures: int
    metadata: Mapping[str, str] = field(default_factory=dict)
    # Who the run is for, when it has a principal and the gate knows it at hand (a run's
    # start); otherwise None, and `Store.principal_of_run` reads it (issue 35).
    principal: Principal | None = None


@dataclass(frozen=True, slots=True)
class PolicyDecision:
    """A policy's answer.  For `require_approval`, `kind`, `capability` and
    `presentation` say what is approved and what the operator is shown; all
    three are hashed with the exact request."""

    outcome: Outcome
    reason: str = ""
    kind: str = ""
    capability: Any = None
    presentation: Any = None
    # Facts the policy wants written with its decision: fields of the `policy_decided`
    # (or `run_resumed`) event the gate does not write itself, e.g. the taint the proxy's
    # flow rules judged the call under.  None writes nothing more.
    record: Mapping[str, Any] | None = None
    # Set only by a policy whose `allow` spends something (a standing grant's call).
    claim: Claim | None = field(default=None, compare=False, repr=False)

    @classmethod
    def allow(cls, reason: str = "", *, claim: Claim | None = None) -> PolicyDecision:
        return cls(Outcome.ALLOW, reason, claim=claim)

    @classmethod
    def deny(cls, reason: str) -> PolicyDecision:
        return cls(Outcome.DENY, reason)

    @classmethod
    def abort(cls, reason: str) -> PolicyDecision:
        return cls(Outcome.ABORT, reason)

    @classmethod
    def require_approval(
        cls, kind: str, capability: Any, presentation: Any, reason: str = ""
    ) -> PolicyDecision:
        return cls(Outcome.REQUIRE_APPROVAL, reason, kind, capability, presentation)


@runtime_checkable
class Policy(Protocol):
    """Consumer code deciding each request; it runs outside the model.

    A policy may also declare `id` (a string naming this version of its rules,
    say a hash); the gate then records it in each `policy_decided` event.  It
    is optional, so it is read with `getattr` rather than declared here.
    """

    async def evaluate(self, request: ToolRequest, run: RunView) -> PolicyDecision: ...


_PREVIEW_CHARS = 400


def default_presentation(request: ToolRequest) -> dict[str, Any]:
    """What an operator is shown for a request: the tool, its class, and the
    arguments — for a write (`path` + `content`) the path, line count and a preview."""
    presentation: dict[str, Any] = {
        "tool": request.spec.name,
        "side_effect": str(request.spec.side_effect),
    }
    arguments = request.arguments
    if isinstance(arguments, dict):
        path = arguments.get("path")
        content = arguments.get("content")
        if isinstance(path, str):
            presentation["path"] = path
        if isinstance(content, str):
            # Count "\n" only: splitlines() also breaks at U+2028, \x0b, \x85...,
            # which would let a model make the shown count differ from the file's.
            presentation["lines"] = content.count("\n") + (
                0 if not content or content.endswith("\n") else 1
            )
            presentation["bytes"] = len(content.encode("utf-8"))
            presentation["preview"] = content[:_PREVIEW_CHARS]
        presentation["arguments"] = arguments
    return presentation


@dataclass(frozen=True, slots=True)
class ClassPolicy:
    """Decide by the tool's side-effect class: `{SideEffect: Outcome}`.

    A class missing from the table is denied (an unknown class is never allowed).
    """

    outcomes: Mapping[SideEffect, Outcome]

    async def evaluate(self, request: ToolRequest, run: RunView) -> PolicyDecision:
        side_effect = request.spec.side_effect
        outcome = self.outcomes.get(side_effect, Outcome.DENY)
        if outcome is Outcome.REQUIRE_APPROVAL:
            return PolicyDecision.require_approval(
                kind=f"tool:{side_effect}",
                capability={"tool": request.spec.name, "side_effect": str(side_effect)},
                presentation=default_presentation(request),
                reason=f"{side_effect} needs an operator's approval",
            )
        if outcome is Outcome.ALLOW:
            return PolicyDecision.allow(f"{side_effect} is allowed")
        if outcome is Outcome.ABORT:
            return PolicyDecision.abort(f"{side_effect} ends the run")
        return PolicyDecision.deny(f"{side_effect} tools are not allowed")


_DEFAULT_OUTCOMES: Mapping[SideEffect, Outcome] = {
    SideEffect.READ_ONLY: Outcome.ALLOW,
    SideEffect.LOCAL_MUTATION: Outcome.ALLOW,
    SideEffect.REMOTE_MUTATION: Outcome.REQUIRE_APPROVAL,
    SideEffect.DESTRUCTIVE: Outcome.DENY,
}


class DefaultPolicy(ClassPolicy):
    """Read-only and local mutation allowed, remote mutation needs approval,
    destructive denied, an unknown class denied."""

    def __init__(self) -> None:
        super().__init__(_DEFAULT_OUTCOMES)
