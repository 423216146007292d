"""`make bench` keeps working as the code changes: its quickest pass runs to the end.

Nothing here asserts a time; the benchmarks print ratios, and this only checks
that the gate benchmark still runs against the current API.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(180)
def test_the_gate_benchmark_runs_and_reports_a_ratio(tmp_path: Path) -> None:
    # Its JSON goes to a temporary directory: a developer's latest `make bench` stays.
    kept = sorted((ROOT / "benchmarks" / "results").glob("*.json"))
    finished = subprocess.run(
        [sys.executable, "benchmarks/run.py", "--quick", "--only", "gate", "--no-peers",
         "--results", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=170,
    )  # fmt: skip
    assert finished.returncode == 0, finished.stdout[-2000:] + finished.stderr[-2000:]
    assert "1 gate step, runs of 10" in finished.stdout
    latest = json.loads((tmp_path / "latest.json").read_text())
    assert latest["gate"]["rows"] and latest["gate"]["commits_per_step"] == 2
    assert sorted((ROOT / "benchmarks" / "results").glob("*.json")) == kept


def test_the_http_benchmark_reads_the_upstreams_cpu_from_every_descendant() -> None:
    # bench_http's "upstream" column sums the serving process's descendants: a
    # grandchild (an upstream behind a wrapper) counts, and a process that ended during
    # the round is left out instead of failing the round.
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from _common import cpu_of, cpu_seconds, descendants_of
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    spin = "import time\nend = time.process_time() + 0.2\nwhile time.process_time() < end: pass\n"
    parent = subprocess.Popen(
        [sys.executable, "-c",
         "import subprocess, sys, time\n"
         f"child = subprocess.Popen([sys.executable, '-c', {spin + 'time.sleep(60)'!r}])\n"
         "print(child.pid, flush=True)\ntime.sleep(60)\n"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    grandchild: int | None = None
    try:
        assert parent.stdout is not None
        grandchild = int(parent.stdout.readline())
        assert descendants_of(parent.pid) == [grandchild]
        deadline = time.monotonic() + 30
        while cpu_seconds(grandchild) < 0.2:  # its spin is done when it has used 0.2 s
            assert time.monotonic() < deadline
            time.sleep(0.01)
        gone = parent.pid + 10_000_000  # above any pid the kernel hands out
        total = cpu_of([grandchild, gone])
        assert total == cpu_seconds(grandchild) and total >= 0.2
        assert descendants_of(grandchild) == []
    finally:
        parent.kill()
        parent.wait()
        if grandchild is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(grandchild, signal.SIGKILL)


def test_the_http_benchmark_tells_the_serving_process_main_thread_from_its_others() -> None:
    # bench_http's "main" column reads the main thread alone: CPU another thread of the
    # serving process spends (agentrt's store writer) is in its total, not in "main".
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from _common import cpu_seconds, main_thread_cpu_seconds
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    spin = (
        "import sys, threading, time\n"
        "def spin():\n"
        "    end = time.thread_time() + 0.3\n"
        "    while time.thread_time() < end: pass\n"
        "    print('spun', flush=True)\n"
        "threading.Thread(target=spin).start()\n"
        "time.sleep(60)\n"
    )
    process = subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        assert process.stdout.readline() == "spun\n"
        total, main = cpu_seconds(process.pid), main_thread_cpu_seconds(process.pid)
        assert total >= 0.3
        assert main <= total - 0.25  # the spinning thread's 0.3 s is not the main thread's
    finally:
        process.kill()
        process.wait()


@pytest.mark.timeout(180)
def test_the_scaling_benchmark_runs_its_proxies_on_postgresql_to_one_verified_chain() -> None:
    # bench_scale's proxies count the store's writes through wrappers of its private
    # methods (`_counted_proxy.py`): a wrapper that loses what one returns fails every
    # call, so the shortest run (1 then 2 proxies, a second each) must end with calls
    # made, scoped writes' chain lock held, and the chain verified.
    from _postgres import find_binaries

    if find_binaries() is None:
        pytest.skip("PostgreSQL is not installed")
    finished = subprocess.run(
        [sys.executable, "benchmarks/bench_scale.py", "--backend", "postgresql",
         "--proxies", "1,2", "--apart", "", "--window", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=170,
    )  # fmt: skip
    assert finished.returncode == 0, finished.stdout[-2000:] + finished.stderr[-2000:]
    results, _ = json.JSONDecoder().raw_decode(finished.stdout)
    rows = results["postgresql"]["rows"]
    assert [row["proxies"] for row in rows] == [1, 2]
    assert all(row["calls"] > 0 and row["chain_held_ms_per_call"] > 0 for row in rows)
    assert results["postgresql"]["chain"]["ok"] is True
