"""A run's principal (issue 35): recorded in its `run_started` event only when it has one,
read back typed, and covered by the chain like every other fact of the run."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrt import Gate, SideEffect, open_store
from agentrt.principals import Principal

from .helpers import RecordingTool

pytestmark = pytest.mark.anyio

ALICE = Principal(
    issuer="https://id.example/",
    subject="alice",
    client_id="claude-code",
    jti="token-1",
    scopes=("mcp:tools",),
    groups=("release",),
)


async def test_a_runs_principal_is_recorded_and_read_back(database: str | Path) -> None:
    store = open_store(database)
    gate = Gate(store, [RecordingTool("read", SideEffect.READ_ONLY)])
    with_principal = await gate.start("deploy", principal=ALICE)
    without = await gate.start("deploy")
    assert store.principal_of_run(with_principal) == ALICE
    assert store.principal_of_run(without) is None
    assert store.principal_of_run("no-such-run") is None
    with store.transaction() as connection:
        assert store.read_principal_of_run(connection, with_principal) == ALICE
    started = store.list_events(with_principal)[0]
    assert started.type == "run_started"
    assert started.payload["principal"] == {
        "issuer": "https://id.example/", "subject": "alice", "client_id": "claude-code",
        "jti": "token-1", "scopes": ["mcp:tools"], "groups": ["release"],
    }  # fmt: skip
    # A run without one is written as it always was: no key at all (the goldens pin it).
    assert "principal" not in store.list_events(without)[0].payload
    assert store.verify_chain().ok
    store.close()


async def test_a_principal_with_only_a_subject_records_no_empty_client(tmp_path: Path) -> None:
    store = open_store(tmp_path / "runs.db")
    gate = Gate(store, [RecordingTool("read", SideEffect.READ_ONLY)])
    bare = Principal(issuer="https://id.example/", subject="bob")
    run_id = await gate.start("g", principal=bare)
    assert store.principal_of_run(run_id) == bare
    assert "client_id" not in store.list_events(run_id)[0].payload["principal"]
    store.close()


async def test_a_principal_edited_in_the_database_breaks_the_chain(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    store = open_store(db)
    gate = Gate(store, [RecordingTool("read", SideEffect.READ_ONLY)])
    run_id = await gate.start("g", principal=ALICE)
    store.close()
    import sqlite3

    connection = sqlite3.connect(db)
    connection.execute(
        "UPDATE events SET payload = replace(payload, '\"alice\"', '\"mallory\"')"
        " WHERE run_id = ? AND type = 'run_started'",
        (run_id,),
    )
    connection.commit()
    connection.close()
    store = open_store(db)
    assert store.principal_of_run(run_id) == Principal(
        issuer=ALICE.issuer, subject="mallory", client_id=ALICE.client_id, jti=ALICE.jti,
        scopes=ALICE.scopes, groups=ALICE.groups,
    )  # fmt: skip
    report = store.verify_chain()
    assert not report.ok
    store.close()
