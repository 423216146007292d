"""Reconcile: a consumer's hook that settles a cut-off action before the gate pauses on it.

When a run's process died while a mutating tool ran, the gate cannot know
whether the action took effect, so it pauses on an `interrupted_side_effect`
approval.  A consumer often can know (the mail is in the sent folder, the row
exists, the file has the new content).  `Gate(reconcile=hook)` asks it first:

- `Reconciliation.ran(result)`: it took effect; the step succeeds with the
  result the hook can show, and the run goes on;
- `Reconciliation.did_not_run()`: it did not; the step ends interrupted, and
  the agent may ask for it again (through the policy, as any new request);
- `Reconciliation.unknown()` (or a hook that fails or overruns its tool's
  timeout): the pause, as without a hook.

Every verdict is recorded (`step_reconciled`, with the hook's note).  The
gate never executes the action again by itself.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio

from ..canonical import JSONBoundaryError, parse_json
from ..sanitize import sanitize
from ..tools import ToolResult

__all__ = ["Interrupted", "Reconciler", "Reconciliation", "Verdict", "ask_reconciler"]

_NOTE_CHARS = 500


class Verdict(enum.StrEnum):
    RAN = "ran"
    DID_NOT_RUN = "did_not_run"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class Interrupted:
    """The cut-off call the hook is asked about: exactly the recorded request."""

    run_id: str
    step: int
    tool: str
    args: str


@dataclass(frozen=True, slots=True)
class Reconciliation:
    """The hook's answer: whether the action took effect, what it can show, and why."""

    verdict: Verdict
    result: ToolResult | None = None
    note: str = ""

    @classmethod
    def ran(cls, result: ToolResult, note: str = "") -> Reconciliation:
        return cls(Verdict.RAN, result, note)

    @classmethod
    def did_not_run(cls, note: str = "") -> Reconciliation:
        return cls(Verdict.DID_NOT_RUN, None, note)

    @classmethod
    def unknown(cls, note: str = "") -> Reconciliation:
        return cls(Verdict.UNKNOWN, None, note)


Reconciler = Callable[[Interrupted], Awaitable[Reconciliation]]


async def ask_reconciler(
    reconciler: Reconciler, interrupted: Interrupted, limit: float
) -> Reconciliation:
    """The hook's verdict within `limit` seconds; anything unusable is `unknown`, saying why."""
    try:
        with anyio.fail_after(limit):
            answer = await reconciler(interrupted)
    except TimeoutError:
        return Reconciliation.unknown(f"the reconcile hook did not answer within {limit:g}s")
    except Exception as exc:
        text = sanitize(str(exc) or type(exc).__name__)[:_NOTE_CHARS]
        return Reconciliation.unknown(f"the reconcile hook failed: {text}")
    if not isinstance(answer, Reconciliation) or not isinstance(answer.verdict, Verdict):
        return Reconciliation.unknown("the reconcile hook answered something other than a verdict")
    note = sanitize(answer.note)[:_NOTE_CHARS]
    if answer.verdict is Verdict.RAN:
        result = answer.result
        if not isinstance(result, ToolResult) or not isinstance(result.content, str):
            return Reconciliation.unknown("the reconcile hook said it ran but showed no result")
        try:
            parse_json(result.content)
        except JSONBoundaryError as exc:
            return Reconciliation.unknown(
                f"the reconcile hook's result is not valid JSON: {sanitize(str(exc))}"
            )
        return Reconciliation(Verdict.RAN, result, note)
    return Reconciliation(answer.verdict, None, note)
