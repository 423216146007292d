"""Benchmark 1: the gate's cost per allowed step against its SQLite floor.

The floor is what durability alone costs: the same number of commits one
allowed step makes, each a small INSERT in `BEGIN IMMEDIATE`, on a file with
the store's settings (WAL, synchronous=FULL).  The commit count is measured,
not assumed: a trace callback on the store's connection counts COMMITs.
"""

from __future__ import annotations

import asyncio
import cProfile
import io
import pstats
import queue
import sqlite3
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
from _common import Result, percentile, ratio

from agentrt import (
    Decision,
    Gate,
    Limits,
    SideEffect,
    StepOutcome,
    ToolCall,
    ToolResult,
    ToolSpec,
    open_store,
    parse_json,
)


class NoOp:
    """An allowed read-only tool that answers at once."""

    spec = ToolSpec(
        name="noop",
        description="Answer at once.",
        input_schema={
            "type": "object",
            "properties": {"n": {"type": "integer"}},
            "required": ["n"],
            "additionalProperties": False,
        },
        side_effect=SideEffect.READ_ONLY,
        timeout=5.0,
    )

    async def call(self, call: ToolCall) -> ToolResult:
        return ToolResult(content='"ok"')


def _gate(path: Path | str, steps: int) -> Gate:
    store = open_store(path)
    return Gate(store, [NoOp()], limits=Limits(max_steps=steps + 1_000))


async def _run_steps(gate: Gate, steps: int, runs: int) -> float:
    """Seconds for `runs` runs of `steps` allowed steps each (starting a run excluded)."""
    total = 0.0
    for _ in range(runs):
        run_id = await gate.start("bench")
        began = time.perf_counter()
        for index in range(steps):
            _check(await gate.step(run_id, Decision.tool_call("noop", f'{{"n": {index}}}')))
        total += time.perf_counter() - began
    return total


def _check(outcome: StepOutcome) -> None:
    if outcome.observation is None or outcome.observation.kind != "result":
        raise RuntimeError(f"an allowed no-op step did not give a result: {outcome}")


async def _paired(
    gate: Gate, floor: Floor, commits: int, steps: int, runs: int
) -> tuple[list[float], list[float]]:
    """Per-step seconds of the gate and of its floor, each step followed at once by its
    floor's commits, so a burst of disk latency from elsewhere hits both alike."""
    gate_times: list[float] = []
    floor_times: list[float] = []
    for _ in range(runs):
        run_id = await gate.start("bench")
        for index in range(steps):
            began = time.perf_counter()
            _check(await gate.step(run_id, Decision.tool_call("noop", f'{{"n": {index}}}')))
            gate_times.append(time.perf_counter() - began)
            floor_times.append(floor.commits(commits))
    return gate_times, floor_times


def count_commits_per_step(workdir: Path) -> float:
    """COMMITs one allowed step makes, counted on the store's own connection."""
    gate = _gate(workdir / "count.db", 20)
    commits: list[str] = []
    connection: sqlite3.Connection = gate.store._connection  # counting only

    def trace(statement: str) -> None:
        if statement.strip().upper().startswith("COMMIT"):
            commits.append(statement)

    async def run() -> None:
        run_id = await gate.start("count")
        connection.set_trace_callback(trace)
        for index in range(10):
            await gate.step(run_id, Decision.tool_call("noop", f'{{"n": {index}}}'))
        connection.set_trace_callback(None)

    anyio.run(run)
    gate.store.close()
    return len(commits) / 10


class Floor:
    """Bare SQLite commits with the store's journal and synchronous settings.

    `tables` > 1 makes each commit insert one small row into each of that many
    tables, so it dirties about as many pages as a gate commit does (the
    page-matched floor; a gate commit writes ~5 WAL frames, a bare INSERT 1).
    """

    def __init__(self, path: Path | str, tables: int = 1, *, any_thread: bool = False) -> None:
        self.connection = sqlite3.connect(
            path, isolation_level=None, check_same_thread=not any_thread
        )
        self.connection.execute("PRAGMA journal_mode = WAL")
        self.connection.execute("PRAGMA synchronous = FULL")
        self.tables = [f"t{index}" for index in range(tables)]
        for table in self.tables:
            self.connection.execute(
                f"CREATE TABLE IF NOT EXISTS {table} (id INTEGER PRIMARY KEY, v TEXT)"
            )

    def commits(self, count: int) -> float:
        began = time.perf_counter()
        for _ in range(count):
            self.connection.execute("BEGIN IMMEDIATE")
            for table in self.tables:
                self.connection.execute(f"INSERT INTO {table} (v) VALUES (?)", ("x" * 64,))
            self.connection.execute("COMMIT")
        return time.perf_counter() - began

    def close(self) -> None:
        self.connection.close()


_Handoff = tuple[asyncio.AbstractEventLoop, "asyncio.Future[None]"]


class ThreadFloor:
    """The same bare commits, each handed to a thread and answered back on the event
    loop, as the store must (its writes run off the loop, decision 0002): the least a
    commit costs a caller that may not block its loop.  Shown beside the floor, never
    instead of it; the difference is the two thread wake-ups per commit."""

    def __init__(self, floor: Floor) -> None:
        self.floor = floor
        self._queue: queue.SimpleQueue[_Handoff | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while (item := self._queue.get()) is not None:
            loop, future = item
            self.floor.commits(1)
            loop.call_soon_threadsafe(future.set_result, None)

    async def commits(self, count: int) -> float:
        loop = asyncio.get_running_loop()
        began = time.perf_counter()
        for _ in range(count):
            future = loop.create_future()
            self._queue.put((loop, future))
            await future
        return time.perf_counter() - began

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()


async def _paired_off_loop(
    gate: Gate, floor: ThreadFloor, commits: int, steps: int
) -> tuple[list[float], list[float]]:
    """As `_paired`, against commits handed to a thread."""
    gate_times: list[float] = []
    floor_times: list[float] = []
    run_id = await gate.start("bench")
    for index in range(steps):
        began = time.perf_counter()
        _check(await gate.step(run_id, Decision.tool_call("noop", f'{{"n": {index}}}')))
        gate_times.append(time.perf_counter() - began)
        floor_times.append(await floor.commits(commits))
    return gate_times, floor_times


def profile_steps(steps: int = 1000, top: int = 30) -> str:
    """cProfile of `steps` allowed steps on an in-memory store (the CPU side of a step),
    the top functions by cumulative time."""
    gate = _gate(":memory:", steps)
    profiler = cProfile.Profile()

    async def run() -> None:
        run_id = await gate.start("profile")
        profiler.enable()
        for index in range(steps):
            await gate.step(run_id, Decision.tool_call("noop", f'{{"n": {index}}}'))
        profiler.disable()

    anyio.run(run)
    gate.store.close()
    stream = io.StringIO()
    stats = pstats.Stats(profiler, stream=stream)
    stats.sort_stats("cumulative").print_stats(top)
    return stream.getvalue()


def run(quick: bool = False) -> Result:
    lengths = [10, 100, 1000]
    steps_per_length = 300 if quick else 1000
    with tempfile.TemporaryDirectory(prefix="agentrt-bench-gate-") as name:
        workdir = Path(name)
        per_step_commits = count_commits_per_step(workdir)
        commits = max(1, round(per_step_commits))
        gate = _gate(workdir / "gate.db", 1000)
        memory_gate = _gate(":memory:", 1000)
        floor = Floor(workdir / "floor.db")
        memory_floor = Floor(":memory:")
        # Warm both files past the WAL's first checkpoint, so neither is measured
        # while its WAL file is still growing (a growing file costs more per fsync).
        anyio.run(_run_steps, gate, 150, 1)
        floor.commits(1100)
        rows: list[dict[str, Any]] = []
        for length in lengths:
            runs = max(1, steps_per_length // length)
            steps = runs * length
            gate_times, floor_times = anyio.run(_paired, gate, floor, commits, length, runs)
            memory_gate_seconds = anyio.run(_run_steps, memory_gate, length, runs)
            memory_floor_seconds = memory_floor.commits(commits * steps)
            gate_total, floor_total = sum(gate_times), sum(floor_times)
            rows.append(
                {
                    "run_length": length,
                    "runs": runs,
                    "steps": steps,
                    "gate_per_step_s": gate_total / steps,
                    "floor_per_step_s": floor_total / steps,
                    "gate_p50_s": percentile(gate_times, 0.5),
                    "floor_p50_s": percentile(floor_times, 0.5),
                    "ratio": ratio(gate_total, floor_total),
                    "ratio_p50": ratio(percentile(gate_times, 0.5), percentile(floor_times, 0.5)),
                    "memory_gate_per_step_s": memory_gate_seconds / steps,
                    "memory_floor_per_step_s": memory_floor_seconds / steps,
                }
            )
        gate.store.close()
        memory_gate.store.close()
        floor.close()
        memory_floor.close()
        profile = profile_steps(steps=300 if quick else 1000)
    first, last = rows[0]["gate_p50_s"], rows[-1]["gate_p50_s"]
    return {
        "commits_per_step": per_step_commits,
        "rows": rows,
        "flatness": ratio(last, first),
        "target_ratio": 1.5,
        "parts_s": parts(500 if quick else 2000),
        "profile": profile,
    }


def parts(repeat: int = 2000) -> dict[str, float]:
    """Seconds per step of the pieces a profile of the CPU side points at, each timed alone
    on an in-memory store (so without fsync): where an allowed step's CPU time goes.

    Timed alone on a machine whose speed moves with its other tenants, so read them as
    proportions of the in-memory step measured in the same run, not as absolutes."""
    store = open_store(":memory:")
    gate = Gate(store, [NoOp()], limits=Limits(max_steps=repeat + 10))
    registered = gate._tools["noop"]
    timings: dict[str, float] = {}

    def nothing(connection: Any) -> None:
        return None

    async def round_trips() -> None:
        # What every `Store.write` costs beyond its unit: the hand-off to the writer
        # thread, BEGIN IMMEDIATE and COMMIT, the wake-up on the loop.
        began = time.perf_counter()
        for _ in range(repeat):
            await store.write(nothing)
        timings["Store.write round trip of an empty unit (x2 per step)"] = (
            time.perf_counter() - began
        ) / repeat

    async def timeout_scope() -> None:
        # What `Gate._execute` puts around a call that ends inside its lease.
        began = time.perf_counter()
        for _ in range(repeat):
            with anyio.CancelScope(deadline=anyio.current_time() + 5.0):
                await anyio.lowlevel.checkpoint()
        timings["the call's timeout scope (x1 per step)"] = (time.perf_counter() - began) / repeat

    async def heartbeat_pattern() -> None:
        # What `Gate._execute` puts around a call that may outlast half the lease (not the
        # no-op's: its timeout is 5 s in a 30 s lease) and returns before a third of it:
        # the lease kept by a timer (decision 0021), beside what it did before, a task
        # group with a renewing task started, a deadline, and the group cancelled.
        began = time.perf_counter()
        for _ in range(repeat):
            async with gate._leases.kept("parts"):
                with anyio.CancelScope(deadline=anyio.current_time() + 5.0):
                    await anyio.lowlevel.checkpoint()
        timings["lease kept through a call that may outlast half the lease (not this step)"] = (
            time.perf_counter() - began
        ) / repeat
        began = time.perf_counter()
        for _ in range(repeat):
            async with anyio.create_task_group() as group:
                group.start_soon(anyio.sleep_forever)
                with anyio.fail_after(5.0):
                    await anyio.lowlevel.checkpoint()
                group.cancel_scope.cancel()
        timings["the same with a renewing task started and cancelled (before decision 0021)"] = (
            time.perf_counter() - began
        ) / repeat

    anyio.run(round_trips)
    anyio.run(timeout_scope)
    anyio.run(heartbeat_pattern)
    run_id = anyio.run(gate.start, "parts")
    payloads = [
        ("step_recorded", {"step": 1, "tool": "noop", "args": '{"n": 1}'}),
        ("policy_decided", {"step": 1, "outcome": "allow", "reason": ""}),
        ("tool_started", {"step": 1, "tool": "noop"}),
        ("step_succeeded", {"step": 1, "content": '"ok"', "summary": ""}),
    ]
    began = time.perf_counter()
    for _ in range(repeat):
        with store.transaction() as connection:
            for type_, payload in payloads:
                store.append_event(connection, run_id, type_, payload)
        store.take_committed_events()
    timings["4 hash-chained events (one transaction)"] = (time.perf_counter() - began) / repeat
    arguments = parse_json('{"n": 1}')
    began = time.perf_counter()
    for _ in range(repeat):
        parse_json('{"n": 1}')
        registered.schema.first_error(arguments)
    timings["parse + schema check of the arguments"] = (time.perf_counter() - began) / repeat
    store.close()
    return timings


# -- the gate on a file against a page-matched floor ----------------------------------------


def ablation(quick: bool = False) -> Result:
    """The gate on a file against a page-matched floor (a floor commit dirtying as many
    pages as a gate commit), the WAL frames each writes, and the chain of the gate's file
    verified.  (The proposals measured here before issue 15 — G1, no heartbeat task for
    calls that end inside their lease, and G2, the chain head read once per transaction —
    are both in the gate and the store now.)"""
    steps = 300 if quick else 1000
    file_ratios: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="agentrt-bench-ablation-") as name:
        wide = Floor(Path(name) / "wide-floor.db", tables=5)
        wide.commits(300)
        gate = _gate(Path(name) / "wide.db", steps + 150)
        anyio.run(_run_steps, gate, 150, 1)
        gate_times, floor_times = anyio.run(_paired, gate, wide, 2, steps, 1)
        file_ratios["against a page-matched floor (5 tables a commit)"] = ratio(
            sum(gate_times), sum(floor_times)
        )
        bare = Floor(Path(name) / "off-loop-floor.db", any_thread=True)
        bare.commits(1100)
        off_loop = ThreadFloor(bare)
        gate_times, floor_times = anyio.run(
            _paired_off_loop, gate, off_loop, 2, steps, backend="asyncio"
        )
        file_ratios["against 2 bare commits each handed to a thread and back (off-loop floor)"] = (
            ratio(sum(gate_times), sum(floor_times))
        )
        off_loop.close()
        bare.close()
        result_frames = wal_frames_per_commit(gate, wide)
        report = gate.store.verify_chain()
        gate.store.close()
        wide.close()
    return {
        "chain": f"{report.reason} ({report.checked} events)",
        "file_ratio_to_floor": file_ratios,
        "wal_frames_per_commit": result_frames,
    }


def wal_frames_per_commit(gate: Gate, floor: Floor) -> dict[str, float]:
    """WAL frames (pages) one commit writes: a gate step's commits, and the floor's."""
    frames: dict[str, float] = {}
    connection: sqlite3.Connection = gate.store._connection  # measuring only
    page = int(connection.execute("PRAGMA page_size").fetchone()[0])

    def wal_size(db: Path | str) -> int:
        wal = Path(f"{db}-wal")
        return wal.stat().st_size if wal.exists() else 0

    for label, conn, path, work in (
        ("gate", connection, gate.store.path, lambda: anyio.run(_run_steps, gate, 50, 1)),
        ("floor", floor.connection, _db_path(floor.connection), lambda: floor.commits(100)),
    ):
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.execute("PRAGMA wal_autocheckpoint = 0")
        before = wal_size(path)
        work()
        commits = 100
        frames[label] = (wal_size(path) - before) / (page + 24) / commits
        conn.execute("PRAGMA wal_autocheckpoint = 1000")
    return frames


def _db_path(connection: sqlite3.Connection) -> str:
    return str(connection.execute("PRAGMA database_list").fetchone()[2])
