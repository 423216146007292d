"""The gate: the one place where a tool request is recorded, checked, decided,
executed and recorded again.

A program with its own loop proposes each decision with `Gate.step`; the
`Driver` is that loop around an agent.  Every state change is a
compare-and-set inside the transaction that writes its event, so two
processes racing for one run cannot both act, and an operator's cancel
stops a live loop at its next write.

Store work runs in a worker thread (`Store.write` / `Store.run`): the loop
only awaits it, so a busy database never stops heartbeats.  A result is
recorded only under the lease acquisition that started its call (a
per-acquisition token, compared and set), and a result that cannot be
recorded raises `ResultNotRecorded` rather than being lost.

The rooms: `_stepping.py` (start, validate, ask the policy, execute, record),
`_resuming.py` (approvals, take-over, supersede), `_reconcile.py` (a consumer's
verdict on a cut-off action), `_leases.py` (this gate's
leases as one object), `_values.py` (limits, outcomes, the inputs handed between
rooms).  No room writes SQL: every write is a transition of `agentrt.store.ledger`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager

from ..agent import Observation
from ..errors import RegistrationError
from ..policy import DefaultPolicy, Policy
from ..store import Event, Store
from ..tools import CheckedTool, Tool, ToolSpec, check_tool
from ._leases import Leases
from ._reconcile import Interrupted, Reconciler, Reconciliation, Verdict
from ._resuming import Resuming
from ._values import INTERRUPTED_SIDE_EFFECT, Limits, RunSnapshot, StepOutcome, owner_label

__all__ = [
    "INTERRUPTED_SIDE_EFFECT",
    "Gate",
    "Interrupted",
    "Limits",
    "Reconciler",
    "Reconciliation",
    "StepOutcome",
    "Verdict",
]


class Gate(Resuming):
    """Record → validate → policy → execute → record, for a fixed set of tools."""

    def __init__(
        self,
        store: Store,
        tools: Iterable[Tool],
        *,
        policy: Policy | None = None,
        limits: Limits | None = None,
        observers: Sequence[Callable[[Event], object]] = (),
        owner: str | None = None,
        lease_ttl: float = 30.0,
        reconcile: Reconciler | None = None,
    ) -> None:
        self.store = store
        self.reconcile = reconcile
        self.policy = policy if policy is not None else DefaultPolicy()
        self.limits = limits if limits is not None else Limits()
        self.observers = tuple(observers)
        self.owner = owner or owner_label()
        if not lease_ttl > 0:
            raise ValueError("lease_ttl must be positive")
        self.lease_ttl = float(lease_ttl)
        self._leases = Leases(store, self.owner, self.lease_ttl)
        self._views: dict[str, RunSnapshot] = {}
        self._tools: dict[str, CheckedTool] = {}
        for tool in tools:
            registered = check_tool(tool)
            if registered.spec.name in self._tools:
                raise RegistrationError(f'tool name "{registered.spec.name}" is registered twice')
            self._tools[registered.spec.name] = registered

    @property
    def specs(self) -> list[ToolSpec]:
        """The specs the agent is shown, in registration order."""
        return [registered.spec for registered in self._tools.values()]

    def register(self, tool: Tool, *, replacing: bool = False) -> None:
        """Register one more tool while the gate serves (a server loaded late), or with
        `replacing` one in place of the tool of its name (its pin was taken again; calls
        in flight keep the one they began with); checked as at construction, and refused
        (`RegistrationError`) when its name is taken."""
        registered = check_tool(tool)
        if registered.spec.name in self._tools and not replacing:
            raise RegistrationError(f'tool name "{registered.spec.name}" is registered twice')
        self._tools[registered.spec.name] = registered

    def renew_lease(self, run_id: str) -> bool:
        """Extend this gate's lease on a run; False if it no longer holds it (blocking)."""
        return self._leases.renew(run_id)

    @asynccontextmanager
    async def lease(self, run_id: str) -> AsyncIterator[None]:
        """Hold the run's lease (renewed in the background) for a loop around it.

        On the way out the lease is released, so another process may resume
        the run at once rather than after the lease's time runs out.
        """
        async with self._leases.hold(run_id):
            yield

    def history(self, run_id: str) -> list[Observation]:
        """The observations of the run's steps so far, oldest first."""
        observations = []
        for step in self.store.list_steps(run_id, limit=1_000_000):
            if step.observation_kind is None:
                continue
            observations.append(
                Observation(
                    step.step, step.tool, step.args, step.observation_kind, step.content or ""
                )
            )
        return observations
