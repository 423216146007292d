"""Preconditions: the state a request acts on, read when its approval is asked and
again before the approved call runs, so a person's yes holds only for the state
they saw.

A tool opts in by providing `fingerprint(call) -> StateRead` (`agentrt.tools`).  The
state's SHA-256 joins the approval's capability and a bounded copy of it its
presentation: both are covered by the approval hash, and only when the tool has a
precondition, so every other approval hashes as it always did.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import anyio

from ..canonical import canonical_bytes, sha256_hex
from ..policy import PolicyDecision
from ..tools import CheckedTool, StateRead, ToolCall
from ._values import error_text

__all__ = [
    "MAX_STATE_CHARS",
    "PRECONDITION_UNAVAILABLE",
    "RECONCILED",
    "STALE",
    "StateCheck",
    "approved_state",
    "bind_state",
    "has_precondition",
    "read_state",
    "stale_text",
    "unavailable_text",
]

PRECONDITION_UNAVAILABLE: Final = "precondition_unavailable"
STALE: Final = "stale"
MAX_STATE_CHARS: Final = 200_000
"""The most of a state's text an approval keeps for its view (its digest covers all of it)."""
RECONCILED: Final = "reconciled"
RECONCILED_CONTENT: Final = (
    '"reconciled: the state already is what this call would make it (an earlier, approved '
    'attempt took effect), so it was not run again"'
)


@dataclass(frozen=True, slots=True)
class StateCheck:
    """One read of a request's state: what was read and its digest, or why it could not be."""

    read: StateRead | None
    digest: str | None
    error: str | None
    # The digest an earlier, spent approval of this same request bound (a retry of a
    # call cut off mid-way), and whether the state already is that call's intended result.
    approved: str | None = None
    reconciled: bool = False

    def record(self) -> dict[str, Any]:
        """The `state_read` event's payload (the step is added by the ledger)."""
        if self.read is None or self.digest is None:
            return {"error": self.error or "no state was read"}
        return {
            "tool": self.read.tool,
            "args": self.read.args,
            "state": self.digest,
            "absent": self.read.content is None,
        }


def has_precondition(registered: CheckedTool) -> bool:
    return callable(getattr(registered.tool, "fingerprint", None))


def state_digest(read: StateRead) -> str:
    """SHA-256 of the state's canonical form: absent, or its exact text."""
    value = {"absent": True} if read.content is None else {"content": read.content}
    return sha256_hex(canonical_bytes(value))


async def read_state(registered: CheckedTool, call: ToolCall) -> StateCheck:
    """Read the state `call` would act on, bounded by the tool's timeout; never raises
    for what the read did (a failure is the check's `error`: the caller fails closed)."""
    name = registered.spec.name
    fingerprint = getattr(registered.tool, "fingerprint", None)
    if not callable(fingerprint):
        return StateCheck(None, None, f"the tool {name} no longer has a precondition")
    # A precondition may declare its own bound (the proxy's: its read tool's timeout).
    declared = getattr(registered.tool, "fingerprint_timeout", None)
    timeout = declared if isinstance(declared, (int, float)) and declared > 0 else None
    timeout = timeout or registered.spec.timeout
    try:
        with anyio.fail_after(timeout):
            read = await fingerprint(call)
    except TimeoutError:
        return StateCheck(
            None, None, f"the precondition of {name} did not answer within {timeout:g}s"
        )
    except anyio.get_cancelled_exc_class():
        raise
    except Exception as exc:
        return StateCheck(None, None, f"the precondition of {name} failed: {error_text(exc)}")
    if not isinstance(read, StateRead) or not (
        read.content is None or isinstance(read.content, str)
    ):
        return StateCheck(None, None, f"the precondition of {name} returned no StateRead")
    return StateCheck(read, state_digest(read), None)


def bind_state(decided: PolicyDecision, check: StateCheck) -> PolicyDecision:
    """`decided` (an approval's decision) with the state bound in: its digest in the
    capability, what was read (bounded) in the presentation."""
    assert check.read is not None and check.digest is not None
    content = check.read.content
    shown: dict[str, Any] = {
        "tool": check.read.tool,
        "args": check.read.args,
        "absent": content is None,
    }
    if content is not None:
        shown["content"] = content[:MAX_STATE_CHARS]
        shown["truncated"] = len(content) > MAX_STATE_CHARS
    if check.approved is not None:
        shown["approved_state"] = check.approved
    return PolicyDecision(
        decided.outcome,
        decided.reason,
        decided.kind,
        {**_as_object(decided.capability, "capability"), "state": check.digest},
        {**_as_object(decided.presentation, "presented"), "state": shown},
    )


def approved_content(presentation: Any) -> str | None:
    """The whole state text an approval was shown, if it kept all of it."""
    state = presentation.get("state") if isinstance(presentation, Mapping) else None
    if isinstance(state, Mapping) and state.get("truncated") is False:
        content = state.get("content")
        return content if isinstance(content, str) else None
    return None


def approved_state(capability: Any) -> str | None:
    """The state digest an approval was decided against, if it has one."""
    if isinstance(capability, Mapping):
        state = capability.get("state")
        if isinstance(state, str):
            return state
    return None


def unavailable_text(tool: str, error: str) -> str:
    return f"UNAVAILABLE: the call to {tool} did not run: {error}; nothing ran"


def stale_text(tool: str) -> str:
    return (
        f"STALE: the call to {tool} was not run: the state changed after it was approved; "
        "nothing ran; calling again asks for a new approval"
    )


def _as_object(value: Any, key: str) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return dict(value)
    return {key: value}
