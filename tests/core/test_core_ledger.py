"""The ledger is the one writer of runs, steps and approvals; the vocabulary and the
table of transitions are written once; a tool is checked without building a gate."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from agentrt import Gate, RegistrationError, SideEffect, open_store
from agentrt.store.events import TRANSITIONS, EndReason, EventType
from agentrt.tools import check_tool

from .helpers import RecordingTool

SRC = Path(__file__).resolve().parents[2] / "src" / "agentrt"
_SQL = re.compile(r"\b(?:SELECT\s.+\sFROM|INSERT\s+INTO|UPDATE\s+\w+\s+SET|DELETE\s+FROM)\b")


def _modules(*names: str) -> list[Path]:
    found: list[Path] = []
    for name in names:
        path = SRC / name
        found.extend(sorted(path.rglob("*.py")) if path.is_dir() else [path.with_suffix(".py")])
    return [path for path in found if path.exists()]


def _string_constants(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]


def test_the_gate_and_the_operators_decisions_write_no_sql() -> None:
    # A statement above the ledger is a transition the table and `verify_state` do not know.
    offenders = [
        (path.name, text)
        for path in _modules("gate", "approvals")
        for text in _string_constants(path)
        if _SQL.search(text)
    ]
    assert offenders == []
    for path in _modules("gate", "approvals"):
        assert ".execute(" not in path.read_text(), path


def test_a_calls_channels_travel_in_its_context_not_in_context_variables() -> None:
    # A context variable set by the proxy and read below the gate is a channel the gate
    # carries without knowing it: the call path passes an explicit `CallContext` instead.
    # (The schema's regex deadline is no call's channel: it bounds one match, inside it.)
    offenders = [
        (str(path.relative_to(SRC)), line.strip())
        for path in sorted(SRC.rglob("*.py"))
        if path.relative_to(SRC).as_posix() != "schema.py"
        for line in path.read_text().splitlines()
        if re.search(r"\bcontextvars\b|\bContextVar\b", line)
    ]
    assert offenders == []


def test_mcp_checks_a_tool_without_importing_the_gate() -> None:
    imports = [
        (path.name, line.strip())
        for path in _modules("mcp")
        for line in path.read_text().splitlines()
        if re.match(r"\s*(from|import)\s+(\.\.gate|agentrt\.gate)\b", line)
    ]
    assert imports == []


def _event_type_member(node: ast.expr) -> str | None:
    """The string of `EventType.NAME.value` (or `EventType.NAME`) written in source, else None."""
    if isinstance(node, ast.Attribute) and node.attr == "value":
        node = node.value
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "EventType"
    ):
        return str(EventType[node.attr])
    return None


def test_every_event_type_the_source_writes_is_in_the_vocabulary() -> None:
    # Each `append_event(connection, run, TYPE, ...)` names its type by a literal or a
    # module constant; every such value must be a member, or the vocabulary is not whole.
    written: set[str] = set()
    for path in SRC.rglob("*.py"):
        tree = ast.parse(path.read_text())
        constants = {
            target.id: node.value.value
            for node in ast.walk(tree)
            if isinstance(node, (ast.Assign, ast.AnnAssign))
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
            for target in ([node.target] if isinstance(node, ast.AnnAssign) else node.targets)
            if isinstance(target, ast.Name)
        }
        for node in ast.walk(tree):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "append_event"
                and len(node.args) >= 3
            ):
                continue
            kind = node.args[2]
            if isinstance(kind, ast.Constant):
                written.add(kind.value)
            elif isinstance(kind, ast.Name) and kind.id in constants:
                written.add(constants[kind.id])
            elif (member := _event_type_member(kind)) is not None:
                written.add(member)
    assert written, "no append_event call was found"
    assert written <= {str(member) for member in EventType}, written - set(EventType)
    assert {"model_attempt", "model_limit_reached"} <= written  # accounting's
    # The proxy records a server's requests under a type it passes through a variable:
    # its two constants.  (Read, not imported: importing the proxy draws uuid4s, which
    # would shift the frozen draws of the golden scenarios that run after this test.)
    client_requests = ast.parse((SRC / "proxy" / "_client_requests.py").read_text())
    named = {
        node.target.id: _event_type_member(node.value)
        for node in ast.walk(client_requests)
        if isinstance(node, ast.AnnAssign)
        and isinstance(node.target, ast.Name)
        and node.value is not None
    }
    assert {named["CLIENT_REQUEST_EVENT"], named["CLIENT_REQUEST_ANSWERED"]} <= set(EventType)


def test_the_state_events_of_the_table_are_the_ones_verify_state_has_always_replayed() -> None:
    # Their order is part of the check's statement: the SQL must not change with the refactor,
    # and a new transition is appended after them (issue #31's `approval_stale`).
    assert list(TRANSITIONS) == [
        "run_started", "approval_requested", "approval_granted", "approval_rejected",
        "approval_expired", "run_resumed", "operator_cancelled", "run_completed", "run_failed",
        "run_cancelled", "approval_stale",
    ]  # fmt: skip
    assert str(EndReason.GRANT_EXPIRED) == "grant_expired"


def test_check_tool_refuses_what_the_gate_refuses_with_the_same_sentence() -> None:
    bad = RecordingTool("has space", SideEffect.READ_ONLY)
    with pytest.raises(RegistrationError) as by_check:
        check_tool(bad)
    with open_store(":memory:") as store, pytest.raises(RegistrationError) as by_gate:
        Gate(store, [bad])
    assert str(by_check.value) == str(by_gate.value)
    assert "does not match" in str(by_check.value)
    good = RecordingTool("read", SideEffect.READ_ONLY)
    checked = check_tool(good)
    assert checked.spec is good.spec and checked.tool is good
    assert checked.schema.first_error({"path": "a"}) is None
    assert checked.schema.first_error({}) is not None
