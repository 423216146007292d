"""Policy tables and schema-driven argument fuzzing from `agentrt.testkit`."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings

from agentrt import ClassPolicy, Outcome, SideEffect, ToolSpec
from agentrt.canonical import canonical_json, parse_json
from agentrt.policy import PolicyDecision, RunView, ToolRequest
from agentrt.schema import compile_schema
from agentrt.testkit import PolicyCase, arguments_for, assert_policy_table, check_policy_table

pytestmark = pytest.mark.anyio

READ = ToolSpec(
    name="read_file",
    description="Read a file.",
    input_schema={
        "type": "object",
        "properties": {"path": {"type": "string", "minLength": 1}},
        "required": ["path"],
    },
    side_effect=SideEffect.READ_ONLY,
    timeout=5.0,
)
DELETE = ToolSpec(
    name="delete_file",
    description="Delete a file.",
    input_schema={
        "type": "object",
        "properties": {
            "path": {"type": "string"},
            "recursive": {"type": "boolean"},
            "depth": {"type": "integer", "minimum": 0, "maximum": 5},
            "tags": {"type": "array", "items": {"enum": ["tmp", "log"]}, "maxItems": 3},
        },
        "required": ["path"],
        "additionalProperties": False,
    },
    side_effect=SideEffect.DESTRUCTIVE,
    timeout=5.0,
)
POLICY = ClassPolicy(
    {SideEffect.READ_ONLY: Outcome.ALLOW, SideEffect.DESTRUCTIVE: Outcome.REQUIRE_APPROVAL}
)


async def test_a_table_that_holds_reports_nothing() -> None:
    cases = [
        PolicyCase("read_file", {"path": "a.txt"}, Outcome.ALLOW),
        PolicyCase("delete_file", '{"path": "a.txt"}', Outcome.REQUIRE_APPROVAL),
    ]
    assert await check_policy_table(POLICY, [READ, DELETE], cases) == []
    await assert_policy_table(POLICY, [READ, DELETE], cases)


async def test_each_row_that_does_not_hold_is_named_in_one_sentence() -> None:
    class Raising:
        async def evaluate(self, request: ToolRequest, run: RunView) -> PolicyDecision:
            if request.spec.name == "read_file":
                raise KeyError("no rule")
            return PolicyDecision.deny("never delete")

    cases = [
        PolicyCase("read_file", {"path": "a.txt"}, Outcome.ALLOW, name="reads"),
        PolicyCase("delete_file", {"path": "a.txt"}, Outcome.REQUIRE_APPROVAL),
        PolicyCase("format_disk", {}, Outcome.DENY),
        PolicyCase("delete_file", {"path": "a", "force": True}, Outcome.DENY),
        PolicyCase("delete_file", '{"path": "a", "path": "b"}', Outcome.DENY),
    ]
    mismatches = await check_policy_table(Raising(), [READ, DELETE], cases)
    assert mismatches[0] == "case 1 (reads): the policy raised KeyError: 'no rule'"
    assert mismatches[1] == ("case 2: delete_file got deny (never delete), not require_approval")
    assert mismatches[2] == "case 3: no tool is named 'format_disk'"
    assert mismatches[3].startswith("case 4: the gate would refuse the arguments: ")
    assert mismatches[4].startswith("case 5: the arguments are not usable JSON")
    with pytest.raises(AssertionError, match="the policy table does not hold"):
        await assert_policy_table(Raising(), [READ, DELETE], cases)


@settings(max_examples=60, deadline=None)
@given(arguments_for(DELETE))
def test_every_drawn_argument_is_canonical_and_taken_by_the_gates_validator(args: str) -> None:
    value = parse_json(args)
    assert canonical_json(value) == args
    assert compile_schema(DELETE.input_schema).first_error(value) is None
    assert set(json.loads(args)) <= {"path", "recursive", "depth", "tags"}


@settings(max_examples=60, deadline=None)
@given(arguments_for(READ))
def test_a_policy_decides_every_drawn_argument_without_raising(args: str) -> None:
    import anyio

    request = ToolRequest(READ, args, parse_json(args), "fuzz", 1)
    run = RunView("fuzz", "", 0, 0)
    decided = anyio.run(POLICY.evaluate, request, run)
    assert decided.outcome is Outcome.ALLOW
