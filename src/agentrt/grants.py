"""Standing grants: a person's "yes, for a while" given with an approval.

A grant is asked for with a decision (`approvals.approve(..., grant=GrantRequest(...))`):
the approved call runs under its approval, and the grant then lets the same
proxy session's later calls of the same tool through without asking, until its
time runs out, for at most its number of calls, and only for arguments its CEL
condition (the rules' `when` language) accepts.  It is refused, with nothing
written, when it is wider than the operator's maximum (the proxy's
`"standing_grants"`), covers a `destructive` tool the operator did not open to
grants, is asked on an `unknown_outcome` or `interrupted_side_effect` decision,
or its condition does not compile.  What it covers is hashed (`GrantScope`), shown
to the person before it is given, and given only against that hash.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Final

from .canonical import canonical_bytes, sha256_hex
from .errors import ApprovalError
from .sanitize import sanitize
from .store import (
    ApprovalRecord,
    GrantLimits,
    GrantStatus,
    StandingGrant,
    Store,
    grant_limits,
    ledger,
    list_standing_grants,
    standing_grant,
)

__all__ = [
    "GrantLimits",
    "GrantRefused",
    "GrantRequest",
    "GrantScope",
    "GrantStatus",
    "StandingGrant",
    "grant_scope",
    "list_grants",
    "revoke",
]

# Decisions a grant never stands in for: a person must look at each one.
_NEVER_GRANTED: Final = frozenset({"unknown_outcome", "interrupted_side_effect"})
_MAX_CONDITION_CHARS: Final = 2000


class GrantRefused(ApprovalError):
    """A standing grant that may not be given as asked; nothing was decided."""


@dataclass(frozen=True, slots=True)
class GrantRequest:
    """What a person asks to grant with an approval: for how long (`seconds`; None: the
    operator's maximum), how many calls (`calls`; None: the operator's maximum count, or
    no count), only where CEL `when` holds; `scope_hash` is the hash of the scope they
    were shown (`GrantScope.scope_hash`), which the grant must still have."""

    seconds: float | None = None
    calls: int | None = None
    when: str | None = None
    scope_hash: str | None = None


@dataclass(frozen=True, slots=True)
class GrantScope:
    """What a grant covers, as shown to the person before it is given, and its hash."""

    session: str
    tool: str
    seconds: float
    calls: int | None
    when: str | None
    scope: dict[str, Any]
    scope_hash: str

    def lines(self) -> list[str]:
        """The scope as the command prints it."""
        count = "any number of calls" if self.calls is None else f"the next {self.calls} call(s)"
        lines = [
            f"standing grant: {sanitize(self.tool)} in session {sanitize(self.session)}, "
            f"{count}, for {_duration_text(self.seconds)}",
        ]
        if self.when is not None:
            lines.append(f"  only when: {sanitize(self.when)}")
        lines.append(f"  grant scope hash: {self.scope_hash}")
        return lines

    def to_new(self) -> ledger.NewStandingGrant:
        return ledger.NewStandingGrant(
            session=self.session,
            tool=self.tool,
            condition=self.when,
            calls=self.calls,
            seconds=self.seconds,
            scope=self.scope,
            scope_hash=self.scope_hash,
        )


def _duration_text(seconds: float) -> str:
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{int(seconds // 3600)}h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{int(seconds // 60)}m"
    return f"{seconds:g}s"


def check_condition(when: str) -> None:
    """Refuse (`GrantRefused`) a condition that does not compile as a rule's `when` would."""
    if not when.strip() or len(when) > _MAX_CONDITION_CHARS:
        raise GrantRefused(
            f"a grant's condition must be a CEL expression of 1 to {_MAX_CONDITION_CHARS} "
            "characters"
        )
    # The rules' own compiler (cel-python, CEL's operators typed strictly), imported only
    # when a condition is asked for: the core stays light to import.
    from .proxy._conditions import ConditionError, compile_when

    try:
        compile_when([{"if": when, "outcome": "allow"}], "the grant's condition")
    except ConditionError as exc:
        raise GrantRefused(str(exc)) from None


def grant_scope(store: Store, approval: ApprovalRecord, request: GrantRequest) -> GrantScope:
    """The scope a grant asked with `approval` would have, checked against the operator's
    maximum; `GrantRefused` says in one sentence why it may not be given."""
    approval_id = sanitize(approval.approval_id)
    if approval.kind in _NEVER_GRANTED:
        raise GrantRefused(
            f"approval {approval_id} is an {approval.kind} decision, which a standing grant "
            "never covers: decide it on its own"
        )
    run = store.get_run(approval.run_id)
    session = (run.metadata or {}).get("proxy_session")
    if not session:
        raise GrantRefused(
            f"run {sanitize(approval.run_id)} is not a call through agentrt proxy; standing "
            "grants cover a proxy session's calls"
        )
    limits = grant_limits(store, session)
    if limits is None:
        raise GrantRefused(
            f"the proxy of session {sanitize(session)} allows no standing grants (its "
            'configuration has no "standing_grants" maximum)'
        )
    capability = approval.capability if isinstance(approval.capability, dict) else {}
    if capability.get("side_effect") == "destructive" and not limits.destructive:
        raise GrantRefused(
            f"{sanitize(approval.tool)} is a destructive tool, which standing grants do not "
            'cover unless the configuration\'s "standing_grants" says "destructive": true'
        )
    seconds = limits.max_seconds if request.seconds is None else request.seconds
    if not math.isfinite(seconds) or seconds <= 0:
        raise GrantRefused("a grant must last a positive time")
    if seconds > limits.max_seconds:
        raise GrantRefused(
            f"a grant for {_duration_text(seconds)} is wider than the operator's maximum of "
            f"{_duration_text(limits.max_seconds)}"
        )
    calls = request.calls if request.calls is not None else limits.max_calls
    if calls is not None and calls < 1:
        raise GrantRefused("a grant must cover at least one call")
    if calls is not None and limits.max_calls is not None and calls > limits.max_calls:
        raise GrantRefused(
            f"a grant of {calls} calls is wider than the operator's maximum of "
            f"{limits.max_calls} calls"
        )
    if request.when is not None:
        check_condition(request.when)
    scope: dict[str, Any] = {
        "approval_id": approval.approval_id,
        "approval_hash": approval.approval_hash,
        "session": session,
        "tool": approval.tool,
        "seconds": seconds,
        "calls": calls,
        "when": request.when,
    }
    return GrantScope(
        session, approval.tool, seconds, calls, request.when, scope,
        sha256_hex(canonical_bytes(scope)),
    )  # fmt: skip


def list_grants(store: Store, *, include_ended: bool = False) -> list[StandingGrant]:
    """The standing grants in the database, newest first (the active ones, or all)."""
    return list_standing_grants(store, include_ended=include_ended)


def revoke(store: Store, grant_id: str, *, by: str = "") -> StandingGrant:
    """End a standing grant at once: the next call it would have covered asks a person."""
    found = standing_grant(store, grant_id)
    if found is None:
        raise GrantRefused(f"there is no standing grant {sanitize(grant_id)}")
    with store.transaction() as connection:
        if ledger.expire_standing_grant(store, connection, grant_id, found.run_id):
            ended: str | None = "expired"
        elif ledger.revoke_standing_grant(store, connection, grant_id, found.run_id, by=by):
            ended = None
        else:
            ended = str(found.status)
    if ended is not None:
        raise GrantRefused(f"standing grant {sanitize(grant_id)} already ended ({ended})")
    current = standing_grant(store, grant_id)
    assert current is not None
    return current


def grant_request_from(fields: Any, *, needs_hash: bool) -> GrantRequest:
    """A standing grant's fields as the inbox and the approver channel take them (`calls`,
    `for` as a duration such as 1h, `when`, `scope_hash`); `ValueError` says which is wrong."""
    if not isinstance(fields, dict):
        raise ValueError("a grant must be a JSON object")
    calls, duration = fields.get("calls"), fields.get("for")
    when, scope_hash = fields.get("when"), fields.get("scope_hash")
    if calls is not None and (isinstance(calls, bool) or not isinstance(calls, int) or calls < 1):
        raise ValueError("a grant's calls must be a whole number of at least 1")
    if duration is not None and not isinstance(duration, str):
        raise ValueError('a grant\'s "for" must be a duration such as 1h or 30m')
    if when is not None and not isinstance(when, str):
        raise ValueError("a grant's condition (when) must be text")
    if needs_hash and not isinstance(scope_hash, str):
        raise ValueError("a grant must name the scope_hash it was shown")
    if calls is None and duration is None and when is None:
        raise ValueError("a grant needs calls, for or when")
    from .mcp import parse_duration

    seconds = None if duration is None else parse_duration(duration)
    return GrantRequest(
        seconds=seconds,
        calls=calls,
        when=when or None,
        scope_hash=scope_hash if isinstance(scope_hash, str) else None,
    )
