"""Standing grants in the proxy: a call a person's grant covers runs without asking again.

Consulted only when the configuration has `"standing_grants"` (the operator's
maximum, recorded for the session at start-up so the command can hold a grant
to it) and only for a new call's first decision that asks a person: never on
resume (the approved call runs under its own approval), never for an
`unknown_outcome` decision, never for a `destructive` tool the configuration did
not open to grants.  The grant's call is spent in the transaction that records
the step (`PolicyDecision.claim` → `ledger.use_standing_grant`), so a call is
let through only if its grant still had a call and time left when it was recorded.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping
from typing import Any

from ..policy import Outcome, PolicyDecision, RunView, ToolRequest
from ..sanitize import sanitize
from ..store import (
    Connection,
    GrantLimits,
    Principal,
    StandingGrant,
    Store,
    ledger,
    live_standing_grants,
    set_grant_limits,
)
from ..tools import SideEffect
from ._conditions import ConditionError, ToolConditions, compile_when

__all__ = ["GrantCover"]


class GrantCover:
    """The standing grants of one proxy session, applied to the decisions that ask a person."""

    def __init__(
        self, store: Store, session: str, limits: GrantLimits, servers: Mapping[str, str]
    ) -> None:
        self.store = store
        self.session = session
        self.limits = limits
        # The server of each final tool name, for a condition's `server`.
        self.servers = dict(servers)
        self._compiled: dict[str, ToolConditions] = {}
        # Over HTTP with "principals": a grant covers only its own principal's calls.
        # Without, no call has one, and nothing more is read (the goldens pin the reads).
        self.per_principal = False

    def record_limits(self) -> None:
        """Write the operator's maximum for this session, which the command holds grants to."""
        set_grant_limits(self.store, self.session, self.limits, time.time())

    async def cover(
        self, request: ToolRequest, run: RunView, decided: PolicyDecision
    ) -> PolicyDecision:
        """`decided`, or an `allow` spending a call of the first live grant that covers it."""
        if (
            decided.outcome is not Outcome.REQUIRE_APPROVAL
            or decided.kind == "unknown_outcome"
            or run.step_count != 0  # a resume or a take-over: its approval decides it
            or run.metadata.get("proxy_session") != self.session
            or (request.spec.side_effect is SideEffect.DESTRUCTIVE and not self.limits.destructive)
        ):
            return decided
        tool = request.spec.name
        grants = await self.store.run(live_standing_grants, self.store, self.session, tool)
        now = await self.store.run(self.store.clock)
        for grant in grants:
            if grant.expires_at <= now:
                await self.store.write(self._expire, grant)
                continue
            if self.per_principal and not await self._same_principal(grant, run.principal):
                continue  # another person's yes is not this person's (issue 35)
            if grant.condition is not None and not await self._holds(grant, request):
                continue
            claim = functools.partial(self._use, grant.grant_id, tool)
            return PolicyDecision.allow(f"standing grant {grant.grant_id} covers it", claim=claim)
        return decided

    async def _same_principal(self, grant: StandingGrant, asking: Principal | None) -> bool:
        """Whether the call is by the principal whose call the grant was given on (both
        without one, as over stdio, counts as the same)."""
        owner = await self.store.run(self.store.principal_of_run, grant.run_id)
        if owner is None or asking is None:
            return owner is None and asking is None
        return (owner.issuer, owner.subject) == (asking.issuer, asking.subject)

    def _expire(self, connection: Connection, grant: StandingGrant) -> None:
        ledger.expire_standing_grant(self.store, connection, grant.grant_id, grant.run_id)

    def _use(
        self, grant_id: str, tool: str, connection: Connection, run_id: str, step: int
    ) -> None:
        ledger.use_standing_grant(self.store, connection, grant_id, run_id, step, tool)

    async def _holds(self, grant: StandingGrant, request: ToolRequest) -> bool:
        """Whether the grant's condition holds for the call; an error never lets a call through."""
        assert grant.condition is not None
        conditions = self._compiled.get(grant.grant_id)
        if conditions is None:
            try:
                compiled = compile_when(
                    [{"if": grant.condition, "outcome": "allow"}],
                    f"standing grant {sanitize(grant.grant_id)}",
                )
            except ConditionError:
                return False  # checked when given: a row changed since is not trusted
            conditions = ToolConditions(
                self.servers.get(request.spec.name, ""),
                request.spec.name,
                request.spec.side_effect,
                compiled,
            )
            self._compiled[grant.grant_id] = conditions
        arguments: Any = request.arguments
        verdict = await conditions.decide(arguments)
        return verdict is not None and not verdict.error and verdict.outcome is Outcome.ALLOW
