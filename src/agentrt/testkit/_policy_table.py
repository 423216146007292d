"""Policy tables: a table of requests and the outcome each must get, checked against a policy.

    rows = [
        PolicyCase("read_file", {"path": "a.txt"}, Outcome.ALLOW),
        PolicyCase("delete_file", {"path": "a.txt"}, Outcome.REQUIRE_APPROVAL),
    ]
    assert not await check_policy_table(policy, [read, delete], rows)

Each case's arguments are checked against the tool's input schema first, as
the gate would (a case the gate would refuse as invalid is a mismatch of its
own: the policy would never see it), then the policy is asked with a
`RunView` (the case's, or an empty run's).  The result is one sentence per
case that got another outcome, or raised.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..canonical import JSONBoundaryError, canonical_json, parse_json
from ..policy import Outcome, Policy, RunView, ToolRequest
from ..sanitize import sanitize
from ..schema import compile_schema
from ..tools import ToolSpec

__all__ = ["PolicyCase", "assert_policy_table", "check_policy_table"]


@dataclass(frozen=True, slots=True)
class PolicyCase:
    """One row: the tool's name, its arguments (JSON text, or a value to encode), the outcome."""

    tool: str
    arguments: str | Mapping[str, Any]
    expect: Outcome
    run: RunView | None = None
    name: str = ""


def _spec(tool: Any) -> ToolSpec:
    spec = tool if isinstance(tool, ToolSpec) else getattr(tool, "spec", None)
    if not isinstance(spec, ToolSpec):
        raise TypeError(f"{tool!r} is neither a ToolSpec nor a tool with a spec")
    return spec


async def check_policy_table(
    policy: Policy, tools: Sequence[Any], cases: Sequence[PolicyCase]
) -> list[str]:
    """Every case whose outcome differs from its `expect`, one sentence each (empty: all held)."""
    specs = {spec.name: spec for spec in map(_spec, tools)}
    compiled = {name: compile_schema(spec.input_schema) for name, spec in specs.items()}
    mismatches: list[str] = []
    for number, case in enumerate(cases, start=1):
        label = f"case {number}" + (f" ({sanitize(case.name)})" if case.name else "")
        spec = specs.get(case.tool)
        if spec is None:
            mismatches.append(f"{label}: no tool is named {sanitize(case.tool)!r}")
            continue
        args = (
            case.arguments
            if isinstance(case.arguments, str)
            else canonical_json(json.loads(json.dumps(case.arguments)))
        )
        try:
            arguments = parse_json(args)
        except JSONBoundaryError as exc:
            mismatches.append(f"{label}: the arguments are not usable JSON: {exc}")
            continue
        problem = compiled[case.tool].first_error(arguments)
        if problem is not None:
            mismatches.append(f"{label}: the gate would refuse the arguments: {problem}")
            continue
        run = case.run or RunView(run_id="policy-table", goal="", step_count=0,
                                  consecutive_failures=0)  # fmt: skip
        request = ToolRequest(spec, args, arguments, run.run_id, run.step_count + 1)
        try:
            decided = await policy.evaluate(request, run)
        except Exception as exc:
            mismatches.append(
                f"{label}: the policy raised {type(exc).__name__}: {sanitize(str(exc))[:200]}"
            )
            continue
        if decided.outcome is not case.expect:
            reason = f" ({sanitize(decided.reason)[:200]})" if decided.reason else ""
            mismatches.append(
                f"{label}: {sanitize(case.tool)} got {decided.outcome}{reason}, not {case.expect}"
            )
    return mismatches


async def assert_policy_table(
    policy: Policy, tools: Sequence[Any], cases: Sequence[PolicyCase]
) -> None:
    """`check_policy_table`, raising `AssertionError` listing every mismatch."""
    mismatches = await check_policy_table(policy, tools, cases)
    if mismatches:
        raise AssertionError("the policy table does not hold:\n" + "\n".join(mismatches))
