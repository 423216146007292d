"""The gate's values: its limits, what one operation left behind, and the inputs
handed between its rooms."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from ..agent import Observation
from ..store import ApprovalRecord, Connection, Principal, RunRecord, RunStatus, StepRecord
from ..tools import CheckedTool

__all__ = ["INTERRUPTED_SIDE_EFFECT", "Limits", "StepOutcome"]

INTERRUPTED_SIDE_EFFECT: Final = "interrupted_side_effect"
MAX_ERROR_CHARS: Final = 2_000

OnEnd = Callable[[Connection, RunStatus], None]
"""Called in the transaction that records a call's result, with the run's status after it."""


@dataclass(frozen=True, slots=True)
class Limits:
    """Run limits, checked before the next action starts.  Durations in seconds; None is off."""

    max_steps: int = 50
    max_consecutive_failures: int = 3
    loop_window: int = 3
    deadline: float | None = None
    approval_ttl: float | None = None
    grant_ttl: float | None = None


@dataclass(frozen=True, slots=True)
class StepOutcome:
    """What one gate operation left behind."""

    run_id: str
    status: RunStatus
    observation: Observation | None = None
    approval: ApprovalRecord | None = None
    result: str | None = None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class RunSnapshot:
    """A run as a transaction of this gate read it: the row and its last steps."""

    run: RunRecord
    recent: tuple[StepRecord, ...]


class StaleSnapshot(Exception):
    """A step was decided on a snapshot of its run that another writer has since moved."""


@dataclass(frozen=True, slots=True)
class NewRun:
    """A run about to be inserted."""

    run_id: str
    goal: str
    created: str
    metadata: dict[str, str]
    deadline_at: float | None
    # Who the run is for (issue 35); recorded in `run_started` only when set.
    principal: Principal | None = None


@dataclass(frozen=True, slots=True)
class Call:
    """One call of a tool the gate is about to make, under the lease acquisition `token`
    that recorded its `executing` mark (only it may record the result).

    `recent` is the run's last steps before this one, as the step was decided on
    them, or None when unknown; `on_end` is the caller's hook in the result's
    transaction (`Gate.start_and_step`); `context` is the caller's, handed to the
    tool on its `ToolCall` unread; `scope`, that of the scoped write that recorded the
    step, records the result in one too (`Store.write_scoped`)."""

    run_id: str
    step: int
    tool: CheckedTool
    args: str
    token: str
    on_end: OnEnd | None = None
    recent: tuple[StepRecord, ...] | None = None
    context: object | None = None
    scope: tuple[str, str, str] | None = None


def owner_label() -> str:
    """This process's name on the leases it takes: `host:pid:random`."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def error_text(exc: BaseException) -> str:
    """An exception as an observation's text, bounded."""
    text = str(exc) or type(exc).__name__
    if len(text) > MAX_ERROR_CHARS:
        text = text[:MAX_ERROR_CHARS] + "…"
    return text
