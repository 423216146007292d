"""PostgreSQL binds a statement's values on the server and prepares a statement it has
sent a few times (decision 0060): the server parses and plans it once per connection,
not once per call.  What that must not change: every value a write sends arrives as it
did, and a schema another process changes underneath the store's prepared statements
(a newer build's migration adding a column) does not fail a write or a read.
"""

from __future__ import annotations

from typing import Any

import pytest

from agentrt import Decision, Gate, SideEffect, open_store
from agentrt.store import Store

from .helpers import RecordingTool

pytestmark = pytest.mark.anyio


@pytest.fixture
def url(postgres_server: Any) -> str:
    return str(postgres_server.database())


def _prepared(store: Store) -> list[str]:
    with store.transaction() as connection:
        rows = connection.execute("SELECT statement FROM pg_prepared_statements").fetchall()
    return [row[0] for row in rows]


async def _steps(gate: Gate, run_id: str, count: int) -> None:
    await gate.start("x", run_id=run_id)
    for n in range(count):
        outcome = await gate.step(run_id, Decision.tool_call("read", f'{{"path": "p{n}"}}'))
        assert outcome.observation is not None and outcome.observation.kind == "result"


async def test_a_stores_hot_statements_are_prepared_on_its_own_connection(url: str) -> None:
    store = open_store(url)
    gate = Gate(store, [RecordingTool("read", SideEffect.READ_ONLY)])
    await _steps(gate, "warm", 8)
    prepared = _prepared(store)
    # The chain's append and the step's own statements, each sent once a step.
    assert any(statement.startswith("INSERT INTO events") for statement in prepared)
    assert any("steps" in statement for statement in prepared)
    assert store.verify_chain().ok
    store.close()


async def test_a_column_added_under_prepared_statements_fails_no_write_and_no_read(
    url: str,
) -> None:
    import psycopg

    store = open_store(url)
    tool = RecordingTool("read", SideEffect.READ_ONLY)
    gate = Gate(store, [tool])
    await _steps(gate, "before", 8)
    prepared = _prepared(store)
    assert any("UPDATE runs" in statement for statement in prepared)
    # What would fail below is never prepared (this test fails if it were).
    assert not any("SELECT *" in statement or "RETURNING *" in statement for statement in prepared)
    # Another process (a newer build's migration) changes the tables the store's
    # prepared `SELECT *` statements read: PostgreSQL refuses a prepared statement whose
    # result's shape changed ("cached plan must not change result type").
    with psycopg.connect(url, autocommit=True) as other:
        other.execute("ALTER TABLE runs ADD COLUMN added_later TEXT")
        other.execute("ALTER TABLE steps ADD COLUMN added_later TEXT")
        other.execute("ALTER TABLE events ADD COLUMN added_later TEXT")
    run = store.get_run("before")  # a read outside a write
    assert run is not None and run.run_id == "before"
    await _steps(gate, "after", 8)  # writes that read the changed tables inside them
    assert len(tool.calls) == 16
    assert store.get_run("after") is not None
    report = store.verify_chain()
    assert report.ok, report
    store.close()
