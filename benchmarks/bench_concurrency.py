"""Benchmark 6: N concurrent runs on one store — steps per second and fsyncs per step.

One gate (as the proxy has: one run per call) drives N runs at once, each a
loop of allowed no-op steps, on a file-backed store (WAL, synchronous=FULL).
Counted per step: the store's COMMITs (its writer counts them) and, where
`strace` exists, the fsync/fdatasync system calls of the whole process (the
same workload in a child process under `strace -f -c`), which also counts
the WAL checkpoints' fsyncs.  The baseline in the same run is the store
without group commit: every `Store.write` its own transaction in a worker
thread, as before issue 15 (patched in this process only).
"""

from __future__ import annotations

import contextlib
import functools
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
from _common import HERE, PYTHON, Result, ratio
from bench_gate import NoOp

from agentrt import Decision, Gate, Limits, open_store
from agentrt.store import Store

CONCURRENCY = (1, 8, 32)


def _one_commit_per_write(self: Store, function: Callable[..., Any], *args: Any) -> Any:
    """`Store.write` before group commit: its own BEGIN ... COMMIT in a worker thread."""

    def unit() -> Any:
        with self.transaction() as connection:
            return function(connection, *args)

    return anyio.to_thread.run_sync(unit)


@contextlib.contextmanager
def _without_group_commit() -> Iterator[None]:
    original = Store.write
    Store.write = _one_commit_per_write  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        Store.write = original  # type: ignore[method-assign]


async def _drive(path: Path, runs: int, steps: int) -> dict[str, float]:
    store = open_store(path)
    gate = Gate(store, [NoOp()], limits=Limits(max_steps=steps + 10, loop_window=0))
    run_ids = [await gate.start("concurrency") for _ in range(runs)]

    async def loop(run_id: str) -> None:
        for index in range(steps):
            outcome = await gate.step(run_id, Decision.tool_call("noop", f'{{"n": {index}}}'))
            if outcome.observation is None or outcome.observation.kind != "result":
                raise RuntimeError(f"an allowed no-op step did not give a result: {outcome}")

    commits_before = store.commits
    began = time.perf_counter()
    async with anyio.create_task_group() as group:
        for run_id in run_ids:
            group.start_soon(loop, run_id)
    seconds = time.perf_counter() - began
    total = runs * steps
    commits = store.commits - commits_before
    report = store.verify_chain()
    store.close()
    if not report.ok:
        raise RuntimeError(f"the chain does not verify after {runs} concurrent runs: {report}")
    return {
        "runs": runs,
        "steps": total,
        "seconds": seconds,
        "steps_per_s": total / seconds if seconds > 0 else float("nan"),
        "commits_per_step": commits / total if total else float("nan"),
    }


def _steps_for(runs: int, quick: bool) -> int:
    budget = 600 if quick else 2400
    return max(20, budget // runs)


def _fsync_calls(runs: int, steps: int, workdir: Path, grouped: bool) -> int:
    """fsync + fdatasync calls of a child process driving `runs` runs of `steps` steps."""
    strace = shutil.which("strace")
    assert strace is not None
    label = f"{runs}-{steps}-{'grouped' if grouped else 'single'}"
    summary = workdir / f"strace-{label}.txt"
    command = [
        strace, "-f", "-c", "-e", "trace=fsync,fdatasync", "-o", str(summary),
        PYTHON, str(HERE / "bench_concurrency.py"), "--child", str(workdir / f"{label}.db"),
        str(runs), str(steps), "grouped" if grouped else "single",
    ]  # fmt: skip
    completed = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    if completed.returncode != 0:
        raise RuntimeError(f"strace'd child failed: {completed.stderr[-500:]}")
    calls = 0
    for line in summary.read_text().splitlines():
        fields = line.split()
        if fields and fields[-1] in ("fsync", "fdatasync"):
            calls += int(fields[3])
    return calls


def _fsyncs_per_step(runs: int, steps: int, workdir: Path, grouped: bool) -> float | None:
    """fsync + fdatasync calls per step, counted by strace: a child that runs the steps,
    less one that only creates the store and starts the runs."""
    if shutil.which("strace") is None:
        return None
    setup = _fsync_calls(runs, 0, workdir, grouped)
    return (_fsync_calls(runs, steps, workdir, grouped) - setup) / (runs * steps)


def run(quick: bool = False) -> Result:
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="agentrt-bench-concurrency-") as name:
        workdir = Path(name)
        for runs in CONCURRENCY:
            steps = _steps_for(runs, quick)
            with _without_group_commit():
                before = anyio.run(_drive, workdir / f"single-{runs}.db", runs, steps)
            after = anyio.run(_drive, workdir / f"grouped-{runs}.db", runs, steps)
            row: dict[str, Any] = {
                "runs": runs,
                "steps": after["steps"],
                "grouped": after,
                "one_commit_per_write": before,
                "throughput_ratio": ratio(after["steps_per_s"], before["steps_per_s"]),
            }
            fsync_steps = max(10, steps // 4)
            row["fsyncs_per_step"] = _fsyncs_per_step(runs, fsync_steps, workdir, True)
            row["fsyncs_per_step_one_commit_per_write"] = _fsyncs_per_step(
                runs, fsync_steps, workdir, False
            )
            rows.append(row)
    return {"rows": rows, "target_fsyncs_per_step_at_32": 0.5}


def _child(db: str, runs: int, steps: int, mode: str) -> None:
    async def main() -> dict[str, float]:
        return await _drive(Path(db), runs, steps)

    runner = functools.partial(anyio.run, main)
    if mode == "single":
        with _without_group_commit():
            result = runner()
    else:
        result = runner()
    print(json.dumps(result))


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--child":
        _child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
    else:
        print(json.dumps(run(quick="--quick" in sys.argv), indent=1))
