"""One host `tools/call` → one run through the gate, under the proxy's seven rules.

The rules, in order, for a call whose key matches earlier ones: collect a
waiting approval; `IN_PROGRESS` under a live hold; take over a run a dead
process left (a mutating step then pauses on `interrupted_side_effect`);
`REJECTED`/`EXPIRED` within the window; `DUPLICATE` for a mutating call that
already executed; `BLOCKED` while another mutating call to the tool has an
unknown outcome; otherwise a new run.  The index decides atomically; this
module carries the decision out through `Gate.step`/`Gate.resume`.

Once a call has been sent to its server, no failure of the gate or the
store (a full disk while recording, a lost lease, a locked database) is
answered "nothing ran": the answer is that the outcome is unknown, and the
index marks it so (retried in the background when the store refuses even
that), so other changing calls to the tool wait for a person.
"""

from __future__ import annotations

import dataclasses
import functools
import secrets
import shlex
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, Final

import anyio

from ..agent import Decision, Observation
from ..canonical import JSONBoundaryError, canonical_json
from ..errors import AgentrtError, RunStateError, StoreBusy
from ..gate import INTERRUPTED_SIDE_EFFECT, Gate, StepOutcome
from ..gate._preconditions import PRECONDITION_UNAVAILABLE, STALE
from ..mcp import CallContext
from ..mcp._errors import ServerToolError
from ..mcp._tool import ServerResult
from ..policy import (
    ClassPolicy,
    Outcome,
    PolicyDecision,
    RunView,
    ToolRequest,
    default_presentation,
)
from ..sanitize import sanitize
from ..store import (
    ApprovalRecord,
    ApprovalStatus,
    Connection,
    Principal,
    RunStatus,
    StepStatus,
    Store,
)
from ..telemetry import trace_context_metadata
from ..tools import SideEffect, Tool, ToolCall, ToolResult, ToolSpec
from ._answers import Answer
from ._conditions import ToolConditions, conditions_by_tool, policy_id, principal_fields
from ._flows import HOST_SESSION, FlowJudge, Tainting, TaintStore, flows_policy_id
from ._forward import Forwarded, forwardable
from ._grants import GrantCover
from ._index import EXECUTED, Action, CallIndex, CallRow, Settled, Verdict, call_key
from ._offers import resource_outcome, uri_of
from ._resource import principal_key
from .config import ProxyConfig

if TYPE_CHECKING:
    from ..passkeys import PasskeyMode
    from ._host_approval import HostAsk

__all__ = [
    "UNKNOWN_OUTCOME",
    "Calls",
    "ProxyPolicy",
    "WatchedTool",
    "proxy_policy",
]

UNKNOWN_OUTCOME: Final = "unknown_outcome"
_POLL_SECONDS: Final = 0.2
_PROGRESS_SECONDS: Final = 1.0

Progress = Callable[[float, str], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class _Call:
    """One host call being answered: its tool, canonical arguments, progress
    callback, the token that names this call's hold in the index, and the
    channels the server's progress, log lines and requests take back to the host
    (handed to every gate operation that may execute the tool)."""

    spec: ToolSpec
    args: str
    progress: Progress | None
    token: str
    trace: Mapping[str, str] = dataclasses.field(default_factory=dict)
    context: CallContext | None = None
    # The host session whose taint judges the call; None when no label is in use.
    host_session: str | None = None
    # Asks the host's user about the call's approval (`_host_approval.py`), when allowed.
    host_ask: HostAsk | None = None
    # Who asked (over HTTP with `"principals"`), and the call index's keyspace for them.
    principal: Principal | None = None
    index_session: str | None = None

    def decision(self) -> Decision:
        return Decision.tool_call(self.spec.name, self.args)

    def metadata(self, session: str, key: str) -> dict[str, str]:
        """The run's metadata: the host's W3C trace context (so the run's trace continues
        the host's), the proxy's session, the call's key, and its host session if any."""
        metadata = {**self.trace, "proxy_session": session, "call_key": key}
        if self.host_session is not None:
            metadata[HOST_SESSION] = self.host_session
        return metadata


def _mutating(spec: ToolSpec) -> bool:
    return spec.side_effect is not SideEffect.READ_ONLY


class WatchedTool:
    """An upstream tool that notes a call cut off before the server answered.

    The gate records a timeout or a lost connection as a tool error, like any
    other; the proxy must tell them apart, because only a call whose server
    answered has a known outcome.
    """

    def __init__(
        self,
        inner: Tool,
        cut_off: set[tuple[str, int]],
        sent: set[str],
        *,
        forwarded: dict[str, Forwarded] | None = None,
        max_result_bytes: int | None = None,
    ) -> None:
        self._inner = inner
        # Where the host's copy of each result waits for its answer, by run;
        # None (`"results": "flattened"`) forwards the recorded mapping instead.
        self._forwarded = forwarded
        self._max_result_bytes = max_result_bytes
        self._cut_off = cut_off
        # Runs whose request reached this tool: from here on, a failure
        # anywhere leaves an outcome nobody knows.
        self._sent = sent
        # A proxy run is one call: its result ends the run in the transaction
        # that records it, rather than in a commit of its own afterwards.
        self._spec = dataclasses.replace(inner.spec, terminal=True)

    @property
    def spec(self) -> ToolSpec:
        return self._spec

    async def call(self, call: ToolCall) -> ToolResult:
        self._sent.add(call.run_id)
        try:
            result = await self._inner.call(call)
        except anyio.get_cancelled_exc_class():
            self._cut_off.add((call.run_id, call.step))
            raise
        except ServerToolError as exc:
            if not exc.outcome_known:
                self._cut_off.add((call.run_id, call.step))
            raise
        except Exception:
            self._cut_off.add((call.run_id, call.step))
            raise
        if (
            self._forwarded is None
            or self._max_result_bytes is None
            or not isinstance(result, ServerResult)
        ):
            return result
        forwarded = forwardable(result.raw, self._max_result_bytes)
        self._forwarded[call.run_id] = forwarded
        # The record names exactly what the host is sent, so the two are tied.
        summary = (
            f"{result.summary}; {forwarded.summary()}" if result.summary else forwarded.summary()
        )
        return ToolResult(content=result.content, summary=summary)


class ProxyPolicy:
    """The operator's class policy, a rule's `outcome` over it for one tool, a rule's
    `fixed` values in what is approved, plus one rule of the proxy's own.

    A mutating call asked again in a run whose earlier attempt of it failed
    without a known outcome needs a person's decision, whatever its class: the
    first attempt may have taken effect.  The decision is computed from the
    stored steps alone, so re-evaluation on resume (in any process) gives the
    same answer and the approval's hash still matches.
    """

    def __init__(
        self,
        inner: ClassPolicy,
        store: Store,
        conditions: dict[str, ToolConditions] | None = None,
        identity: str | None = None,
        *,
        tool_outcomes: Mapping[str, Outcome] | None = None,
        fixed: Mapping[str, Mapping[str, str]] | None = None,
        flows: FlowJudge | None = None,
    ) -> None:
        self.inner = inner
        # A server's `resource_rules`, by the name of its resources/read gate tool
        # (set by the server once its offers are loaded).
        self.resource_rules: dict[str, tuple[tuple[str, Outcome], ...]] = {}
        self.store = store
        # The operator's "when" lists, by final tool name, decided before the class policy.
        self.conditions = conditions or {}
        # Read by the gate into every `policy_decided` event.
        self.id = identity
        # A rule's `outcome` overrides the class's for that one tool.
        self.tool_outcomes = dict(tool_outcomes or {})
        # A rule's `fixed` values (canonical JSON text) are part of what a person
        # approves: changing one asks again instead of letting an old yes do something new.
        self.fixed = {tool: dict(values) for tool, values in (fixed or {}).items()}
        # The session's standing grants, when the configuration allows them (`_grants.py`).
        self.grants: GrantCover | None = None

        # The flow rules and the taint they read, when any server or rule carries a label.
        self.flows = flows
        # Over HTTP with "principals": a run resumed without its principal at hand reads it.
        self.reads_principals = False

    def remember_decision(self, run_id: str, step: int, payload: Mapping[str, Any]) -> None:
        """`agentrt recheck`: the recorded decision of a step, whose taint its replay uses."""
        if self.flows is not None:
            self.flows.remember(run_id, step, payload)

    async def evaluate(self, request: ToolRequest, run: RunView) -> PolicyDecision:
        if _mutating(request.spec) and any(
            step.step < request.step
            and step.tool == request.spec.name
            and step.status is StepStatus.FAILED
            for step in await self.store.run(self.store.list_steps, request.run_id)
        ):
            presentation = default_presentation(request)
            presentation["warning"] = (
                "the first attempt's outcome is unknown: it timed out, lost its connection, "
                "or the server's answer could not be read; it may have taken effect. "
                "Approving runs the same request again."
            )
            return PolicyDecision.require_approval(
                kind=UNKNOWN_OUTCOME,
                capability={
                    "tool": request.spec.name,
                    "side_effect": str(request.spec.side_effect),
                },
                presentation=presentation,
                reason="a mutating call's outcome is unknown",
            )
        held = None if self.flows is None else await self.flows.taint_of(request, run)
        decision = await self._by_condition_rule_or_class(request, run, held)
        if held is not None:
            assert self.flows is not None
            # After the class policy and the conditions, and only ever stricter than them.
            decision = await self.flows.judge(request, run, decision, held)
        fixed = self.fixed.get(request.spec.name)
        if decision.outcome is Outcome.REQUIRE_APPROVAL and fixed:
            capability = dict(decision.capability or {})
            capability["fixed"] = dict(sorted(fixed.items()))
            decision = dataclasses.replace(decision, capability=capability)
        if self.grants is not None:
            decision = await self.grants.cover(request, run, decision)
        return decision

    async def _by_condition_rule_or_class(
        self, request: ToolRequest, run: RunView, held: tuple[Tainting, ...] | None = None
    ) -> PolicyDecision:
        conditions = self.conditions.get(request.spec.name)
        verdict = None
        if conditions is not None:
            session = {
                "id": run.metadata.get(HOST_SESSION, ""),
                "labels": sorted({tainting.label for tainting in held or ()}),
            }
            labels = list(self.flows.labels_of(request.spec.name)) if self.flows else []
            principal = run.principal
            if principal is None and self.reads_principals:
                # A resumed run: the same principal its first decision saw, so the
                # approval's hash is decided again on the same facts.
                principal = await self.store.run(self.store.principal_of_run, request.run_id)
            verdict = await conditions.decide(
                request.arguments, session=session, labels=labels,
                principal=principal_fields(principal),
            )  # fmt: skip
        if verdict is None:
            return await self._by_rule_or_class(request, run)
        # Decided in the class policy's own shape, so an approval a condition asks
        # for hashes (and re-evaluates on resume) like any other of its class.
        side_effect = request.spec.side_effect
        outcome = verdict.outcome
        if verdict.error and self.outcome_for(request.spec) is Outcome.DENY:
            # An error never loosens the class (or the tool's rule): where it denies, a
            # condition that cannot decide denies too (deny by default holds).
            outcome = Outcome.DENY
        decided = await ClassPolicy({side_effect: outcome}).evaluate(request, run)
        return dataclasses.replace(decided, reason=verdict.reason)

    async def _by_rule_or_class(self, request: ToolRequest, run: RunView) -> PolicyDecision:
        outcome = self.tool_outcomes.get(request.spec.name)
        uri_rules = self.resource_rules.get(request.spec.name)
        if uri_rules:
            arguments = request.arguments if isinstance(request.arguments, dict) else {}
            outcome = resource_outcome(uri_rules, uri_of(arguments))
        if outcome is None:
            return await self.inner.evaluate(request, run)
        name = request.spec.name
        if outcome is Outcome.ALLOW:
            return PolicyDecision.allow(f"the rule for {name} allows it")
        if outcome is Outcome.REQUIRE_APPROVAL:
            return PolicyDecision.require_approval(
                kind=f"tool:{request.spec.side_effect}",
                capability={"tool": name, "side_effect": str(request.spec.side_effect)},
                presentation=default_presentation(request),
                reason=f"the rule for {name} needs an operator's approval",
            )
        return PolicyDecision.deny(f"the rule for {name} denies it")

    def outcome_for(self, spec: ToolSpec) -> Outcome:
        ruled = self.tool_outcomes.get(spec.name)
        if ruled is not None:
            return ruled
        return self.inner.outcomes.get(spec.side_effect, Outcome.DENY)

    def may_need_approval(self, spec: ToolSpec) -> bool:
        """Whether a call to `spec` might wait for a person (a condition may always ask one)."""
        return (
            spec.name in self.conditions
            or self.outcome_for(spec) is Outcome.REQUIRE_APPROVAL
            or (self.flows is not None and self.flows.may_hold(spec.name))
        )


def proxy_policy(config: ProxyConfig, store: Store, *, replaying: bool = False) -> ProxyPolicy:
    """The proxy's policy for `config`: its class policy, its conditions, each rule's
    `outcome` and `fixed` values, its flow rules over the labels, and its identity
    (`replaying`: for recheck, judging flows under the recorded taint)."""
    tool_outcomes: dict[str, Outcome] = {}
    fixed: dict[str, dict[str, str]] = {}
    tool_labels: dict[str, tuple[str, ...]] = {}
    for upstream in config.servers:
        for tool, rule in upstream.rules.items():
            # The final name as `load` gives it: the rename, else `<server>_<tool>`.
            name = rule.rename if rule.rename is not None else f"{upstream.server.name}_{tool}"
            extra = upstream.tool_rules.get(tool)
            if extra is not None and extra.outcome is not None:
                tool_outcomes[name] = extra.outcome
            if rule.fixed:
                fixed[name] = dict(rule.fixed)
            labels = (*upstream.labels, *(extra.labels if extra is not None else ()))
            if labels:
                tool_labels[name] = tuple(dict.fromkeys(labels))
    identity = policy_id(config.policy, config.servers)
    flows = None
    if config.labelled:
        flows = FlowJudge(config.flows, tool_labels, TaintStore(store), replaying=replaying)
        # Only when labels are in use, so a policy without them keeps its identity.
        identity = flows_policy_id(identity, config.flows, tool_labels)
    return ProxyPolicy(
        config.policy,
        store,
        conditions_by_tool(config.servers),
        identity,
        tool_outcomes=tool_outcomes,
        fixed=fixed,
        flows=flows,
    )


class Calls:
    """Handles host calls for one gate, one index and one session."""

    def __init__(
        self,
        *,
        gate: Gate,
        index: CallIndex,
        policy: ProxyPolicy,
        cut_off: set[tuple[str, int]],
        sent: set[str],
        session: str,
        database: str,
        hold: float,
        repeat_window: float,
        max_pending: int,
        log: IO[str] | None = None,
        repeat_windows: Mapping[str, float] | None = None,
        forwarded: dict[str, Forwarded] | None = None,
        specs: dict[str, ToolSpec] | None = None,
        closing: anyio.Event | None = None,
    ) -> None:
        self.gate = gate
        self.store = gate.store
        self.index = index
        self.policy = policy
        self.cut_off = cut_off
        self.sent = sent
        self.session = session
        self.database = database
        self.hold = hold
        self.repeat_window = repeat_window
        # A rule's `repeat_window` for its tool; 0 turns DUPLICATE and REJECTED repeats off.
        self.repeat_windows = dict(repeat_windows or {})
        # The host's copy of each result, left here by `WatchedTool`, by run.
        self.forwarded = forwarded if forwarded is not None else {}
        self.max_pending = max_pending
        self.log = log if log is not None else sys.stderr
        # Set once the proxy takes no more calls (the proxy's own event, when it has one).
        self.closing = closing if closing is not None else anyio.Event()
        # The specs served by name: the proxy's own (`Proxy.specs`, which its listing reads),
        # so a tool admitted or retired while serving is one change for both.
        self._specs = specs if specs is not None else {spec.name: spec for spec in gate.specs}
        # A remote server's login check by tool name (`oauth_preflights`): why it waits, or None.
        self.logins: dict[str, Callable[[], Awaitable[str | None]]] = {}
        self._announced: set[str] = set()
        # Calls sent upstream whose unknown outcome the store refused to mark.
        self._unmarked: set[str] = set()
        self._unmarked_told: set[str] = set()
        # Calls (by run) that met a database another writer held past the store's
        # busy deadline: nothing more is written for them before they are answered
        # (their holds are left to lapse), so the host waits out that deadline once.
        self._stalled: set[str] = set()
        # Set when the proxy serves the inbox: its address (never the token)
        # joins each announcement, and `on_waiting` may notify the desktop.
        self.inbox_address: str | None = None
        self.on_waiting: Callable[[ApprovalRecord], None] | None = None
        # `"approval_auth": "passkey"`: an approved call runs only when approvers' passkeys
        # prove its approval (a row a shell wrote into the database proves nothing).
        self.passkeys: PasskeyMode | None = None

    def index_session(self, principal: Principal | None) -> str:
        """The call index's keyspace for `principal`'s calls: the session's own without one,
        one of their own with one (the session's name and a digest of issuer and subject)."""
        if principal is None:
            return self.session
        return f"{self.session}~{principal_key(principal)}"

    def new_run_id(self) -> str:
        return f"{self.session}.{secrets.token_hex(8)}"

    # -- the operator's line on stderr ----------------------------------------

    def announce(self, approval: ApprovalRecord) -> None:
        """One stderr line per approval that waits, with the exact commands to decide it."""
        if approval.approval_id in self._announced:
            return
        self._announced.add(approval.approval_id)
        database = _shell_quote(self.database)
        run = _shell_quote(approval.run_id)
        approval_id = _shell_quote(approval.approval_id)
        self.log.write(
            f"agentrt proxy: approval {approval.approval_id} ({approval.kind}) waits for "
            f"{approval.tool}: agentrt --db {database} approve {run} --approval {approval_id}"
            f"  |  agentrt --db {database} reject {run} --approval {approval_id} --note TEXT"
            + (f"  |  inbox: {self.inbox_address}" if self.inbox_address else "")
            + "\n"
        )
        self.log.flush()
        if self.on_waiting is not None:
            self.on_waiting(approval)

    # -- one call ------------------------------------------------------------

    async def handle(
        self,
        tool: str,
        arguments: Any,
        progress: Progress | None = None,
        meta: Mapping[str, Any] | None = None,
        *,
        context: CallContext | None = None,
        host_session: str | None = None,
        host_ask: HostAsk | None = None,
        principal: Principal | None = None,
    ) -> Answer:
        """Answer one `tools/call`; never raises for anything a host or server did.
        `context` carries the server's progress, log lines and requests back to the host;
        `host_session` names whose taint judges it (only when labels are in use); `host_ask`,
        when given, asks the host's user to decide a call that waits; `principal` is who
        asked (recorded on its run; its calls are judged apart from everyone else's)."""
        spec = self._specs.get(tool)
        if spec is None:
            return Answer.invalid(tool, "there is no tool with this name")
        if arguments is None:
            arguments = {}
        try:
            args = canonical_json(arguments)
        except (JSONBoundaryError, TypeError, ValueError, RecursionError) as exc:
            # The SDK's parser lets NaN and infinities (1e400) through; such
            # arguments have no canonical form, so there is no key and no run to record.
            self.log.write(
                f"agentrt proxy: a call to {sanitize(tool)} was refused before the gate: "
                f"its arguments are not JSON the gate accepts ({sanitize(str(exc))})\n"
            )
            self.log.flush()
            return Answer.invalid(tool, _unaccepted_arguments(exc))
        preflight = self.logins.get(tool)
        if preflight is not None:
            waiting = await preflight()
            if waiting is not None:
                return Answer.unavailable(f"{waiting}.")
        key = call_key(tool, args)
        mutating = _mutating(spec)
        may_need_approval = self.policy.may_need_approval(spec)
        call = _Call(
            spec, args, progress, secrets.token_hex(6), trace_context_metadata(meta), context,
            host_session, host_ask, principal, self.index_session(principal),
        )  # fmt: skip
        # What `decide` reads and writes: the scope of the writes that start the call's
        # run and record its result (decision 0065).
        scope = self.index.scope_of(
            call.index_session or self.index.session, key, tool, mutating, may_need_approval
        )
        for _attempt in range(3):
            run_id = self.new_run_id()
            decide = functools.partial(
                self.index.decide_in,
                run_id=run_id,
                key=key,
                tool=tool,
                mutating=mutating,
                repeat_window=self.repeat_windows.get(tool, self.repeat_window),
                may_need_approval=may_need_approval,
                max_pending=self.max_pending,
                token=call.token,
                session=call.index_session,
            )
            started = await self._start(run_id, key, call, decide, scope)
            if isinstance(started, Answer):
                return started
            verdict = started
            action, row = verdict.action, verdict.row
            if action is Action.NEW:
                assert row is not None
                answer = await self._holding(row, call, self._new_run(row, call))
                if answer is not None:
                    return answer
                continue  # another process started this row's run first; decide again
            if action is Action.COLLECT:
                assert row is not None and verdict.approval is not None
                answer = await self._collect(row, call, verdict.approval)
                if answer is not None:
                    return answer
                continue  # the approval moved on under us; decide again
            if action is Action.IN_PROGRESS:
                return Answer.in_progress(tool)
            if action is Action.TAKE_OVER:
                assert row is not None
                answer = await self._holding(row, call, self._take_over(row, call))
                return answer if answer is not None else Answer.in_progress(tool)
            if action is Action.REJECTED:
                note = verdict.approval.note if verdict.approval is not None else ""
                return Answer.rejected(tool, note)
            if action is Action.EXPIRED:
                return Answer.expired(tool)
            if action is Action.DUPLICATE:
                assert row is not None and row.settled_at is not None
                return Answer.duplicate(tool, row.settled_at, row.outcome == Settled.RESULT)
            if action is Action.BLOCKED:
                return Answer.blocked(tool)
            if action is Action.TOO_MANY_PENDING:
                return Answer.unavailable(
                    f"{self.max_pending} requests already wait for a person's decision, the "
                    "most this gate lets wait at once; this call was not taken."
                )
        return Answer.in_progress(tool)

    async def _start(
        self,
        run_id: str,
        key: str,
        call: _Call,
        decide: Callable[..., Verdict],
        scope: tuple[str, str, str],
    ) -> Answer | Verdict:
        """Decide the call and, if it is new, start its run and take its step in the
        decision's own commit (and, for a result, settle it in the result's): an
        allowed call then makes two writing commits.  Any other verdict comes back
        for `handle` to act on."""
        settled: list[bool] = []

        def admit(connection: Connection) -> tuple[bool, Verdict]:
            verdict = decide(connection)
            # A row left by a run that never started keeps its own id: that one
            # is begun the ordinary way, under the row's id.
            new = verdict.action is Action.NEW and verdict.row is not None
            return new and verdict.row is not None and verdict.row.run_id == run_id, verdict

        def on_end(connection: Connection, status: RunStatus) -> None:
            if status is RunStatus.COMPLETED:
                self.index.settle_in(connection, run_id, Settled.RESULT)
                settled.append(True)

        try:
            verdict, outcome = await self.gate.start_and_step(
                f"proxy call to {call.spec.name}",
                call.decision(),
                run_id=run_id,
                metadata=call.metadata(self.session, key),
                admit=admit,
                on_end=on_end,
                context=call.context,
                principal=call.principal,
                scope=scope,
            )
        except Exception as exc:
            try:
                return await self._failed(run_id, call, exc)
            finally:
                self.sent.discard(run_id)
                self.forwarded.pop(run_id, None)
                await self._release_quietly(run_id, call.token)
                self._stalled.discard(run_id)
        if outcome is None:
            return verdict
        assert verdict.row is not None
        answer = await self._holding(
            verdict.row,
            call,
            self._conclude(verdict.row, call, outcome, settled=bool(settled)),
            settled=bool(settled),
        )
        return answer if answer is not None else Answer.in_progress(call.spec.name)

    async def _holding(
        self, row: CallRow, call: _Call, work: Awaitable[Answer | None], *, settled: bool = False
    ) -> Answer | None:
        """Run `work` on a call this process holds; whatever happens, the hold ends with it
        (the heartbeat would otherwise keep a failed call IN_PROGRESS for ever).  A call
        `settled` by its result's commit had its hold cleared there, so it is only
        forgotten: a release would be a third transaction that changes nothing."""
        failed = False
        try:
            return await work
        except Exception as exc:
            # Anything the gate or the store raised, whatever its type: what
            # matters is whether the request had reached the server.
            failed = True
            return await self._failed(row.run_id, call, exc)
        finally:
            self.sent.discard(row.run_id)
            self.forwarded.pop(row.run_id, None)
            if settled and not failed:
                self.index.forget(row.run_id, call.token)
            else:
                await self._release_quietly(row.run_id, call.token)
            self._stalled.discard(row.run_id)

    async def _failed(self, run_id: str, call: _Call, exc: Exception) -> Answer:
        tool = call.spec.name
        if _stayed_busy(exc):
            self._stalled.add(run_id)
        if run_id not in self.sent:
            self._log(
                f"agentrt proxy: a call to {sanitize(tool)} (run {run_id}) failed before "
                f"it reached the server: {sanitize(str(exc))}"
            )
            return Answer.unavailable("the gate could not complete this call.")
        self._log(
            f"agentrt proxy: a call to {sanitize(tool)} (run {run_id}) reached the server "
            f"but its outcome could not be recorded: {sanitize(str(exc))}; it is treated as "
            "an unknown outcome"
        )
        if _mutating(call.spec):
            # Marked in the background: the store that just failed may keep
            # failing, and the host must not wait on it for its answer.
            self._unmarked.add(run_id)
        return Answer.unrecorded_outcome(tool)

    async def repair(self) -> None:
        """Mark the unknown outcomes the store refused to mark when they happened."""
        for run_id in sorted(self._unmarked):
            try:
                await self.store.run(self.index.mark_unknown_outcome, run_id)
            except Exception as exc:
                if run_id not in self._unmarked_told:
                    # Once per call: a full disk would otherwise write a line a second.
                    self._unmarked_told.add(run_id)
                    self._log(
                        f"agentrt proxy: run {run_id} is not yet marked as an unknown outcome "
                        f"(retrying): {sanitize(str(exc))}"
                    )
                return
            self._unmarked.discard(run_id)
            self._unmarked_told.discard(run_id)

    def _log(self, line: str) -> None:
        self.log.write(line + "\n")
        self.log.flush()

    async def _new_run(self, row: CallRow, call: _Call) -> Answer | None:
        """Start the row's run and take its step; None if another process started it."""
        try:
            await self.gate.start(
                f"proxy call to {call.spec.name}",
                run_id=row.run_id,
                metadata=call.metadata(self.session, row.call_key),
                principal=call.principal,
            )
        except RunStateError:
            return None
        outcome = await self.gate.step(row.run_id, call.decision(), context=call.context)
        return await self._conclude(row, call, outcome)

    async def _take_over(self, row: CallRow, call: _Call) -> Answer:
        try:
            outcome = await self.gate.resume(row.run_id, context=call.context)
        except RunStateError:
            await self._release_quietly(row.run_id, call.token)
            return Answer.in_progress(call.spec.name)
        if outcome.reason == "taken_over":
            # The dead process recorded the step's end but not the run's: finish from it.
            last = await self.store.run(self.store.last_steps, row.run_id, 1)
            kind = last[0].observation_kind if last else None
            if last and kind is not None:
                step = last[0]
                observation = Observation(step.step, step.tool, step.args, kind, step.content or "")
                outcome = StepOutcome(row.run_id, RunStatus.RUNNING, observation, reason=kind)
            else:
                outcome = await self.gate.step(row.run_id, call.decision(), context=call.context)
        return await self._conclude(row, call, outcome)

    async def _conclude(
        self, row: CallRow, call: _Call, outcome: StepOutcome, *, settled: bool = False
    ) -> Answer:
        """Turn what the gate did into an answer, ending the run when the call is over
        (`settled`: the result's own commit settled the row already)."""
        run_id = row.run_id
        for _round in range(4):
            if outcome.status is RunStatus.WAITING_FOR_APPROVAL and outcome.approval is not None:
                self.announce(outcome.approval)
                await self.store.run(self.index.release, run_id, call.token)
                if outcome.approval.kind == UNKNOWN_OUTCOME:
                    return Answer.unknown_outcome(call.spec.name, outcome.approval.approval_id)
                answer = await self._collect(row, call, outcome.approval)
                return answer if answer is not None else Answer.in_progress(call.spec.name)
            if outcome.status is RunStatus.CANCELLED and outcome.reason == STALE:
                await self._settle_if_ended(run_id)
                self._log(
                    f"agentrt proxy: run {run_id}: the approved call to {call.spec.name} did "
                    "not run: the state it acts on changed after it was approved"
                )
                return Answer.stale(call.spec.name)
            if outcome.status is RunStatus.CANCELLED:
                ended = await self._settle_if_ended(run_id)
                if ended is not None and ended.outcome == Settled.EXPIRED:
                    return Answer.expired(call.spec.name)
                approval = await self.store.run(self.store.latest_approval, run_id)
                return Answer.rejected(call.spec.name, approval.note if approval else "")
            if outcome.status is RunStatus.FAILED:
                await self._settle_if_ended(run_id)
                return Answer.denied(call.spec.name, outcome.reason)
            if outcome.status is RunStatus.COMPLETED:
                if not settled:
                    await self._settle(run_id, Settled.RESULT)
                return Answer.result(outcome.result or "", self.forwarded.pop(run_id, None))
            observation = outcome.observation
            if observation is None:
                outcome = await self.gate.step(run_id, call.decision(), context=call.context)
                continue
            kind = observation.kind
            if kind == "result":
                # Proxy tools are terminal, so the gate completes the run with its
                # result; this serves a run a build from before that left running.
                await self.gate.step(run_id, Decision.complete(observation.content))
                await self._settle(run_id, Settled.RESULT)
                return Answer.result(observation.content, self.forwarded.pop(run_id, None))
            if kind == "interrupted":
                # A read-only call cut off by a dead process simply runs again.
                outcome = await self.gate.step(run_id, call.decision(), context=call.context)
                continue
            if kind == "tool_error":
                if (run_id, observation.step) in self.cut_off and _mutating(call.spec):
                    self.cut_off.discard((run_id, observation.step))
                    await self.store.run(self.index.mark_unknown_outcome, run_id)
                    outcome = await self.gate.step(run_id, call.decision(), context=call.context)
                    continue
                self.cut_off.discard((run_id, observation.step))
                await self.gate.step(run_id, Decision.fail("tool_error"))
                await self._settle(run_id, Settled.TOOL_ERROR)
                return Answer.tool_error(observation.content)
            if kind == "denied" and outcome.reason == PRECONDITION_UNAVAILABLE:
                # No approval was offered: the state it would bind could not be read.
                self._log(f"agentrt proxy: run {run_id}: {sanitize(observation.content)}")
                await self.gate.step(run_id, Decision.fail(PRECONDITION_UNAVAILABLE))
                await self._settle(run_id, Settled.DENIED)
                return _precondition_unavailable(call.spec.name)
            if kind == "denied":
                await self.gate.step(run_id, Decision.fail("denied"))
                await self._settle(run_id, Settled.DENIED)
                return Answer.denied(call.spec.name, observation.content)
            await self.gate.step(run_id, Decision.fail("invalid"))
            await self._settle(run_id, Settled.INVALID)
            return Answer.invalid(call.spec.name, observation.content)
        await self._release_quietly(run_id, call.token)
        return Answer.in_progress(call.spec.name)

    async def _settle(self, run_id: str, outcome: Settled) -> None:
        """Settle a call whose run ended; if the store refuses, the next identical
        call settles it from the run, which already says how it ended."""
        try:
            await self.store.run(self.index.settle, run_id, outcome)
        except Exception as exc:
            if _stayed_busy(exc):
                self._stalled.add(run_id)
            self._log(f"agentrt proxy: run {run_id} ended but its index row was not settled: "
                      f"{sanitize(str(exc))}")  # fmt: skip

    async def _settle_if_ended(self, run_id: str) -> CallRow | None:
        return await self.store.run(self.index.settle_if_ended, run_id)

    def _approval_and_clock(self, approval_id: str) -> tuple[ApprovalRecord, float]:
        # The clock that judges its expiry: the server's on PostgreSQL (`Store.clock`).
        return self.store.get_approval(approval_id), self.store.clock()

    async def _collect(self, row: CallRow, call: _Call, approval: ApprovalRecord) -> Answer | None:
        """Hold a call on its waiting approval, up to `hold`; None if it moved on meanwhile."""
        if approval.status is ApprovalStatus.PENDING:
            # A restarted proxy collecting an approved request must not call it waiting.
            self.announce(approval)
            if call.host_ask is not None:
                # The host's user decides here and now, or leaves it waiting (cancel).
                await call.host_ask(approval)
        deadline = time.monotonic() + self.hold
        next_progress = time.monotonic()
        while True:
            current, now = await self.store.run(self._approval_and_clock, approval.approval_id)
            if current.status is ApprovalStatus.APPROVED and self.passkeys is not None:
                unproven = await self.store.run(self._unproven, current)
                if unproven is not None:
                    self._log(
                        f"agentrt proxy: run {row.run_id}: approval {current.approval_id} is "
                        f"granted, but {unproven}; the call does not run"
                    )
                    return Answer.unavailable(
                        "the approval is not proven by an approver's passkey; the call did not run."
                    )
            if current.status is ApprovalStatus.APPROVED or (
                current.status is ApprovalStatus.PENDING
                and current.expires_at is not None
                and now >= current.expires_at
            ):
                return await self._resume(row, call)
            if current.status is ApprovalStatus.REJECTED:
                await self._settle_if_ended(row.run_id)
                return Answer.rejected(call.spec.name, current.note)
            if current.status is ApprovalStatus.EXPIRED:
                await self._settle_if_ended(row.run_id)
                return Answer.expired(call.spec.name)
            if current.status is not ApprovalStatus.PENDING:
                return None
            now = time.monotonic()
            if now >= deadline or self.closing.is_set():
                return _waiting_answer(call.spec.name, current)
            if call.progress is not None and now >= next_progress:
                next_progress = now + _PROGRESS_SECONDS
                await call.progress(now - (deadline - self.hold), "waiting for a person's approval")
            with anyio.move_on_after(min(_POLL_SECONDS, deadline - now)):
                await self.closing.wait()

    def _unproven(self, approval: ApprovalRecord) -> str | None:
        from ..passkeys import approval_unproven, read_registry

        assert self.passkeys is not None
        try:
            registry = read_registry(self.passkeys.registry)
        except AgentrtError as exc:
            return sanitize(str(exc))
        required = self.passkeys.quorum.required(approval)
        return approval_unproven(self.store, registry, approval, required)

    async def _resume(self, row: CallRow, call: _Call) -> Answer:
        if not await self.store.run(self.index.try_hold, row.run_id, call.token):
            return Answer.in_progress(call.spec.name)
        answer = await self._holding(row, call, self._resume_held(row, call))
        return answer if answer is not None else Answer.in_progress(call.spec.name)

    async def _resume_held(self, row: CallRow, call: _Call) -> Answer:
        try:
            outcome = await self.gate.resume(row.run_id, context=call.context)
        except RunStateError:
            await self._release_quietly(row.run_id, call.token)
            settled = await self._settle_if_ended(row.run_id)
            if settled is not None and settled.settled:
                return await self.store.run(_settled_answer, call.spec.name, settled, self.store)
            return Answer.in_progress(call.spec.name)
        except AgentrtError as exc:
            if row.run_id in self.sent:
                raise  # the request reached the server: an unknown outcome, not "not run"
            if _stayed_busy(exc):
                self._stalled.add(row.run_id)
            await self._release_quietly(row.run_id, call.token)
            # The reason names runs and files: it is for the operator's log, not the model.
            self.log.write(f"agentrt proxy: run {row.run_id} cannot resume: {sanitize(str(exc))}\n")
            self.log.flush()
            return Answer.unavailable("the approved request could not be run.")
        if outcome.reason == PRECONDITION_UNAVAILABLE and outcome.observation is not None:
            # The approval stays granted: the next identical call reads the state again.
            await self._release_quietly(row.run_id, call.token)
            self._log(f"agentrt proxy: run {row.run_id}: {sanitize(outcome.observation.content)}")
            return _precondition_unavailable(call.spec.name)
        return await self._conclude(row, call, outcome)

    async def _release_quietly(self, run_id: str, token: str) -> None:
        if run_id in self._stalled:
            # The database stayed locked for a whole busy deadline: a release would
            # hold the answer as long again.  Let go in memory only, as the gate does
            # with its lease: this process counts the hold as lapsed at once, another
            # once it runs out (`hold_ttl`: nothing renews it).
            self.index.forget(run_id, token)
            return
        # A hold that cannot be released is no longer renewed, and lapses by itself.
        try:
            await self.store.run(self.index.release, run_id, token)
        except Exception as exc:
            self._log(f"agentrt proxy: the hold on run {run_id} was not released (it lapses "
                      f"by itself): {sanitize(str(exc))}")  # fmt: skip


def _stayed_busy(exc: BaseException) -> bool:
    """Whether `exc` is, or was caused by, a database another writer held past the store's
    busy deadline (`StoreBusy`; the gate's `ResultNotRecorded` names it as its cause)."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, StoreBusy):
            return True
        cause = cause.__cause__
    return False


def _waiting_answer(tool: str, approval: ApprovalRecord) -> Answer:
    if approval.kind == INTERRUPTED_SIDE_EFFECT:
        return Answer.interrupted(tool, approval.approval_id)
    if approval.kind == UNKNOWN_OUTCOME:
        return Answer.unknown_outcome(tool, approval.approval_id)
    return Answer.pending(tool, approval.approval_id)


def _precondition_unavailable(tool: str) -> Answer:
    return Answer.unavailable(
        f"the call to {tool} was not run: the state it would act on could not be read "
        "(its precondition failed), so it was neither offered for approval nor run."
    )


def _settled_answer(tool: str, row: CallRow, store: Store) -> Answer:
    if row.outcome in (Settled.REJECTED, Settled.CANCELLED):
        approval = store.latest_approval(row.run_id)
        return Answer.rejected(tool, approval.note if approval else "")
    if row.outcome == Settled.EXPIRED:
        return Answer.expired(tool)
    if row.outcome in EXECUTED and row.settled_at is not None:
        return Answer.duplicate(tool, row.settled_at, row.outcome == Settled.RESULT)
    return Answer.in_progress(tool)


def _unaccepted_arguments(exc: BaseException) -> str:
    if isinstance(exc, JSONBoundaryError):
        return f"its arguments are not JSON the gate accepts ({exc})"
    if isinstance(exc, RecursionError):
        return "its arguments are nested too deeply"
    return "its arguments are not JSON the gate accepts"


def _shell_quote(text: str) -> str:
    return shlex.quote(text)
