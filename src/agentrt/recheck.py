"""Replaying recorded requests through a policy as it is now, to see which decisions would change.

`recheck` reads only: it asks the policy about each recorded request and
compares the answer with the `policy_decided` event the gate wrote at the
time.  Nothing is executed and nothing is recorded.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .canonical import JSONBoundaryError, parse_json
from .policy import Outcome, Policy, PolicyDecision, RunView, ToolRequest
from .store import Store
from .tools import ToolSpec

__all__ = ["Difference", "Recheck", "recheck"]

_PAGE = 100


@dataclass(frozen=True, slots=True)
class Difference:
    """One recorded decision the policy would now make differently."""

    run_id: str
    step: int
    tool: str
    args: str
    was: Outcome
    would: Outcome
    was_reason: str
    would_reason: str
    was_policy_id: str | None
    would_policy_id: str | None


@dataclass(frozen=True, slots=True)
class Recheck:
    """What a recheck looked at: the decisions replayed, those it could not, and the changes."""

    checked: int
    skipped: int
    differences: list[Difference]


async def recheck(
    store: Store,
    policy: Policy,
    specs: Iterable[ToolSpec],
    *,
    limit: int = 50,
    session: str | None = None,
) -> Recheck:
    """Replay the recorded requests of the `limit` most recent runs through `policy`.

    With `session`, only runs the proxy started for that session count.  Each
    step that has a `policy_decided` event is asked about again with the
    same tool, arguments and step number; a step whose tool is not in `specs`
    any more is counted as skipped.  A policy that reads the run's history
    sees it as it is now, not as it was then.
    """
    by_name = {spec.name: spec for spec in specs}
    checked = skipped = 0
    differences: list[Difference] = []
    seen = offset = 0
    while seen < limit:
        page = store.list_runs(limit=_PAGE, offset=offset)
        if not page:
            break
        offset += len(page)
        for run in page:
            if session is not None and run.metadata.get("proxy_session") != session:
                continue
            if seen >= limit:
                break
            seen += 1
            recorded: dict[int, tuple[Outcome, str, str | None]] = {}
            reads: list[tuple[int, str, str]] = []
            # A policy that judges by what was recorded with a decision (the proxy's taint)
            # is handed each recorded decision first.
            remember = getattr(policy, "remember_decision", None)
            for event in store.list_events(run.run_id, limit=10_000):
                payload = event.payload
                if event.type == "state_read" and isinstance(payload, dict):
                    reads.extend(_precondition_read(payload))
                    continue
                if event.type != "policy_decided" or not isinstance(payload, dict):
                    continue
                step = payload.get("step")
                if not isinstance(step, int) or step in recorded:
                    continue
                try:
                    outcome = Outcome(str(payload.get("outcome")))
                except ValueError:
                    continue
                policy_id = payload.get("policy_id")
                if callable(remember):
                    remember(run.run_id, step, payload)
                recorded[step] = (
                    outcome,
                    str(payload.get("reason", "")),
                    policy_id if isinstance(policy_id, str) else None,
                )
            for step_record in store.list_steps(run.run_id, limit=10_000):
                if step_record.step not in recorded:
                    continue
                spec = by_name.get(step_record.tool)
                try:
                    arguments = parse_json(step_record.args)
                except JSONBoundaryError:
                    spec = None
                if spec is None:
                    skipped += 1
                    continue
                request = ToolRequest(
                    spec, step_record.args, arguments, run.run_id, step_record.step
                )
                view = RunView(run.run_id, run.goal, step_record.step - 1, 0, dict(run.metadata))
                try:
                    decided = await policy.evaluate(request, view)
                except Exception as exc:
                    # As the gate would: a policy that cannot decide ends the run.
                    decided = PolicyDecision.abort(f"policy_error: {exc}")
                checked += 1
                was, was_reason, was_id = recorded[step_record.step]
                if decided.outcome is not was:
                    differences.append(
                        Difference(
                            run_id=run.run_id,
                            step=step_record.step,
                            tool=step_record.tool,
                            args=step_record.args,
                            was=was,
                            would=decided.outcome,
                            was_reason=was_reason,
                            would_reason=decided.reason,
                            was_policy_id=was_id,
                            would_policy_id=_policy_id(policy),
                        )
                    )
            # A precondition's read ran only because the policy allowed it (the proxy asks
            # it first); one it would not allow now fails closed: nothing would be approved.
            for step, tool, args in reads:
                spec = by_name.get(tool)
                if spec is None:
                    continue  # a library tool's own fingerprint, which no policy decided
                request = ToolRequest(spec, args, parse_json(args), run.run_id, step)
                view = RunView(run.run_id, "precondition", 0, 0, {})
                try:
                    decided = await policy.evaluate(request, view)
                except Exception as exc:
                    decided = PolicyDecision.abort(f"policy_error: {exc}")
                checked += 1
                if decided.outcome is not Outcome.ALLOW:
                    differences.append(
                        Difference(
                            run_id=run.run_id, step=step, tool=tool, args=args,
                            was=Outcome.ALLOW, would=decided.outcome,
                            was_reason=f"the precondition read of step {step}",
                            would_reason=decided.reason, was_policy_id=None,
                            would_policy_id=_policy_id(policy),
                        )
                    )  # fmt: skip
    return Recheck(checked, skipped, differences)


def _precondition_read(payload: dict[str, object]) -> list[tuple[int, str, str]]:
    """The `(step, tool, args)` of a `state_read` event that read (not one that failed)."""
    step, tool, args = payload.get("step"), payload.get("tool"), payload.get("args")
    if not isinstance(step, int) or not isinstance(tool, str) or not isinstance(args, str):
        return []
    try:
        parse_json(args)
    except JSONBoundaryError:
        return []
    return [(step, tool, args)]


def _policy_id(policy: Policy) -> str | None:
    policy_id = getattr(policy, "id", None)
    return policy_id if isinstance(policy_id, str) else None
