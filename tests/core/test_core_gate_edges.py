"""The gate at the edges (issue 10): a busy database, a full disk, a lease taken
over mid-call, and rows changed behind the events."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import anyio
import pytest
from _postgres import raw_connect

from agentrt import (
    ApprovalError,
    Decision,
    Gate,
    RunLeased,
    RunStatus,
    SideEffect,
    StepStatus,
    ToolCall,
    ToolResult,
    ToolSpec,
    approve,
    cancel,
    open_store,
    reject,
)
from agentrt.errors import LeaseLost, ResultNotRecorded, StoreBusy, StoreError
from agentrt.gate import INTERRUPTED_SIDE_EFFECT, Limits
from agentrt.policy import ClassPolicy, Outcome

from .helpers import RecordingTool, approval_policy

pytestmark = pytest.mark.anyio

_ALLOW_ALL = ClassPolicy(
    {
        SideEffect.READ_ONLY: Outcome.ALLOW,
        SideEffect.LOCAL_MUTATION: Outcome.ALLOW,
        SideEffect.REMOTE_MUTATION: Outcome.ALLOW,
    }
)


def _hold_write_lock(database: Path, seconds: float, held: threading.Event) -> threading.Thread:
    """Another writer: a second connection holding `BEGIN IMMEDIATE` for `seconds`."""

    def hold() -> None:
        other = sqlite3.connect(database, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        held.set()
        time.sleep(seconds)
        other.execute("COMMIT")
        other.close()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    return thread


class _Hook:
    """A mutating tool that runs a test's hook while it is being called, then answers."""

    def __init__(self, name: str, *, timeout: float, content: str = '{"ok":true}') -> None:
        self.spec = ToolSpec(
            name, f"the {name} tool", {"type": "object"}, SideEffect.LOCAL_MUTATION, timeout
        )
        self.content = content
        self.calls: list[ToolCall] = []
        self.during: object = None

    async def call(self, call: ToolCall) -> ToolResult:
        self.calls.append(call)
        during = self.during
        if callable(during):
            await during()
        return ToolResult(self.content, "done")


# -- item 4: SQLite never blocks the event loop -----------------------------


@pytest.mark.timeout(60)
async def test_a_database_held_by_another_writer_never_stalls_the_event_loop(
    tmp_path: Path,
) -> None:
    database = tmp_path / "runs.db"
    store = open_store(database)
    tool = _Hook("write", timeout=20.0)
    # lease 4 s: the heartbeat beats every 1.33 s, and this call outlasts half
    # the lease, so it runs with one.
    gate = Gate(store, [tool], policy=_ALLOW_ALL, lease_ttl=4.0)
    rival = Gate(open_store(database), [tool], policy=_ALLOW_ALL, lease_ttl=4.0)
    run_id = await gate.start("write under a busy database")
    gaps: list[float] = []
    lock_freed = threading.Event()
    seen: dict[str, object] = {}

    async def ticker() -> None:
        last = time.monotonic()
        while True:
            await anyio.sleep(0.02)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    async def during() -> None:
        held = threading.Event()
        before = store.get_run(run_id).lease_expires_at
        holder = _hold_write_lock(database, 3.0, held)
        await anyio.to_thread.run_sync(held.wait)
        # The heartbeat's renewal is due at 1.33 s and waits on the lock till 3 s.
        await anyio.to_thread.run_sync(holder.join)
        lock_freed.set()
        await anyio.sleep(0.5)
        after = store.get_run(run_id).lease_expires_at
        seen["renewed"] = before is not None and after is not None and after > before + 1.0
        # A second gate looking now finds a live lease: nothing is declared interrupted.
        try:
            await rival.resume(run_id)
        except RunLeased:
            seen["rival"] = "refused"

    tool.during = during
    async with anyio.create_task_group() as group:
        group.start_soon(ticker)
        outcome = await gate.step(run_id, Decision.tool_call("write", "{}"))
        group.cancel_scope.cancel()
    assert lock_freed.is_set()
    assert max(gaps) < 0.75, f"the event loop stalled for {max(gaps):.2f}s"
    assert seen == {"renewed": True, "rival": "refused"}
    assert outcome.observation is not None and outcome.observation.kind == "result"
    assert store.get_step(run_id, 1).status is StepStatus.SUCCEEDED  # type: ignore[union-attr]
    assert [event.type for event in store.list_events(run_id)][-1] == "tool_finished"
    assert store.verify_chain().ok and store.verify_state().ok
    assert len(tool.calls) == 1


def test_a_write_waits_out_a_busy_database_only_until_its_deadline(tmp_path: Path) -> None:
    database = tmp_path / "runs.db"
    store = open_store(database)
    store.busy_deadline = 0.5
    held = threading.Event()
    holder = _hold_write_lock(database, 3.0, held)
    held.wait()
    began = time.monotonic()
    with (
        pytest.raises(StoreBusy, match=r"stayed locked by another writer for 0\.5s; nothing was"),
        store.transaction() as connection,
    ):
        store.append_event(connection, "r", "never", {})
    waited = time.monotonic() - began
    assert 0.4 < waited < 2.5
    # Reads go on meanwhile (WAL), and nothing was written.
    assert store.head() == (0, store.head()[1]) and store.take_committed_events() == []
    holder.join()
    with store.transaction() as connection:
        store.append_event(connection, "r", "after", {})
    assert store.head()[0] == 1


@pytest.mark.timeout(60)
async def test_a_renewal_stuck_on_a_locked_database_does_not_hold_back_the_result(
    tmp_path: Path,
) -> None:
    """Issue 38: the lease's renewal and then the result's write meet another writer's
    lock.  The call must learn its result was not recorded one busy deadline after the
    tool returned, not once the renewal has also waited out its own."""
    database = tmp_path / "runs.db"
    store = open_store(database)
    store.busy_deadline = 2.0
    tool = _Hook("write", timeout=20.0)
    # Lease 3 s: the call outlasts half of it, so its first renewal falls due 1 s in.
    gate = Gate(store, [tool], policy=_ALLOW_ALL, lease_ttl=3.0)
    run_id = await gate.start("write while another writer takes the database")
    held = threading.Event()
    holders: list[threading.Thread] = []
    returned: list[float] = []

    async def during() -> None:
        # Held past both waits: the renewal's (1 s to 3 s) and the result's.
        holders.append(_hold_write_lock(database, 6.0, held))
        await anyio.to_thread.run_sync(held.wait)
        await anyio.sleep(1.5)
        returned.append(time.monotonic())

    tool.during = during
    with pytest.raises(ResultNotRecorded) as refused:
        await gate.step(run_id, Decision.tool_call("write", "{}"))
    waited = time.monotonic() - returned[0]
    assert isinstance(refused.value.cause, StoreBusy)
    assert waited < store.busy_deadline + 0.75, f"told {waited:.2f}s after the tool returned"
    holders[0].join()
    step = store.get_step(run_id, 1)
    assert step is not None and step.status is StepStatus.EXECUTING
    assert store.verify_chain().ok and store.verify_state().ok
    assert len(tool.calls) == 1


async def test_a_write_queued_behind_one_waiting_on_a_locked_database_waits_one_deadline(
    tmp_path: Path,
) -> None:
    """Issue 38: a write submitted while the store's writer waits out another process's
    lock for an earlier one gives up one deadline after it was submitted, not after the
    earlier write's wait and then a whole one of its own."""
    database = tmp_path / "runs.db"
    store = open_store(database)
    store.busy_deadline = 2.0
    held = threading.Event()
    holder = _hold_write_lock(database, 6.0, held)
    await anyio.to_thread.run_sync(held.wait)
    waits: dict[str, float] = {}

    def append(connection: sqlite3.Connection, name: str) -> None:
        store.append_event(connection, "r", name, {})

    async def write(name: str) -> None:
        began = time.monotonic()
        with pytest.raises(StoreBusy):
            await store.write(append, name)
        waits[name] = time.monotonic() - began

    async with anyio.create_task_group() as group:
        group.start_soon(write, "first")
        await anyio.sleep(0.5)
        group.start_soon(write, "queued")
    assert waits["first"] < store.busy_deadline + 0.5, waits
    assert waits["queued"] < store.busy_deadline + 0.5, waits
    holder.join()
    assert store.head()[0] == 0


# -- item 3: a result is recorded only by the lease holder, and never lost ----


@pytest.mark.timeout(60)
async def test_a_full_disk_while_recording_leaves_the_call_interrupted_not_lost(
    tmp_path: Path,
) -> None:
    database = tmp_path / "runs.db"
    store = open_store(database)
    tool = _Hook("write", timeout=5.0, content='"' + "x" * 200_000 + '"')
    gate = Gate(store, [tool], policy=_ALLOW_ALL)
    run_id = await gate.start("write, then the disk fills")

    async def fill_the_disk() -> None:
        pages = store._query("PRAGMA page_count")[0][0]
        # SQLite's own size cap: the next page it needs fails with SQLITE_FULL,
        # exactly as a full disk does.
        store._query(f"PRAGMA max_page_count = {pages}")

    tool.during = fill_the_disk
    with pytest.raises(ResultNotRecorded) as refused:
        await gate.step(run_id, Decision.tool_call("write", "{}"))
    assert isinstance(refused.value.cause, sqlite3.OperationalError)
    assert "full" in str(refused.value.cause)
    assert (refused.value.run_id, refused.value.step) == (run_id, 1)
    assert "its outcome is unknown" in str(refused.value)
    store._query("PRAGMA max_page_count = 1073741823")
    # The call happened; the step still says so, and nothing claims it finished.
    step = store.get_step(run_id, 1)
    assert step is not None and step.status is StepStatus.EXECUTING
    assert "tool_finished" not in [event.type for event in store.list_events(run_id)]
    # The gate let its lease go, so recovery need not wait for it to lapse: the
    # mutating call pauses on an interrupted_side_effect approval.
    recovering = Gate(open_store(database), [tool], policy=_ALLOW_ALL)
    outcome = await recovering.resume(run_id)
    assert outcome.status is RunStatus.WAITING_FOR_APPROVAL
    assert outcome.approval is not None and outcome.approval.kind == INTERRUPTED_SIDE_EFFECT
    assert len(tool.calls) == 1
    assert store.verify_chain().ok and store.verify_state().ok


async def test_a_gate_that_could_not_record_or_release_a_run_takes_it_over_itself_at_once(
    database: str | Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The database refuses the result and then the lease's release (it went away):
    # the lease still names this gate for half a minute, but nothing here runs the call.
    store = open_store(database)
    tool = _Hook("write", timeout=20.0)
    gate = Gate(store, [tool], policy=_ALLOW_ALL, lease_ttl=30.0)
    run_id = await gate.start("its result and its release are both refused")

    def refused(*_: object) -> None:
        raise StoreError("database gone for a moment")

    monkeypatch.setattr(gate, "_write_result", refused)
    monkeypatch.setattr(gate._leases, "_clear", refused)
    with pytest.raises(ResultNotRecorded):
        await gate.step(run_id, Decision.tool_call("write", "{}"))
    monkeypatch.undo()
    assert (store.get_run(run_id).lease_expires_at or 0.0) > time.time() + 20
    # Not "already being run by this gate": it pauses on the interrupted call at once.
    outcome = await gate.resume(run_id)
    assert outcome.status is RunStatus.WAITING_FOR_APPROVAL
    assert outcome.approval is not None and outcome.approval.kind == INTERRUPTED_SIDE_EFFECT
    assert len(tool.calls) == 1
    assert store.verify_chain().ok and store.verify_state().ok


@pytest.mark.timeout(60)
async def test_a_late_result_is_not_recorded_over_a_run_taken_over_mid_call(
    database: str | Path,
) -> None:
    store = open_store(database)
    tool = _Hook("write", timeout=20.0)
    first = Gate(store, [tool], policy=_ALLOW_ALL, lease_ttl=30.0)
    second = Gate(open_store(database), [tool], policy=_ALLOW_ALL, lease_ttl=30.0)
    run_id = await first.start("taken over while the tool runs")
    taken: dict[str, object] = {}

    async def lapse_and_take_over() -> None:
        # The first gate's lease lapses (a stalled heartbeat), and the second
        # gate takes the run over as it would after a crash.
        raw = raw_connect(database)
        raw.execute("UPDATE runs SET lease_expires_at = 1 WHERE run_id = ?", (run_id,))
        raw.close()
        outcome = await second.resume(run_id)
        taken["status"] = outcome.status
        taken["approval"] = outcome.approval

    tool.during = lapse_and_take_over
    with pytest.raises(ResultNotRecorded) as refused:
        await first.step(run_id, Decision.tool_call("write", "{}"))
    assert isinstance(refused.value.cause, LeaseLost)
    # The second gate's state stands: the step is the interrupted one it waits on.
    assert taken["status"] is RunStatus.WAITING_FOR_APPROVAL
    run = store.get_run(run_id)
    assert run.status is RunStatus.WAITING_FOR_APPROVAL
    step = store.get_step(run_id, 1)
    assert step is not None and step.status is StepStatus.WAITING and step.content is None
    waiting = store.waiting_approval(run_id)
    assert waiting is not None and waiting.kind == INTERRUPTED_SIDE_EFFECT
    assert "tool_finished" not in [event.type for event in store.list_events(run_id)]
    # ... and the second gate carries on under its own lease once approved.
    approve(store, run_id, approval_hash=waiting.approval_hash)
    tool.during = None
    outcome = await second.resume(run_id)
    assert outcome.observation is not None and outcome.observation.kind == "result"
    assert len(tool.calls) == 2
    assert store.verify_chain().ok and store.verify_state().ok


async def test_a_result_for_a_step_no_longer_executing_writes_nothing_under_the_same_lease(
    database: str | Path,
) -> None:
    # The result's first update (the run, compared on the lease token) succeeds
    # here; its second (the step, compared on `executing`) does not: the whole
    # unit rolls back, so the run row keeps what it held, not half a result.
    store = open_store(database)
    tool = _Hook("write", timeout=5.0)
    gate = Gate(store, [tool], policy=_ALLOW_ALL, lease_ttl=30.0)
    run_id = await gate.start("the step was decided elsewhere while the tool ran")
    before: dict[str, object] = {}

    async def decide_the_step_elsewhere() -> None:
        raw = raw_connect(database)
        raw.execute(
            "UPDATE steps SET status = 'interrupted' WHERE run_id = ? AND step = 1", (run_id,)
        )
        raw.close()
        run = store.get_run(run_id)
        before["row"] = (run.consecutive_failures, run.updated_at, run.step_count)
        before["events"] = store.count_events(run_id)

    tool.during = decide_the_step_elsewhere
    with pytest.raises(ResultNotRecorded) as refused:
        await gate.step(run_id, Decision.tool_call("write", "{}"))
    assert isinstance(refused.value.cause, LeaseLost)
    run = store.get_run(run_id)
    assert (run.consecutive_failures, run.updated_at, run.step_count) == before["row"]
    assert store.count_events(run_id) == before["events"]
    step = store.get_step(run_id, 1)
    assert step is not None and step.status is StepStatus.INTERRUPTED and step.content is None
    assert store.verify_chain().ok


async def test_a_gate_retaking_its_own_lapsed_lease_refuses_the_old_calls_result(
    database: str | Path,
) -> None:
    store = open_store(database)
    tool = _Hook("write", timeout=20.0)
    gate = Gate(store, [tool], policy=_ALLOW_ALL, lease_ttl=30.0)
    run_id = await gate.start("same gate, new acquisition")

    async def lapse_and_retake() -> None:
        raw = raw_connect(database)
        raw.execute("UPDATE runs SET lease_expires_at = 1 WHERE run_id = ?", (run_id,))
        raw.close()
        await gate.resume(run_id)

    tool.during = lapse_and_retake
    with pytest.raises(ResultNotRecorded):
        await gate.step(run_id, Decision.tool_call("write", "{}"))
    assert store.get_run(run_id).status is RunStatus.WAITING_FOR_APPROVAL
    assert store.get_step(run_id, 1).status is StepStatus.WAITING  # type: ignore[union-attr]


# -- item 10: the tables agree with the events ------------------------------


async def test_an_approval_approved_by_hand_is_refused_by_resume_and_named_by_verify(
    database: str | Path,
) -> None:
    store = open_store(database)
    write = RecordingTool("write", SideEffect.LOCAL_MUTATION)
    gate = Gate(store, [write], policy=approval_policy())
    run_id = await gate.start("needs an approval")
    outcome = await gate.step(run_id, Decision.tool_call("write", '{"path": "a"}'))
    assert outcome.approval is not None
    approval_id = outcome.approval.approval_id
    assert store.verify_state().ok
    raw = raw_connect(database)
    raw.execute("UPDATE approvals SET status = 'approved' WHERE approval_id = ?", (approval_id,))
    raw.close()
    with pytest.raises(ApprovalError, match="no approval_granted event grants it"):
        await gate.resume(run_id)
    assert write.calls == []
    assert store.get_approval(approval_id).status == "approved"  # nothing was spent
    assert store.verify_chain().ok  # the chain alone cannot see it
    report = store.verify_state()
    assert not report.ok and report.first_bad == f"approval {approval_id}"
    assert report.reason == (
        f"approval {approval_id} is approved but its latest state event "
        f"(event {store.list_events(run_id)[-1].seq}, approval_requested) leaves it pending"
    )


async def test_a_run_set_back_to_running_by_hand_is_named_by_verify(database: str | Path) -> None:
    store = open_store(database)
    gate = Gate(store, [RecordingTool("read", SideEffect.READ_ONLY)])
    kept = await gate.start("kept")
    ended = await gate.start("cancelled")
    cancel(store, ended)
    raw = raw_connect(database)
    raw.execute("UPDATE runs SET status = 'running' WHERE run_id = ?", (ended,))
    raw.close()
    report = store.verify_state()
    assert not report.ok and report.first_bad == f"run {ended}"
    assert "is running but its latest state event" in report.reason
    assert "run_cancelled) leaves it cancelled" in report.reason
    assert store.get_run(kept).status is RunStatus.RUNNING


async def test_a_resume_event_without_its_grant_is_named_by_verify(database: str | Path) -> None:
    store = open_store(database)
    write = RecordingTool("write", SideEffect.LOCAL_MUTATION)
    gate = Gate(store, [write], policy=approval_policy())
    run_id = await gate.start("a forged resume")
    outcome = await gate.step(run_id, Decision.tool_call("write", '{"path": "a"}'))
    assert outcome.approval is not None
    # Someone able to rewrite the chain (every hash recomputed) forges the resume.
    with store.transaction() as connection:
        forged = store.append_event(
            connection, run_id, "run_resumed",
            {"approval_id": outcome.approval.approval_id, "outcome": "allow"},
        )  # fmt: skip
    report = store.verify_state()
    assert not report.ok and report.first_bad == f"event {forged.seq}"
    assert "which no approval_granted event granted" in report.reason


async def test_the_tables_agree_with_the_events_after_every_kind_of_run(
    database: str | Path,
) -> None:
    store = open_store(database)
    write = RecordingTool("write", SideEffect.LOCAL_MUTATION, terminal=True)
    read = RecordingTool("read", SideEffect.READ_ONLY)
    gate = Gate(store, [write, read], policy=approval_policy(), limits=Limits(grant_ttl=0.2))
    ask = Decision.tool_call("write", '{"path": "a"}')

    approved = await gate.start("approved and used")
    waiting = (await gate.step(approved, ask)).approval
    assert waiting is not None
    approve(store, approved, approval_hash=waiting.approval_hash)
    assert (await gate.resume(approved)).status is RunStatus.COMPLETED

    rejected = await gate.start("rejected")
    waiting = (await gate.step(rejected, ask)).approval
    assert waiting is not None
    reject(store, rejected, approval_hash=waiting.approval_hash, note="no")

    cancelled = await gate.start("cancelled while waiting")
    await gate.step(cancelled, ask)
    cancel(store, cancelled)

    lapsed = await gate.start("grant expired")
    waiting = (await gate.step(lapsed, ask)).approval
    assert waiting is not None
    approve(store, lapsed, approval_hash=waiting.approval_hash)
    await anyio.sleep(0.3)
    assert (await gate.resume(lapsed)).reason == "grant_expired"

    expiring = Gate(store, [write], policy=approval_policy(), limits=Limits(approval_ttl=0.1))
    unanswered = await expiring.start("approval expired")
    await expiring.step(unanswered, ask)
    await anyio.sleep(0.2)
    assert (await expiring.resume(unanswered)).reason == "approval_expired"

    reading = await gate.start("reads and completes")
    await gate.step(reading, Decision.tool_call("read", '{"path": "a"}'))
    await gate.step(reading, Decision.complete("done"))

    report = store.verify_state()
    assert report.ok, report.reason
    assert store.verify_chain().ok


async def test_a_gate_keeps_no_lease_token_for_runs_that_ended_or_wait(
    database: str | Path,
) -> None:
    store = open_store(database)
    write = RecordingTool("write", SideEffect.LOCAL_MUTATION, terminal=True)
    read = RecordingTool("read", SideEffect.READ_ONLY, terminal=True)
    gate = Gate(store, [write, read], policy=approval_policy())
    for _ in range(20):
        run_id = await gate.start("one call")
        await gate.step(run_id, Decision.tool_call("read", '{"path": "a"}'))
    waiting = await gate.start("waits")
    await gate.step(waiting, Decision.tool_call("write", '{"path": "a"}'))
    assert gate._leases.held_runs == frozenset()


# -- the lease kept through a long call, without a task for a short one ------------


def _renewing_tasks() -> list[str]:
    """The running tasks that renew a lease, by the coroutines they are awaiting."""
    import asyncio

    found = []
    for task in asyncio.all_tasks():
        awaited: object = task.get_coro()
        while awaited is not None:
            name = getattr(awaited, "__qualname__", "")
            if name.endswith((".heartbeat", "._renew")):
                found.append(name)
                break
            awaited = getattr(awaited, "cr_await", None)
    return found


def _counting_renewals(gate: Gate) -> list[float]:
    """When each of `gate`'s lease renewals (`Leases.renew`) happened (monotonic)."""
    renewed_at: list[float] = []
    renew = gate._leases.renew

    def counting(run_id: str) -> bool:
        renewed_at.append(time.monotonic())
        return renew(run_id)

    gate._leases.renew = counting  # type: ignore[method-assign]
    return renewed_at


async def test_a_call_that_ends_before_a_third_of_its_lease_runs_no_renewing_task(
    tmp_path: Path,
) -> None:
    store = open_store(tmp_path / "runs.db")
    # Its timeout outlasts half the lease, so the lease is kept through the call.
    tool = _Hook("write", timeout=20.0)
    gate = Gate(store, [tool], policy=_ALLOW_ALL, lease_ttl=30.0)
    renewals = _counting_renewals(gate)
    seen: list[list[str]] = []

    async def during() -> None:
        await anyio.sleep(0.1)  # long enough for a task started with the call to be running
        seen.append(_renewing_tasks())

    tool.during = during
    run_id = await gate.start("a short call")
    outcome = await gate.step(run_id, Decision.tool_call("write", "{}"))
    assert outcome.observation is not None and outcome.observation.kind == "result"
    assert seen == [[]]
    assert renewals == []
    assert _renewing_tasks() == []


@pytest.mark.timeout(30)
async def test_a_call_past_a_third_of_its_lease_renews_it_then_and_stops_before_its_result(
    tmp_path: Path,
) -> None:
    store = open_store(tmp_path / "runs.db")
    tool = _Hook("write", timeout=20.0)
    gate = Gate(store, [tool], policy=_ALLOW_ALL, lease_ttl=0.9)
    renewed_at = _counting_renewals(gate)
    began: list[float] = []
    expiry: list[float | None] = []

    async def during() -> None:
        began.append(time.monotonic())
        before = store.get_run(run_id).lease_expires_at
        # Three times the lease: it would have run out twice over without renewals.
        await anyio.sleep(2.7)
        after = store.get_run(run_id).lease_expires_at
        expiry.extend([before, after])

    tool.during = during
    run_id = await gate.start("a long call")
    outcome = await gate.step(run_id, Decision.tool_call("write", "{}"))
    assert outcome.observation is not None and outcome.observation.kind == "result"
    before, after = expiry
    assert before is not None and after is not None and after > before + 1.5
    # The first renewal falls a third of the lease in (0.3 s), not a whole beat later.
    assert renewed_at and 0.25 <= renewed_at[0] - began[0] < 0.9
    assert len(renewed_at) >= 4
    # The renewing task ended with the call: nothing renews the lease afterwards.
    assert _renewing_tasks() == []
    count = len(renewed_at)
    await anyio.sleep(0.5)
    assert len(renewed_at) == count


@pytest.mark.timeout(30)
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_a_lease_renewal_that_fails_never_turns_the_calls_result_into_a_failure(
    tmp_path: Path, anyio_backend: str
) -> None:
    # On asyncio the renewing task started by the timer, on trio the task group's.
    store = open_store(tmp_path / "runs.db")
    tool = _Hook("write", timeout=20.0, content='{"written":true}')
    gate = Gate(store, [tool], policy=_ALLOW_ALL, lease_ttl=0.9)
    renew = gate._leases.renew
    attempts: list[float] = []

    def failing_twice(run_id: str) -> bool:
        attempts.append(time.monotonic())
        if len(attempts) <= 2:
            raise RuntimeError("the renewal broke")
        return renew(run_id)

    gate._leases.renew = failing_twice  # type: ignore[method-assign]
    expiry: list[float | None] = []

    async def during() -> None:
        expiry.append(store.get_run(run_id).lease_expires_at)
        await anyio.sleep(1.5)  # past the two failed renewals and at least one more
        expiry.append(store.get_run(run_id).lease_expires_at)

    tool.during = during
    run_id = await gate.start("a long call whose lease renewal breaks")
    outcome = await gate.step(run_id, Decision.tool_call("write", "{}"))
    # The tool ran and answered: that is what the caller is told and what is recorded.
    assert outcome.observation is not None
    assert (outcome.observation.kind, outcome.observation.content) == ("result", '{"written":true}')
    (step,) = store.list_steps(run_id)
    assert (step.status, step.content) == (StepStatus.SUCCEEDED, '{"written":true}')
    # The failures were tried again at the next beats, and a later renewal kept the lease.
    assert len(attempts) >= 3
    before, after = expiry
    assert before is not None and after is not None and after > before
    assert store.get_run(run_id).status is RunStatus.RUNNING
    assert store.verify_chain().ok


@pytest.mark.timeout(30)
@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_on_an_event_loop_other_than_asyncio_a_long_call_keeps_its_lease_renewed(
    tmp_path: Path, anyio_backend: str
) -> None:
    # No asyncio loop, so no timer: the renewing task runs for the whole call (decision 0021).
    store = open_store(tmp_path / "runs.db")
    tool = _Hook("write", timeout=20.0)
    gate = Gate(store, [tool], policy=_ALLOW_ALL, lease_ttl=0.9)
    renewed_at = _counting_renewals(gate)
    expiry: list[float | None] = []

    async def during() -> None:
        expiry.append(store.get_run(run_id).lease_expires_at)
        await anyio.sleep(2.7)  # three times the lease
        expiry.append(store.get_run(run_id).lease_expires_at)

    tool.during = during
    run_id = await gate.start("a long call on trio")
    outcome = await gate.step(run_id, Decision.tool_call("write", "{}"))
    assert outcome.observation is not None and outcome.observation.kind == "result"
    before, after = expiry
    assert before is not None and after is not None and after > before + 1.5
    assert len(renewed_at) >= 4
    # The renewing ended with the call.
    count = len(renewed_at)
    await anyio.sleep(0.5)
    assert len(renewed_at) == count
