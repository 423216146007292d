"""Group commit: concurrent `Store.write` units share one transaction, each in its own
savepoint, and nobody is answered before the COMMIT that holds their unit returned."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from agentrt import (
    ApprovalError,
    ApprovalStatus,
    Decision,
    Gate,
    PolicyDecision,
    RunStateError,
    RunStatus,
    RunView,
    SideEffect,
    ToolRequest,
    approve,
    open_store,
    reject,
)
from agentrt.errors import StoreError
from agentrt.store import Store

from .helpers import RecordingTool, approval_policy


class _Refused(Exception):
    pass


def _note(connection: sqlite3.Connection, store: Store, name: str, fail: bool = False) -> int:
    """A unit that writes a row and an event, and raises after writing them if told to."""
    connection.execute(
        "INSERT INTO extensions (name, version) VALUES (?, 1)", (name,)
    )  # any small table of the schema will do
    event = store.append_event(connection, name, "note", {"name": name})
    if fail:
        raise _Refused(f"{name} refused after writing")
    return event.seq


async def _hold_the_writer(store: Store, release: threading.Event) -> None:
    """Keep the writer busy in a unit until `release` is set, so later writes queue up."""

    def wait(connection: sqlite3.Connection) -> None:
        if not release.wait(timeout=30):
            raise TimeoutError("the test never released the writer")

    await store.write(wait)


@pytest.mark.anyio
async def test_a_failing_write_in_a_batch_rolls_back_only_its_own(database: str | Path) -> None:
    store = open_store(database)
    release = threading.Event()
    outcomes: dict[str, Any] = {}

    async def write(name: str, fail: bool) -> None:
        try:
            outcomes[name] = await store.write(_note, store, name, fail)
        except _Refused as exc:
            outcomes[name] = exc

    async with anyio.create_task_group() as group:
        group.start_soon(_hold_the_writer, store, release)
        await anyio.sleep(0.2)  # the writer is inside the holding unit now
        commits_before = store.commits
        for name, fail in (("a", False), ("b", True), ("c", False), ("d", True), ("e", False)):
            group.start_soon(write, name, fail)
        await anyio.sleep(0.2)  # all five are queued behind it
        release.set()
    # The holder's batch, then one batch (one COMMIT) for all five.
    assert store.commits - commits_before == 2
    assert isinstance(outcomes["b"], _Refused) and isinstance(outcomes["d"], _Refused)
    names = {row[0] for row in store._query("SELECT name FROM extensions")}
    assert {"a", "c", "e"} <= names and not names & {"b", "d"}
    events = store.events_after(0)
    assert [event.run_id for event in events] == ["a", "c", "e"]
    # The chain has no gap where the rolled-back units' events were, and each
    # caller was told the seq its event really has.
    assert [outcomes[name] for name in "ace"] == [event.seq for event in events]
    assert store.verify_chain().ok
    assert store.check_anchor().ok
    assert store.check_anchor().anchor_seq == events[-1].seq  # (on PostgreSQL, this host's)
    # What the writer handed to observers is what committed, nothing rolled back.
    assert [event.run_id for event in store.take_committed_events()] == ["a", "c", "e"]
    store.close()
    reopened = open_store(database)
    assert reopened.verify_chain().ok and reopened.verify_state().ok
    reopened.close()


class _SlowCommit:
    """The store's connection with a COMMIT that takes `delay` seconds, noting when it returned."""

    def __init__(self, connection: sqlite3.Connection, delay: float) -> None:
        self._connection = connection
        self.delay = delay
        self.commit_returned: list[float] = []

    def execute(self, sql: str, parameters: Any = ()) -> sqlite3.Cursor:
        if sql == "COMMIT":
            time.sleep(self.delay)
            cursor = self._connection.execute(sql, parameters)
            self.commit_returned.append(time.monotonic())
            return cursor
        return self._connection.execute(sql, parameters)

    @property
    def in_transaction(self) -> bool:
        return self._connection.in_transaction

    def close(self) -> None:
        self._connection.close()


@pytest.mark.anyio
async def test_a_connection_that_breaks_mid_batch_fails_every_unit_of_it_and_nothing_stands(
    postgres_server: Any,
) -> None:
    import psycopg

    url = str(postgres_server.database())
    store = open_store(url)
    release = threading.Event()
    outcomes: dict[str, Any] = {}

    def breaking(connection: sqlite3.Connection, store: Store, name: str) -> int:
        seq = _note(connection, store, name)
        # The server ends this session (a restart would) in the middle of the batch.
        database = url.rsplit("/", 1)[1]
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = %s AND application_name = 'agentrt'",
                (database,),
            )
        connection.execute("INSERT INTO extensions (name, version) VALUES ('after', 1)")
        return seq

    async def write(name: str, function: Any) -> None:
        try:
            outcomes[name] = await store.write(function, store, name)
        except Exception as exc:
            outcomes[name] = exc

    async with anyio.create_task_group() as group:
        group.start_soon(_hold_the_writer, store, release)
        await anyio.sleep(0.2)
        for name, function in (("a", _note), ("b", breaking), ("c", _note)):
            group.start_soon(write, name, function)
        await anyio.sleep(0.2)  # all three queued behind the holder: one batch
        release.set()
    # They shared one transaction, so none of them stands, and each is told so.
    for name in "abc":
        assert isinstance(outcomes[name], StoreError), outcomes[name]
        assert "nothing of it was written" in str(outcomes[name])
    assert {row[0] for row in store._query("SELECT name FROM extensions")} & set("abc") == set()
    assert store.take_committed_events() == []
    # The store goes on, on a new connection, and the chain has no gap.
    assert await store.write(_note, store, "d") == 1
    assert store.verify_chain().ok and store.check_anchor().ok
    store.close()


@pytest.mark.anyio
async def test_a_caller_is_answered_only_after_its_commit_returned(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    store = open_store(db)
    slow = _SlowCommit(store._connection, delay=0.4)
    store._connection = slow  # type: ignore[assignment]
    answered: dict[str, float] = {}
    seen_on_disk: dict[str, bool] = {}

    async def write(name: str) -> None:
        await store.write(_note, store, name)
        answered[name] = time.monotonic()
        # Another connection, as another process would: the answer is never
        # ahead of what the database holds.
        other = sqlite3.connect(db)
        try:
            row = other.execute("SELECT 1 FROM extensions WHERE name = ?", (name,)).fetchone()
        finally:
            other.close()
        seen_on_disk[name] = row is not None

    async with anyio.create_task_group() as group:
        for index in range(12):
            group.start_soon(write, f"w{index}")
            await anyio.sleep(0.05)  # they arrive while earlier commits are in flight
    assert all(seen_on_disk.values()) and len(seen_on_disk) == 12
    for name, when in answered.items():
        # Each answer came after some COMMIT returned, and its row is durable.
        assert any(returned <= when for returned in slow.commit_returned), name
    # Twelve writers over ~0.6 s of arrivals shared a handful of slow commits.
    assert len(slow.commit_returned) <= 4
    assert store.verify_chain().ok


_CRASH_CHILD = textwrap.dedent(
    """
    import sys, anyio
    from agentrt import Decision, Gate, Limits, SideEffect, ToolResult, ToolSpec, open_store

    class Note:
        spec = ToolSpec("note", "Note it.", {"type": "object"}, SideEffect.READ_ONLY, 5.0)
        async def call(self, call):
            return ToolResult('"ok"')

    async def worker(gate, index):
        run_id = f"run{index}"
        await gate.start("crash", run_id=run_id)
        print(f"started {run_id}", flush=True)
        step = 0
        while True:
            step += 1
            await gate.step(run_id, Decision.tool_call("note", "{}"))
            print(f"step {run_id} {step}", flush=True)

    async def main():
        gate = Gate(open_store(sys.argv[1]), [Note()], limits=Limits(max_steps=10**6,
                    loop_window=0))
        async with anyio.create_task_group() as group:
            for index in range(int(sys.argv[2])):
                group.start_soon(worker, gate, index)

    anyio.run(main)
    """
)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_crash_mid_batch_keeps_every_acknowledged_write_and_nothing_half_written(
    tmp_path: Path,
) -> None:
    db = tmp_path / "runs.db"
    writers = 32
    child = subprocess.Popen(
        [sys.executable, "-c", _CRASH_CHILD, str(db), str(writers)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert child.stdout is not None
    acknowledged: list[str] = []
    try:
        # Kill it while it is committing batches as fast as it can (every
        # writer has at least a few steps acknowledged by then).
        while len(acknowledged) < writers * 6:
            line = child.stdout.readline().decode()
            assert line, child.stderr.read().decode() if child.stderr else "the child exited"
            acknowledged.append(line.strip())
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
    # Whatever reached the pipe before the kill was acknowledged too.
    acknowledged += [line.strip() for line in child.stdout.read().decode().splitlines()]
    assert child.returncode == -signal.SIGKILL

    store = open_store(db)  # the anchor check passes: nothing committed was lost
    try:
        assert store.verify_chain().ok
        assert store.verify_state().ok
        runs = {run.run_id: run for run in store.list_runs(limit=1000)}
        for line in acknowledged:
            kind, run_id, *rest = line.split()
            assert run_id in runs, f"acknowledged {line!r} is not in the database"
            if kind == "step":
                step = store.get_step(run_id, int(rest[0]))
                assert step is not None and step.status == "succeeded", line
        for run_id, run in runs.items():
            steps = store.list_steps(run_id, limit=100_000)
            events = store.list_events(run_id, limit=100_000)
            types = [event.type for event in events]
            # Rows and events agree step by step: no commit is half in the file.
            assert run.step_count == len(steps) == types.count("step_recorded")
            assert [s.step for s in steps] == list(range(1, len(steps) + 1))
            finished = [s for s in steps if s.status == "succeeded"]
            assert len(finished) == types.count("tool_finished")
            # Only the last step may be between its two commits (`executing`).
            assert all(s.status == "succeeded" for s in steps[:-1]), run_id
            assert types.count("tool_started") == len(steps)
    finally:
        store.close()


@pytest.mark.anyio
async def test_the_anchor_rewritten_in_place_follows_a_file_put_over_it(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    store = open_store(db)
    first = await store.write(_note, store, "one")
    anchor = Path(f"{db}.anchor")
    assert json.loads(anchor.read_text())["seq"] == first
    # Another build (or `write_anchor`) replaces the file by a rename: the store's
    # open descriptor now names a file nobody reads, and must not be written blind.
    replacement = tmp_path / "replacement"
    replacement.write_text(json.dumps({"seq": 0, "hash": "0" * 64}))
    replacement.chmod(0o600)
    os.replace(replacement, anchor)
    second = await store.write(_note, store, "two")
    assert json.loads(anchor.read_text()) == {"seq": second, "hash": store.head()[1]}
    store.close()
    reopened = open_store(db)
    assert reopened.check_anchor().ok
    reopened.close()


@pytest.mark.anyio
async def test_the_anchor_keeps_a_later_head_another_writer_put_in_place(tmp_path: Path) -> None:
    # The store remembers the record it last wrote, so it need not parse the file
    # again while it still holds those bytes; a record another process wrote in
    # place (same file, later seq) differs, is read, and is not moved back.
    db = tmp_path / "runs.db"
    store = open_store(db)
    first = await store.write(_note, store, "one")
    anchor = Path(f"{db}.anchor")
    later = {"seq": first + 2, "hash": "f" * 64}
    with anchor.open("r+b") as handle:
        handle.write(json.dumps(later).ljust(128).encode("ascii"))
    assert await store.write(_note, store, "two") == first + 1
    assert json.loads(anchor.read_text()) == later
    assert await store.write(_note, store, "three") == first + 2
    assert json.loads(anchor.read_text()) == later
    fourth = await store.write(_note, store, "four")
    assert json.loads(anchor.read_text()) == {"seq": fourth, "hash": store.head()[1]}
    store.close()


@pytest.mark.anyio
async def test_a_failing_write_alone_in_its_batch_leaves_nothing(database: str | Path) -> None:
    store = open_store(database)
    kept = await store.write(_note, store, "kept")
    with pytest.raises(_Refused):
        await store.write(_note, store, "refused", True)
    after = await store.write(_note, store, "after")
    names = {row[0] for row in store._query("SELECT name FROM extensions")}
    assert "refused" not in names and {"kept", "after"} <= names
    assert after == kept + 1 and store.verify_chain().ok
    store.close()


@pytest.mark.anyio
async def test_a_write_unit_and_a_run_take_keyword_arguments(tmp_path: Path) -> None:
    store = open_store(tmp_path / "runs.db")
    await store.write(_note, store, "kept", fail=False)
    with pytest.raises(_Refused):
        await store.write(_note, store, "refused", fail=True)
    rows = await store.run(store.query, "SELECT name FROM extensions", parameters=())
    names = {row[0] for row in rows}
    assert "kept" in names and "refused" not in names
    store.close()


class _SeeingPolicy:
    """Allows everything, noting the step count of the run view it was shown."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    async def evaluate(self, request: ToolRequest, run: RunView) -> PolicyDecision:
        self.seen.append(run.step_count)
        return PolicyDecision.allow()


@pytest.mark.anyio
async def test_a_step_on_a_run_another_gate_moved_is_decided_again_on_the_fresh_run(
    database: str | Path,
) -> None:
    db = database
    read = RecordingTool("read", SideEffect.READ_ONLY)
    seen_first, seen_second = _SeeingPolicy(), _SeeingPolicy()
    first = Gate(open_store(db), [read], policy=seen_first, lease_ttl=0.3)
    second = Gate(open_store(db), [read], policy=seen_second, lease_ttl=0.3)
    run_id = await first.start("moved")
    await first.step(run_id, Decision.tool_call("read", '{"path": "a"}'))
    await anyio.sleep(0.5)  # the first gate's lease lapses
    await second.step(run_id, Decision.tool_call("read", '{"path": "b"}'))
    await anyio.sleep(0.5)
    # The first gate remembers the run at step 1; it is at step 2 now.
    outcome = await first.step(run_id, Decision.tool_call("read", '{"path": "c"}'))
    assert outcome.observation is not None and outcome.observation.step == 3
    # Its policy was asked again with the run as it is, and the stale decision
    # left nothing behind.
    assert seen_first.seen == [0, 1, 2] and seen_second.seen == [1]
    steps = first.store.list_steps(run_id)
    assert [(s.step, s.args, s.status) for s in steps] == [
        (1, '{"path": "a"}', "succeeded"),
        (2, '{"path": "b"}', "succeeded"),
        (3, '{"path": "c"}', "succeeded"),
    ]
    assert first.store.verify_chain().ok and first.store.verify_state().ok
    first.store.close()
    second.store.close()


def _hold_the_write_lock(other: Store) -> tuple[threading.Thread, threading.Event]:
    """Another writer (`other`, a store of its own) takes the write lock in a thread, once
    it holds it; it keeps it until the returned event is set (the thread then commits)."""
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with other.transaction() as connection:
            other.append_event(connection, "other", "note", {"by": "another writer"})
            holding.set()
            if not release.wait(timeout=30):
                raise TimeoutError("the test never released the write lock")

    thread = threading.Thread(target=hold)
    thread.start()
    assert holding.wait(10)
    return thread, release


@pytest.mark.anyio
async def test_writes_queued_while_the_writer_waits_for_the_write_lock_share_its_transaction(
    database: str | Path,
) -> None:
    """Decision 0055: a writer that had to wait for the write lock (another process held
    it) carries every write that queued meanwhile in the same hold: one BEGIN, one
    lock, one COMMIT for all of them, each still in its own savepoint."""
    waiting, other = open_store(database), open_store(database)
    thread, release = _hold_the_write_lock(other)
    seqs: dict[str, int] = {}

    async def write(name: str, fail: bool = False) -> None:
        try:
            seqs[name] = await waiting.write(_note, waiting, name, fail)
        except _Refused:
            seqs[name] = -1

    async with anyio.create_task_group() as group:
        group.start_soon(write, "first")
        await anyio.sleep(0.05)  # submitted
        writer = waiting._writer_thread()
        for _ in range(1000):  # until the writer took it, to wait for the lock
            if writer._queue.empty():
                break
            await anyio.sleep(0.01)
        await anyio.sleep(0.1)
        for name in ("late-0", "late-1", "late-2"):
            group.start_soon(write, name)
        group.start_soon(write, "late-refused", True)
        await anyio.sleep(0.3)
        assert not seqs  # nobody answered while the lock was another's
        release.set()
    thread.join()
    assert waiting.commits == 1
    assert sorted(seqs.values()) == [-1, 2, 3, 4, 5]
    assert seqs["first"] == 2  # in the order they were queued
    report = waiting.verify_chain()
    assert report.ok and report.checked == 5
    names = {row[0] for row in waiting.query("SELECT name FROM extensions")}
    assert {"first", "late-0", "late-1", "late-2"} <= names and "late-refused" not in names
    waiting.close()
    other.close()


@pytest.mark.anyio
async def test_a_write_never_run_because_the_transaction_ended_under_its_batch_is_told_so(
    database: str | Path,
) -> None:
    """A unit whose failure ended the whole transaction (SQLite rolls back on a full disk
    or an I/O error; PostgreSQL's session ended, as a terminated backend does) leaves the
    units after it in the batch unrun: each is told nothing of it was written, never
    answered as if it had been."""
    store = open_store(database)
    release = threading.Event()

    def ended(connection: Any) -> None:
        connection.execute("ROLLBACK")  # the database ended the transaction under the unit
        raise _Refused("the transaction ended under this write")

    outcomes: dict[str, Any] = {}

    async def write(name: str, function: Any, *args: Any) -> None:
        try:
            outcomes[name] = await store.write(function, *args)
        except (StoreError, _Refused) as exc:
            outcomes[name] = exc

    async with anyio.create_task_group() as group:
        group.start_soon(_hold_the_writer, store, release)
        await anyio.sleep(0.2)
        group.start_soon(write, "ended", ended)
        await anyio.sleep(0.05)
        group.start_soon(write, "after it", _note, store, "after it")
        await anyio.sleep(0.2)
        release.set()
    assert isinstance(outcomes["ended"], _Refused)
    assert isinstance(outcomes["after it"], StoreError), outcomes["after it"]
    assert "nothing of it was written" in str(outcomes["after it"])
    # Nothing of it stands, and the next write goes on from the chain's head.
    assert not store.query("SELECT name FROM extensions WHERE name = 'after it'")
    assert await store.write(_note, store, "next") == 1
    report = store.verify_chain()
    assert report.ok and report.checked == 1
    store.close()


@pytest.mark.anyio
async def test_two_stores_deciding_one_approval_at_once_leave_one_decision_and_refuse_the_other(
    database: str | Path,
) -> None:
    """Two processes decide the same run's approval while a third holds the write lock
    (a person approving in the CLI while another rejects it in the inbox): once the lock
    is free, one decision commits and the other is refused by its check (the approval is
    no longer pending, or the run no longer waits), with nothing of it written.  The
    check-then-write a finer lock than the one write lock must keep (decision 0058)."""
    write = RecordingTool("write", SideEffect.LOCAL_MUTATION)
    gate = Gate(open_store(database), [write], policy=approval_policy())
    run_id = await gate.start("decided twice at once")
    asked = (await gate.step(run_id, Decision.tool_call("write", '{"path": "a"}'))).approval
    assert asked is not None
    approving, rejecting, other = open_store(database), open_store(database), open_store(database)
    holder, release = _hold_the_write_lock(other)

    outcomes: dict[str, BaseException | str] = {}

    def decide(name: str) -> None:
        try:
            if name == "approve":
                approve(approving, run_id, approval_hash=asked.approval_hash, by="cli")
            else:
                reject(rejecting, run_id, approval_hash=asked.approval_hash, by="inbox")
            outcomes[name] = "decided"
        except (ApprovalError, RunStateError) as exc:
            outcomes[name] = exc

    deciders = [threading.Thread(target=decide, args=(name,)) for name in ("approve", "reject")]
    for thread in deciders:
        thread.start()
    time.sleep(0.3)  # both are waiting for the write lock
    assert outcomes == {}
    release.set()
    holder.join()
    for thread in deciders:
        thread.join(30)
    assert sorted(outcomes) == ["approve", "reject"]
    winners = [name for name, outcome in outcomes.items() if outcome == "decided"]
    assert len(winners) == 1, outcomes
    loser = "reject" if winners == ["approve"] else "approve"
    assert isinstance(outcomes[loser], (ApprovalError, RunStateError))
    # The run's one decision event, none of the loser's.
    decided = [
        event.type
        for event in gate.store.list_events(run_id)
        if event.type in ("approval_granted", "approval_rejected")
    ]
    assert decided == (["approval_granted"] if winners == ["approve"] else ["approval_rejected"])
    approval = gate.store.get_approval(asked.approval_id)
    run = gate.store.get_run(run_id)
    if winners == ["approve"]:
        assert (approval.status, approval.decided_by) == (ApprovalStatus.APPROVED, "cli")
        assert run.status is RunStatus.WAITING_FOR_APPROVAL
    else:
        assert (approval.status, approval.decided_by) == (ApprovalStatus.REJECTED, "inbox")
        assert run.status is RunStatus.CANCELLED
    assert write.calls == []
    assert gate.store.verify_chain().ok and gate.store.verify_state().ok
    for store in (approving, rejecting, other, gate.store):
        store.close()
