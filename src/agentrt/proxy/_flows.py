"""Information-flow labels: what a host session has received, and the rules across servers.

A server (or one tool's rule) carries labels the operator chose: `private`
(its results hold the operator's data), `untrusted` (its results may hold
text an outsider chose), `egress` (it can send data off the machine), or a
name the operator declared once at the top of the configuration.  The
proxy keeps, per host session, the set of labels whose calls that session
has run (its *taint*), in a table of its own (`flow_taint`, a store
extension), and the flow rules of the policy (`"flows"`) judge a call by
that taint and the call's own labels.  A flow rule can only make a decision
stricter; the model has no way to clear a taint (only the operator's
`agentrt taint clear` or the inbox's button, recorded in the chain).

A session is tainted when a labelled call is allowed to run, before it runs:
a call whose arguments could carry the labelled result is therefore always
decided after the taint is in place, and a crash between the server's answer
and its record cannot lose it (docs/flows.md; decision 0032).
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from ..canonical import canonical_json, sha256_hex
from ..policy import Outcome, PolicyDecision, RunView, ToolRequest, default_presentation
from ..sanitize import sanitize

if TYPE_CHECKING:
    # The store is imported when a session is first tainted, not with the configuration
    # that names the labels (which the proxy reads before it spawns its servers).
    from ..store import Connection, Store

__all__ = [
    "HOST_SESSION",
    "LABELS",
    "MIGRATIONS",
    "FlowJudge",
    "FlowRule",
    "Flows",
    "TaintStore",
    "Tainting",
    "declared_labels",
    "flow_rules",
    "flows_policy_id",
    "host_session_of",
    "label_list",
    "new_stdio_session",
    "session_key",
    "stricter",
]

HOST_SESSION: Final = "host_session"
"""The run metadata key naming the host session a call came from (only when labels are used)."""

LABELS: Final[Mapping[str, str]] = {
    "private": "its results hold the operator's data",
    "untrusted": "its results may hold text an outsider chose",
    "egress": "it can send data off the machine or to other people",
}
"""The built-in vocabulary; the operator may declare more at the top of proxy.json."""

_LABEL_NAME: Final = re.compile(r"^[a-z][a-z0-9_-]{0,31}\Z")
_SESSION_KEY: Final = re.compile(r"^[A-Za-z0-9_.-]{1,128}\Z")
_FLOW_FIELDS: Final = frozenset({"after", "call", "outcome"})
_STRICTNESS: Final = {Outcome.ALLOW: 0, Outcome.REQUIRE_APPROVAL: 1, Outcome.DENY: 2}
_FLOW_OUTCOMES: Final = {"require_approval": Outcome.REQUIRE_APPROVAL, "deny": Outcome.DENY}
# The earlier calls a held call's reason names, at most.
_NAMED_CALLS: Final = 8

MIGRATIONS: Final[Sequence[str]] = (
    """
    CREATE TABLE flow_taint (
        host_session TEXT NOT NULL,
        label TEXT NOT NULL,
        run_id TEXT NOT NULL,
        tool TEXT NOT NULL,
        tainted_at TEXT NOT NULL,
        PRIMARY KEY (host_session, label)
    );
    """,
)

Fail = Callable[[str, str], Exception]


@dataclass(frozen=True, slots=True)
class FlowRule:
    """`{"after": [...], "call": LABEL, "outcome": ...}`: a call carrying `call`, in a session
    whose taint holds every label of `after`, is decided `outcome` (or stricter)."""

    after: tuple[str, ...]
    call: str
    outcome: Outcome

    def to_json(self) -> dict[str, Any]:
        return {"after": list(self.after), "call": self.call, "outcome": str(self.outcome)}

    def text(self) -> str:
        return f"{self.call} after {', '.join(self.after)}"


@dataclass(frozen=True, slots=True)
class Flows:
    """The configuration's labels (every known name → meaning) and flow rules."""

    labels: Mapping[str, str] = dataclasses.field(default_factory=lambda: dict(LABELS))
    rules: tuple[FlowRule, ...] = ()
    # The host session every stateless (2026-07-28) HTTP host's calls are kept under.
    stateless_session: str = "stateless"


@dataclass(frozen=True, slots=True)
class Tainting:
    """One label a host session holds, and the first call that gave it (tool and time)."""

    label: str
    tool: str
    at: str
    run_id: str


# -- reading the configuration --------------------------------------------------


def declared_labels(raw: Any, fail: Fail) -> dict[str, str]:
    """The built-in labels and the operator's own from `"labels": {"NAME": "meaning"}`."""
    if not isinstance(raw, dict):
        raise fail("labels", 'must be an object of label name to what it means, {"NAME": "..."}')
    known = dict(LABELS)
    for name, meaning in raw.items():
        where = f"labels.{sanitize(name)}"
        if name in LABELS:
            raise fail(where, "is a built-in label; declare only your own names")
        if not _LABEL_NAME.match(name):
            raise fail(where, "must be 1 to 32 lowercase letters, digits, '_' or '-'")
        if not isinstance(meaning, str) or not meaning.strip():
            raise fail(where, "must say in words what the label means")
        known[name] = meaning
    return known


def label_list(raw: Any, known: Mapping[str, str], where: str, fail: Fail) -> tuple[str, ...]:
    """A `"labels"` list on a server or a rule: every name known, none twice."""
    if not isinstance(raw, list) or not all(isinstance(item, str) for item in raw):
        raise fail(where, "must be a list of label names")
    for name in raw:
        if name not in known:
            raise fail(
                where,
                f'names the label "{sanitize(name)}", which is neither built in '
                "(private, untrusted, egress) nor declared in the top-level labels",
            )
    if len(set(raw)) != len(raw):
        raise fail(where, "names a label twice")
    return tuple(raw)


def flow_rules(raw: Any, known: Mapping[str, str], fail: Fail) -> tuple[FlowRule, ...]:
    """`"policy": {"flows": [...]}`: each rule checked; one that would loosen is refused."""
    if not isinstance(raw, list):
        raise fail("policy.flows", "must be a list of flow rules")
    rules = []
    for position, entry in enumerate(raw):
        where = f"policy.flows[{position}]"
        if not isinstance(entry, dict):
            raise fail(where, "must be an object with after, call and outcome")
        for name in entry:
            if name not in _FLOW_FIELDS:
                raise fail(f"{where}.{sanitize(name)}", "is not a field this file may have")
        for required in ("after", "call", "outcome"):
            if required not in entry:
                raise fail(f"{where}.{required}", "is required")
        after = label_list(entry["after"], known, f"{where}.after", fail)
        if not after:
            raise fail(f"{where}.after", "must name at least one label")
        call = entry["call"]
        if not isinstance(call, str):
            raise fail(f"{where}.call", "must be one label name")
        label_list([call], known, f"{where}.call", fail)
        outcome = entry["outcome"]
        if outcome == "allow":
            raise fail(
                f"{where}.outcome",
                'is "allow", which would loosen a decision; a flow rule can only make one '
                "stricter (require_approval or deny)",
            )
        if not isinstance(outcome, str) or outcome not in _FLOW_OUTCOMES:
            raise fail(f"{where}.outcome", "must be require_approval or deny")
        rules.append(FlowRule(after, call, _FLOW_OUTCOMES[outcome]))
    return tuple(rules)


def session_key(raw: Any, fail: Fail) -> str:
    if not isinstance(raw, str) or not _SESSION_KEY.match(raw):
        raise fail("stateless_session", "must be 1 to 128 letters, digits, '.', '_' or '-'")
    return raw


# -- which host session a call came from ---------------------------------------


def new_stdio_session() -> str:
    """The host session of one stdio proxy process: the host that started it."""
    return f"stdio-{secrets.token_hex(4)}"


def host_session_of(headers: Any, stdio_session: str, stateless_session: str) -> str:
    """The host session of a request: stdio's, the MCP session's, or the operator's key.

    An MCP session id is never shown as it is (whoever knows it may post into that
    session); its hash names the session instead.
    """
    if headers is None:
        return stdio_session
    session_id = headers.get("mcp-session-id")
    if not session_id:
        return stateless_session
    digest = hashlib.sha256(str(session_id).encode("utf-8", "surrogatepass")).hexdigest()
    return f"http-{digest[:16]}"


# -- the taint table -------------------------------------------------------------


class TaintStore:
    """The labels each host session holds, in the store (extension `flows`).

    Every method is blocking store work: async code calls it through `store.run`.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self._ready = False
        if not store.read_only:
            store.migrate_extension("flows", MIGRATIONS)

    def _exists(self) -> bool:
        # A database no labelled proxy ever used (opened read-only by a command) has no table.
        if not self._ready:
            self._ready = self.store.extension_version("flows") > 0
        return self._ready

    def read(self, host_session: str) -> tuple[Tainting, ...]:
        if not self._exists():
            return ()
        rows = self.store.query(
            "SELECT label, tool, tainted_at, run_id FROM flow_taint"
            " WHERE host_session = ? ORDER BY tainted_at, label",
            (host_session,),
        )
        return tuple(Tainting(row[0], row[1], row[2], row[3]) for row in rows)

    def add(self, host_session: str, labels: Sequence[str], run_id: str, tool: str) -> None:
        """Taint `host_session` with `labels` (a label it holds keeps its first call)."""
        from ..store import utc_now

        with self.store.transaction() as connection:
            now = utc_now()
            for label in labels:
                connection.execute(
                    "INSERT INTO flow_taint (host_session, label, run_id, tool, tainted_at)"
                    " VALUES (?, ?, ?, ?, ?) ON CONFLICT (host_session, label) DO NOTHING",
                    (host_session, label, run_id, tool, now),
                )

    def clear(self, host_session: str, by: str, note: str = "") -> tuple[str, ...]:
        """Clear a session's taint and record it in the chain, in one transaction; the
        labels it held (none: nothing is written)."""
        with self.store.transaction() as connection:
            labels = self._labels(connection, host_session)
            if labels:
                connection.execute("DELETE FROM flow_taint WHERE host_session = ?", (host_session,))
                from ..store import ledger

                ledger.clear_taint(self.store, connection, host_session, labels, by, note)
        return labels

    def sessions(self) -> dict[str, tuple[Tainting, ...]]:
        """Every tainted host session and what it holds."""
        if not self._exists():
            return {}
        rows = self.store.query(
            "SELECT host_session, label, tool, tainted_at, run_id FROM flow_taint"
            " ORDER BY host_session, tainted_at, label"
        )
        found: dict[str, list[Tainting]] = {}
        for row in rows:
            found.setdefault(row[0], []).append(Tainting(row[1], row[2], row[3], row[4]))
        return {session: tuple(held) for session, held in found.items()}

    @staticmethod
    def _labels(connection: Connection, host_session: str) -> tuple[str, ...]:
        rows = connection.execute(
            "SELECT label FROM flow_taint WHERE host_session = ? ORDER BY label",
            (host_session,),
        ).fetchall()
        return tuple(row[0] for row in rows)


# -- judging a call ----------------------------------------------------------------


def flows_policy_id(base: str, flows: Flows, tool_labels: Mapping[str, tuple[str, ...]]) -> str:
    """The policy's identity with its labels and flow rules in it."""
    document = {
        "base": base,
        "flows": [rule.to_json() for rule in flows.rules],
        "labels": {tool: list(labels) for tool, labels in sorted(tool_labels.items())},
        "vocabulary": dict(sorted(flows.labels.items())),
    }
    return sha256_hex(canonical_json(document).encode("utf-8"))


def stricter(first: Outcome, second: Outcome) -> Outcome:
    """The stricter of two outcomes (abort counts as the strictest)."""
    if Outcome.ABORT in (first, second):
        return Outcome.ABORT
    return first if _STRICTNESS[first] >= _STRICTNESS[second] else second


class FlowJudge:
    """The flow rules over one proxy's labelled tools, reading and adding taint."""

    def __init__(
        self,
        flows: Flows,
        tool_labels: Mapping[str, tuple[str, ...]],
        taint: TaintStore,
        *,
        replaying: bool = False,
    ) -> None:
        self.flows = flows
        self.tool_labels = dict(tool_labels)
        self.taint = taint
        # `agentrt recheck`: the taint each decision was judged under is the recorded one,
        # handed over by `remember`; nothing is read from the table, nothing added.
        self.replaying = replaying
        self._recorded: dict[tuple[str, int], tuple[Tainting, ...]] = {}

    def labels_of(self, tool: str) -> tuple[str, ...]:
        return self.tool_labels.get(tool, ())

    def may_hold(self, tool: str) -> bool:
        """Whether a flow rule could hold a call to `tool` (it carries a rule's `call`), so
        the proxy's cap on waiting approvals counts it."""
        labels = self.labels_of(tool)
        return any(rule.call in labels for rule in self.flows.rules)

    def remember(self, run_id: str, step: int, payload: Mapping[str, Any]) -> None:
        """The taint a recorded decision was judged under (its `flow` record), for recheck."""
        flow = payload.get("flow")
        if not isinstance(flow, Mapping):
            return
        held = flow.get("tainted_by")
        if not isinstance(held, list):
            return
        self._recorded[(run_id, step)] = tuple(
            Tainting(str(item.get("label")), str(item.get("tool")), str(item.get("at")), "")
            for item in held
            if isinstance(item, Mapping)
        )

    async def taint_of(self, request: ToolRequest, run: RunView) -> tuple[Tainting, ...] | None:
        """The session's taint for this decision; None for a run no host session names."""
        session = run.metadata.get(HOST_SESSION)
        if session is None:
            return None
        if self.replaying:
            return self._recorded.get((request.run_id, request.step), ())
        return await self.taint.store.run(self.taint.read, session)

    async def judge(
        self,
        request: ToolRequest,
        run: RunView,
        decided: PolicyDecision,
        held: tuple[Tainting, ...],
    ) -> PolicyDecision:
        """`decided` made stricter by the first flow rule that matches, with the taint it was
        judged under recorded; a call allowed to run taints its session first."""
        session = run.metadata[HOST_SESSION]
        labels = self.labels_of(request.spec.name)
        holding = {tainting.label for tainting in held}
        rule = next(
            (
                rule
                for rule in self.flows.rules
                if rule.call in labels and holding.issuperset(rule.after)
            ),
            None,
        )
        record: dict[str, Any] = {
            "session": session,
            "taint": sorted(holding),
            "labels": list(labels),
        }
        if held:
            # Each label's first call (tool and time): what recheck replays new rules under.
            record["tainted_by"] = [{"label": t.label, "tool": t.tool, "at": t.at} for t in held]
        if rule is not None:
            record["rule"] = rule.to_json()
            if stricter(rule.outcome, decided.outcome) is not decided.outcome:
                decided = _held_by_flow(request, rule, held, session)
        # On a resume the step was counted when it was first decided: a yes now runs it.
        resuming = run.step_count >= request.step
        runs = decided.outcome is Outcome.ALLOW or (
            resuming and decided.outcome is Outcome.REQUIRE_APPROVAL
        )
        adds = sorted(set(labels) - holding)
        if runs and labels and not self.replaying:
            await self.taint.store.run(
                self.taint.add, session, labels, request.run_id, request.spec.name
            )
        if runs and adds:
            record["adds"] = adds
        return dataclasses.replace(decided, record={"flow": record})


def _held_by_flow(
    request: ToolRequest, rule: FlowRule, held: tuple[Tainting, ...], session: str
) -> PolicyDecision:
    """A flow rule's decision: the reason names the session and the earlier calls that
    tainted it (tool and time, never content), for the operator's approval view."""
    if rule.outcome is Outcome.DENY:
        # The model reads a denial's reason: the rule only, the calls are in the record.
        return PolicyDecision.deny(f"the flow rule {rule.text()} denies it in this session")
    earlier = [tainting for tainting in held if tainting.label in rule.after][:_NAMED_CALLS]
    calls = "; ".join(
        f"{sanitize(t.label)} from {sanitize(t.tool)} at {sanitize(t.at)}" for t in earlier
    )
    reason = (
        f"host session {sanitize(session)} already received {calls}; the flow rule "
        f"{rule.text()} applies to {sanitize(request.spec.name)}"
    )
    return PolicyDecision.require_approval(
        kind=f"flow:{rule.call}",
        # Stable across a resume (the taint may grow meanwhile): the rule, not the calls.
        capability={
            "tool": request.spec.name,
            "side_effect": str(request.spec.side_effect),
            "flow": rule.to_json(),
        },
        presentation=default_presentation(request),
        reason=reason,
    )
