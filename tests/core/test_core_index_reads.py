"""The call index is a store extension: each decision reads the runs, steps and approvals
it depends on inside its own write, on that write's connection, never through the store's
locked read path (which would take the store's lock again from inside a write)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from agentrt import Decision, Gate, SideEffect
from agentrt.approvals import cancel
from agentrt.proxy._index import Action, CallIndex, Settled, call_key
from agentrt.store import Store, open_store

from .helpers import RecordingTool, approval_policy

pytestmark = pytest.mark.anyio


def _refuse_locked_reads(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(sql: str, parameters: Any = ()) -> list[Any]:
        raise AssertionError(f"the store's locked read path was entered: {sql}")

    monkeypatch.setattr(store, "_query", refuse)


def _row(store: Store, run_id: str, key: str) -> None:
    with store.transaction() as connection:
        connection.execute(
            "INSERT INTO proxy_calls (run_id, session, call_key, tool, mutating, created_at)"
            " VALUES (?, 's', ?, 'write', 1, ?)",
            (run_id, key, time.time()),
        )


async def test_index_decisions_read_runs_inside_their_own_write(
    database: str | Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(database)
    gate = Gate(
        store, [RecordingTool("write", SideEffect.LOCAL_MUTATION)], policy=approval_policy()
    )
    index = CallIndex(store, "s", "proxy:test", 30.0)
    waiting, ended = await gate.start("waits"), await gate.start("is cancelled")
    for run_id in (waiting, ended):
        await gate.step(run_id, Decision.tool_call("write", '{"path": "a"}'))
    cancel(store, ended)
    waiting_key, ended_key = call_key("write", '{"path":"a"}'), call_key("write", '{"path":"b"}')
    _row(store, waiting, waiting_key)
    _row(store, ended, ended_key)
    approval = store.latest_approval(waiting)
    _refuse_locked_reads(store, monkeypatch)

    def decide(key: str, *, max_pending: int = 10) -> Any:
        with store.transaction() as connection:
            return index.decide_in(
                connection, run_id="new-" + key[:8], key=key, tool="write", mutating=True,
                repeat_window=60.0, may_need_approval=True, max_pending=max_pending, token="t",
            )  # fmt: skip

    assert [(row.run_id, found) for row, found in index.waiting()] == [(waiting, approval)]
    collect = decide(waiting_key)
    assert (collect.action, collect.row.run_id, collect.approval) == (
        Action.COLLECT, waiting, approval,
    )  # fmt: skip
    # The ended run's row is settled from its run and its last step, then a repeat is refused.
    rejected = decide(ended_key)
    assert rejected.action is Action.REJECTED and rejected.row.outcome == Settled.CANCELLED
    assert index.settle_if_ended(ended).settled  # type: ignore[union-attr]
    # Counting the calls that wait for a person reads each one's latest approval.
    assert decide(call_key("write", '{"path":"c"}'), max_pending=1).action is (
        Action.TOO_MANY_PENDING
    )
    store.close()
