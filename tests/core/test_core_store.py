"""The store on real files: who may write it, what it refuses, what a crash leaves behind."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import anyio
import pytest

import agentrt.store.ledger as ledger
from agentrt import (
    Decision,
    Gate,
    RunLeased,
    RunStatus,
    SideEffect,
    StoreError,
    UnsafeDatabase,
    approve,
    open_store,
)
from agentrt.gate import INTERRUPTED_SIDE_EFFECT
from agentrt.store import SCHEMA_VERSION

from .helpers import RecordingTool, approval_policy

REPO = Path(__file__).resolve().parents[2]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_new_database_files_are_owner_only_under_umask_000(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    previous = os.umask(0)
    try:
        store = open_store(db)
        with store.transaction() as connection:
            store.append_event(connection, "r", "probe", {})
        modes = {
            path.name: path.stat().st_mode & 0o777
            for path in tmp_path.iterdir()
            if path.name.startswith("runs.db")
        }
        store.close()
    finally:
        os.umask(previous)
    assert "runs.db-wal" in modes and "runs.db" in modes
    assert set(modes.values()) == {0o600}, modes


@pytest.mark.parametrize("mode", [0o666, 0o620, 0o602])
def test_database_others_can_write_is_refused(tmp_path: Path, mode: int) -> None:
    db = tmp_path / "runs.db"
    open_store(db).close()
    before = _digest(db)
    db.chmod(mode)
    with pytest.raises(UnsafeDatabase, match="writable by group or others"):
        open_store(db)
    with pytest.raises(UnsafeDatabase):
        open_store(db, read_only=True)
    assert _digest(db) == before


def test_symbolic_link_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    open_store(db).close()
    link = tmp_path / "link.db"
    link.symlink_to(db)
    with pytest.raises(UnsafeDatabase, match="symbolic link"):
        open_store(link)
    with pytest.raises(UnsafeDatabase, match="symbolic link"):
        open_store(link, read_only=True)
    dangling = tmp_path / "dangling.db"
    dangling.symlink_to(tmp_path / "nowhere.db")
    with pytest.raises(UnsafeDatabase):
        open_store(dangling)
    assert not (tmp_path / "nowhere.db").exists()


def test_missing_database_is_never_created_without_create(tmp_path: Path) -> None:
    db = tmp_path / "absent.db"
    with pytest.raises(StoreError, match="does not exist"):
        open_store(db, create=False)
    with pytest.raises(StoreError, match="does not exist"):
        open_store(db, read_only=True)
    assert list(tmp_path.iterdir()) == []


def test_database_from_a_newer_build_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    open_store(db).close()
    raw = sqlite3.connect(db)
    raw.execute("PRAGMA user_version = 99")
    raw.commit()
    raw.close()
    for kwargs in ({}, {"read_only": True}, {"create": False}):
        with pytest.raises(UnsafeDatabase, match="newer build"):
            open_store(db, **kwargs)  # type: ignore[arg-type]


def test_read_only_open_never_writes(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    store = open_store(db)
    with store.transaction() as connection:
        store.append_event(connection, "r", "probe", {"a": 1})
    store.close()
    before = _digest(db)
    reader = open_store(db, read_only=True)
    assert reader.verify_chain().ok
    assert reader.list_runs() == []
    with pytest.raises(StoreError, match="read-only"), reader.transaction():
        pass
    with pytest.raises(sqlite3.OperationalError):
        reader._connection.execute("INSERT INTO extensions VALUES ('x', 1)")
    reader.close()
    assert _digest(db) == before


def test_extension_migrations_are_forward_only(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    store = open_store(db)
    store.migrate_extension("index", ["CREATE TABLE calls (key TEXT)"])
    store.migrate_extension("index", ["CREATE TABLE calls (key TEXT)", "ALTER TABLE calls ADD n"])
    assert store.extension_version("index") == 2
    with pytest.raises(UnsafeDatabase, match="newer build"):
        store.migrate_extension("index", ["CREATE TABLE calls (key TEXT)"])


def test_verify_finds_the_first_altered_event(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    store = open_store(db)
    with store.transaction() as connection:
        for index in range(5):
            store.append_event(connection, "r", "probe", {"i": index})
    assert store.verify_chain().ok and store.verify_chain().head_seq == 5
    raw = sqlite3.connect(db)
    raw.execute("UPDATE events SET payload = '{\"i\":99}' WHERE seq = 3")
    raw.commit()
    raw.close()
    report = open_store(db, read_only=True).verify_chain()
    assert not report.ok and report.first_bad_seq == 3
    raw = sqlite3.connect(db)
    raw.execute("DELETE FROM events WHERE seq = 3")
    raw.commit()
    raw.close()
    assert open_store(db, read_only=True).verify_chain().first_bad_seq == 3


@pytest.mark.anyio
async def test_live_lease_refuses_another_process(database: str | Path) -> None:
    db = database
    slow = RecordingTool("write", SideEffect.LOCAL_MUTATION, delay=0.5)
    first = Gate(open_store(db), [slow], lease_ttl=5)
    second = Gate(open_store(db), [slow], lease_ttl=5)
    run_id = await first.start("x")
    async with anyio.create_task_group() as group:
        group.start_soon(first.step, run_id, Decision.tool_call("write", '{"path": "a"}'))
        await anyio.sleep(0.1)
        with pytest.raises(RunLeased, match=first.owner):
            await second.resume(run_id)
    assert len(slow.calls) == 1


CRASHING_PROGRAM = textwrap.dedent(
    """
    import sys, anyio
    from agentrt import Decision, Gate, SideEffect, ToolResult, ToolSpec, open_store

    class Hang:
        spec = ToolSpec("{name}", "hangs", {{"type": "object"}}, SideEffect.{effect}, 60.0)
        async def call(self, call):
            print("started", flush=True)
            await anyio.sleep(60)
            return ToolResult("{{}}")

    async def main():
        gate = Gate(open_store(sys.argv[1]), [Hang()], lease_ttl=1.0)
        await gate.start("crash", run_id="crashy")
        await gate.step("crashy", Decision.tool_call("{name}", "{{}}"))

    anyio.run(main)
    """
)


def _crash_mid_tool(db: str | Path, name: str, effect: str) -> None:
    program = CRASHING_PROGRAM.format(name=name, effect=effect)
    child = subprocess.Popen(
        [sys.executable, "-c", program, str(db)], stdout=subprocess.PIPE, cwd=REPO
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == b"started"
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=10)


@pytest.mark.anyio
@pytest.mark.timeout(60)
async def test_crash_mid_mutation_pauses_on_interrupted_side_effect(database: str | Path) -> None:
    db = database
    _crash_mid_tool(db, "write", "LOCAL_MUTATION")
    write = RecordingTool("write", SideEffect.LOCAL_MUTATION, schema={"type": "object"})
    gate = Gate(open_store(db), [write], policy=approval_policy())
    # The dead process's lease is still live for up to a second: nobody may act yet.
    with pytest.raises(RunLeased):
        await gate.resume("crashy")
    deadline = time.monotonic() + 10
    while True:
        try:
            outcome = await gate.resume("crashy")
            break
        except RunLeased:
            assert time.monotonic() < deadline
            await anyio.sleep(0.2)
    assert outcome.status is RunStatus.WAITING_FOR_APPROVAL
    assert outcome.approval is not None and outcome.approval.kind == INTERRUPTED_SIDE_EFFECT
    assert "may have taken effect" in outcome.approval.presentation["warning"]
    assert write.calls == []
    approve(gate.store, "crashy", approval_hash=outcome.approval.approval_hash)
    await gate.resume("crashy")
    assert [call.args for call in write.calls] == ["{}"]


@pytest.mark.anyio
@pytest.mark.timeout(60)
async def test_crash_mid_read_marks_the_step_interrupted_and_continues(
    database: str | Path,
) -> None:
    db = database
    _crash_mid_tool(db, "read", "READ_ONLY")
    read = RecordingTool("read", SideEffect.READ_ONLY, schema={"type": "object"})
    gate = Gate(open_store(db), [read])
    await anyio.sleep(1.2)
    outcome = await gate.resume("crashy")
    assert outcome.status is RunStatus.RUNNING
    assert outcome.observation is not None and outcome.observation.kind == "interrupted"
    assert gate.store.list_steps("crashy")[0].status == "interrupted"
    assert read.calls == []


@pytest.mark.anyio
async def test_a_call_longer_than_its_lease_keeps_the_lease_renewed(database: str | Path) -> None:
    db = database
    slow = RecordingTool("write", SideEffect.LOCAL_MUTATION, delay=1.5, timeout=5.0)
    first = Gate(open_store(db), [slow], lease_ttl=0.6)
    second = Gate(open_store(db), [slow], lease_ttl=0.6)
    run_id = await first.start("x")
    async with anyio.create_task_group() as group:
        group.start_soon(first.step, run_id, Decision.tool_call("write", '{"path": "a"}'))
        # Twice the lease's time into the call, the heartbeat has kept it live.
        await anyio.sleep(1.2)
        with pytest.raises(RunLeased):
            await second.resume(run_id)
    assert len(slow.calls) == 1


def test_database_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("changing a file's owner needs root")
    db = tmp_path / "runs.db"
    open_store(db).close()
    os.chown(db, 65534, 65534)
    before = _digest(db)
    for kwargs in ({}, {"read_only": True}, {"create": False}):
        with pytest.raises(UnsafeDatabase, match="owned by another user"):
            open_store(db, **kwargs)  # type: ignore[arg-type]
    assert _digest(db) == before


@pytest.mark.anyio
async def test_another_gate_cannot_end_or_step_a_run_held_by_a_live_lease(
    database: str | Path,
) -> None:
    db = database
    slow = RecordingTool("write", SideEffect.LOCAL_MUTATION, delay=0.6)
    first = Gate(open_store(db), [slow], lease_ttl=5)
    second = Gate(open_store(db), [slow], lease_ttl=5)
    run_id = await first.start("x")
    async with anyio.create_task_group() as group:
        group.start_soon(first.step, run_id, Decision.tool_call("write", '{"path": "a"}'))
        await anyio.sleep(0.2)
        with pytest.raises(RunLeased):
            await second.step(run_id, Decision.complete("stolen"))
        with pytest.raises(RunLeased):
            await second.step(run_id, Decision.tool_call("write", "{not json"))
    run = first.store.get_run(run_id)
    assert run.status is RunStatus.RUNNING and run.step_count == 1
    assert first.store.list_steps(run_id)[0].status == "succeeded"


@pytest.mark.anyio
async def test_resume_takes_its_lease_after_a_slow_policy_not_before(database: str | Path) -> None:
    import time as clock

    from agentrt import PolicyDecision

    decided: list[float] = []

    class SlowApproval:
        async def evaluate(self, request: object, run: object) -> PolicyDecision:
            await anyio.sleep(0.8)
            decided.append(clock.time())
            return PolicyDecision.require_approval("write", {}, {})

    db = database
    expiries: list[float] = []

    class Watching(RecordingTool):
        async def call(self, call: object) -> object:  # type: ignore[override]
            expiries.append(gate.store.get_run("slow").lease_expires_at)  # type: ignore[arg-type]
            return await super().call(call)  # type: ignore[arg-type]

    tool = Watching("write", SideEffect.LOCAL_MUTATION, timeout=0.5)
    gate = Gate(open_store(db), [tool], policy=SlowApproval(), lease_ttl=1.0)
    await gate.start("x", run_id="slow")
    outcome = await gate.step("slow", Decision.tool_call("write", '{"path": "a"}'))
    assert outcome.approval is not None
    approve(gate.store, "slow", approval_hash=outcome.approval.approval_hash)
    await gate.resume("slow")
    # The lease the call relies on was taken (its expiry less its 1 s) after the resumed
    # policy's 0.8 s ended, not before it began: compared on the clock, not on elapsed time,
    # so a loaded machine cannot fail it (0.05 s allows the store's clock its rounding).
    assert expiries and decided
    assert expiries[0] - 1.0 >= decided[-1] - 0.05


@pytest.mark.anyio
async def test_a_gate_can_take_back_its_own_expired_lease(database: str | Path) -> None:
    db = database
    read = RecordingTool("read", SideEffect.READ_ONLY)
    gate = Gate(open_store(db), [read], lease_ttl=5)
    run_id = await gate.start("x")
    # As if this gate's own earlier attempt failed mid-tool and its lease lapsed.
    with gate.store.transaction() as connection:
        connection.execute(
            "INSERT INTO steps (run_id, step, tool, args, status, started_at)"
            " VALUES (?, 1, 'read', '{}', 'executing', 'then')",
            (run_id,),
        )
        connection.execute(
            "UPDATE runs SET step_count = 1, lease_owner = ?, lease_expires_at = 1"
            " WHERE run_id = ?",
            (gate.owner, run_id),
        )
    outcome = await gate.resume(run_id)
    assert outcome.observation is not None and outcome.observation.kind == "interrupted"


@pytest.mark.anyio
async def test_a_second_schema_database_loses_only_the_unread_status_index(tmp_path: Path) -> None:
    # Migration 3 drops `runs_by_status`, which no query read and every call's two
    # commits wrote (4 adds `runs_waiting`, for listings); the runs stay, and every
    # lookup of a run still searches its key.
    db = tmp_path / "runs.db"
    read = RecordingTool("read", SideEffect.READ_ONLY)
    gate = Gate(open_store(db), [read])
    waiting = await gate.start("waits")
    done = await gate.start("done")
    await gate.step(done, Decision.complete("finished"))
    gate.store.close()
    with sqlite3.connect(db) as raw:  # as the build before this migration left it
        raw.execute("CREATE INDEX runs_by_status ON runs (status)")
        raw.execute("DROP INDEX runs_waiting")
        raw.execute("PRAGMA user_version = 2")
    with open_store(db) as store:
        assert store.get_run(done) is not None and store.get_run(done).status is RunStatus.COMPLETED  # type: ignore[union-attr]
        assert [run.run_id for run in store.list_runs()] == [done, waiting]
    with sqlite3.connect(db) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        indexes = {row[0] for row in raw.execute(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'runs'"
        )}  # fmt: skip
        assert indexes == {"sqlite_autoindex_runs_1", "runs_by_creation", "runs_waiting"}
        # Every statement over runs by id, wherever it is written.
        sources = sorted((REPO / "src/agentrt").rglob("*.py"))
        pattern = r"(?:SELECT [^\"]* FROM runs|UPDATE runs SET)[^\"]*(?:\"\s*\"[^\"]*)*"
        statements = [
            " ".join(found.split())
            for path in sources
            for found in re.findall(pattern, path.read_text())
            # Built from the table of transitions, or completed when run: read as built, below.
            if "{" not in found and not found.rstrip().endswith("RETURNING")
        ]
        built = [value for value in vars(ledger).values() if isinstance(value, str)]
        statements += [
            # A result's count is completed with what it returns.
            value + "status" if value.endswith("RETURNING ") else value
            for value in built
            if value.startswith("UPDATE runs SET")
            or (value.startswith("SELECT") and " FROM runs " in value)
        ]
        by_id = [sql.replace('" "', "") for sql in statements if "run_id = ?" in sql]
        assert len(by_id) >= 8
        for sql in by_id:
            plan = str(raw.execute("EXPLAIN QUERY PLAN " + sql, [None] * sql.count("?")).fetchall())
            assert "USING INDEX sqlite_autoindex_runs_1" in plan, (sql, plan)


@pytest.mark.anyio
async def test_a_page_of_runs_is_what_sorting_every_run_gives(database: str | Path) -> None:
    # Pages are read through two indexes (the waiting runs, then the others from where
    # the page reaches them); each must equal the plain sort, waiting first, on both
    # backends, across the boundary between the two.
    read = RecordingTool("read", SideEffect.READ_ONLY)
    write = RecordingTool("write", SideEffect.LOCAL_MUTATION)
    gate = Gate(open_store(database), [read, write], policy=approval_policy())
    for number in range(23):
        run_id = await gate.start(f"run {number}")
        if number % 4 == 1:
            await gate.step(run_id, Decision.tool_call("write", f'{{"path": "{number}"}}'))
        elif number % 4 == 2:
            await gate.step(run_id, Decision.complete("done"))
    store = gate.store
    waiting = [run for run in store.list_runs(100) if run.status is RunStatus.WAITING_FOR_APPROVAL]
    assert len(waiting) == 6
    plain = (
        "SELECT run_id FROM runs ORDER BY (status = 'waiting_for_approval') DESC,"
        " created_seq DESC LIMIT ? OFFSET ?"
    )
    for limit in (1, 4, 6, 7, 50):
        for offset in (0, 1, 5, 6, 7, 12, 22, 23, 30):
            expected = [row[0] for row in store._query(plain, (limit, offset))]
            assert [run.run_id for run in store.list_runs(limit, offset)] == expected, (
                limit,
                offset,
            )
    store.close()


def test_a_page_of_runs_reads_through_the_indexes_not_a_sort_of_every_run(tmp_path: Path) -> None:
    from agentrt.store import _LIST_RUNS

    open_store(tmp_path / "runs.db").close()
    with sqlite3.connect(tmp_path / "runs.db") as raw:
        plan = [row[3] for row in raw.execute("EXPLAIN QUERY PLAN " + _LIST_RUNS, (1,) * 6)]
    scans = [step for step in plan if step.startswith("SCAN runs")]
    indexes = {step.partition(" USING INDEX ")[2] for step in scans}
    assert indexes == {"runs_waiting", "runs_by_creation"}, plan


def test_verify_finds_even_a_whitespace_change_in_a_payload(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    store = open_store(db)
    with store.transaction() as connection:
        store.append_event(connection, "r", "probe", {"a": 1, "b": "x"})
    store.close()
    raw = sqlite3.connect(db)
    # The same JSON value, other bytes: the chain covers the bytes as stored.
    raw.execute("""UPDATE events SET payload = '{"a": 1, "b": "x"}' WHERE seq = 1""")
    raw.commit()
    raw.close()
    assert open_store(db, read_only=True).verify_chain().first_bad_seq == 1


def test_event_hash_is_pinned_to_its_envelope_bytes() -> None:
    from agentrt.store import GENESIS_HASH, event_hash

    envelope = (
        b'{"created_at":"2026-12-01T00:00:00.000000Z","payload":{"n":1.50},'
        b'"prev_hash":"' + GENESIS_HASH.encode() + b'","run_id":"r","seq":1,"type":"probe"}'
    )
    expected = hashlib.sha256(envelope).hexdigest()
    actual = event_hash(GENESIS_HASH, 1, "r", "probe", '{"n":1.50}', "2026-12-01T00:00:00.000000Z")
    assert actual == expected
