"""Benchmark 7: the store on PostgreSQL against SQLite and against a bare PostgreSQL commit.

Measured in one run, on a server this benchmark starts (initdb in a temporary
directory, a Unix socket, fsync on, as the tests' server):

- a gate step (an allowed no-op read), sequential and with 8 and 32 runs at
  once on one store, on PostgreSQL and on a SQLite file;
- the floor: bare PostgreSQL commits (`BEGIN; INSERT; COMMIT`), as many as
  a gate step makes, sequential and from 8 and 32 connections at once;
- a proxied call (an allowed read through `agentrt proxy` over stdio), on
  each backend, sequential and with 8 calls at once.

Skipped, with the reason, where PostgreSQL's programs are not installed.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
from _common import REPO, Result, log, private_file, ratio, summary
from bench_gate import NoOp

from agentrt import Decision, Gate, Limits, open_store

sys.path.insert(0, str(REPO / "tests"))
import _postgres

CONCURRENCY = (1, 8, 32)


async def _steps(target: str | Path, runs: int, steps: int) -> dict[str, float]:
    store = open_store(target)
    gate = Gate(store, [NoOp()], limits=Limits(max_steps=steps + 10, loop_window=0))
    run_ids = [await gate.start("bench") for _ in range(runs)]
    latencies: list[float] = []

    async def loop(run_id: str) -> None:
        for index in range(steps):
            began = time.perf_counter()
            outcome = await gate.step(run_id, Decision.tool_call("noop", f'{{"n": {index}}}'))
            latencies.append(time.perf_counter() - began)
            if outcome.observation is None or outcome.observation.kind != "result":
                raise RuntimeError(f"an allowed no-op step did not give a result: {outcome}")

    began = time.perf_counter()
    async with anyio.create_task_group() as group:
        for run_id in run_ids:
            group.start_soon(loop, run_id)
    wall = time.perf_counter() - began
    report = store.verify_chain()
    store.close()
    if not report.ok:
        raise RuntimeError(f"the chain does not verify: {report}")
    return {"steps_per_s": runs * steps / wall, **summary(latencies)}


def _floor(url: str, connections: int, commits: int) -> dict[str, float]:
    """Bare commits from `connections` connections at once, `commits` each."""
    import psycopg

    setup = psycopg.connect(url, autocommit=True)
    setup.execute("CREATE TABLE IF NOT EXISTS floor (id BIGSERIAL PRIMARY KEY, v TEXT)")
    setup.close()
    latencies: list[float] = []
    lock = threading.Lock()

    def work() -> None:
        connection = psycopg.connect(url, autocommit=True)
        mine = []
        for _ in range(commits):
            began = time.perf_counter()
            connection.execute("BEGIN")
            connection.execute("INSERT INTO floor (v) VALUES (%s)", ("x" * 64,))
            connection.execute("COMMIT")
            mine.append(time.perf_counter() - began)
        connection.close()
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=work) for _ in range(connections)]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - began
    return {"commits_per_s": connections * commits / wall, **summary(latencies)}


async def _proxied(database: str, root: Path, calls: int, concurrent: int) -> dict[str, float]:
    import bench_proxy

    root.mkdir(parents=True, exist_ok=True)
    entry = await bench_proxy.upstream_entry(root, "bench", 1)
    config = bench_proxy.write_config(root, [entry])
    if database != "proxy.db":
        import json

        document = json.loads(config.read_text())
        document["database"] = database
        private_file(config, json.dumps(document))
    latencies: list[float] = []
    command = bench_proxy._proxy_command(config)
    async with bench_proxy.stdio_session(command, env=bench_proxy._environment()) as session:
        for index in range(10):  # warm-up
            await bench_proxy._call(session, "bench_noop_0000", index)

        async def worker(number: int) -> None:
            for step in range(calls // concurrent):
                index = 1000 + number * 100_000 + step
                latencies.append(await bench_proxy._call(session, "bench_noop_0000", index))

        began = time.perf_counter()
        async with anyio.create_task_group() as group:
            for number in range(concurrent):
                group.start_soon(worker, number)
        wall = time.perf_counter() - began
    return {"calls_per_s": len(latencies) / wall, **summary(latencies)}


@contextlib.contextmanager
def _anchors_in(directory: str) -> Iterator[None]:
    """The stores' head anchors (one per database and host) kept in `directory`, which goes
    with the databases this benchmark throws away, not in the user's own state directory."""
    previous = os.environ.get("AGENTRT_ANCHOR_DIR")
    os.environ["AGENTRT_ANCHOR_DIR"] = str(Path(directory) / "anchors")
    try:
        yield
    finally:
        if previous is None:
            del os.environ["AGENTRT_ANCHOR_DIR"]
        else:
            os.environ["AGENTRT_ANCHOR_DIR"] = previous


def run(quick: bool = False) -> Result:
    binaries = _postgres.find_binaries()
    if binaries is None:
        return {"skipped": "PostgreSQL is not installed (initdb not found); nothing measured"}
    server = _postgres.PostgresServer(binaries)
    try:
        steps = 100 if quick else 400
        calls = 80 if quick else 400
        rows: list[dict[str, Any]] = []
        with tempfile.TemporaryDirectory(prefix="agentrt-bench-pg-") as name, _anchors_in(name):
            workdir = Path(name)
            for runs in CONCURRENCY:
                per_run = max(5, steps // runs)
                log(f"postgres: gate steps, {runs} at once")
                on_postgres = anyio.run(_steps, server.database(), runs, per_run)
                on_sqlite = anyio.run(_steps, workdir / f"gate-{runs}.db", runs, per_run)
                floor = _floor(server.database(), runs, max(5, (steps * 2) // runs))
                rows.append(
                    {
                        "runs": runs,
                        "postgres": on_postgres,
                        "sqlite": on_sqlite,
                        "floor": floor,
                        # A gate step makes two commits (benchmark 1 counts them).
                        "ratio_to_floor_p50": ratio(on_postgres["p50"], 2 * floor["p50"]),
                        "ratio_to_sqlite_p50": ratio(on_postgres["p50"], on_sqlite["p50"]),
                        "throughput_ratio_to_sqlite": ratio(
                            on_postgres["steps_per_s"], on_sqlite["steps_per_s"]
                        ),
                    }
                )
            proxied: dict[str, Any] = {}
            for concurrent in (1, 8):
                log(f"postgres: proxied calls, {concurrent} at once")
                proxied[str(concurrent)] = {
                    "postgres": anyio.run(
                        _proxied, server.database(), workdir / f"pg-{concurrent}", calls,
                        concurrent,
                    ),
                    "sqlite": anyio.run(
                        _proxied, "proxy.db", workdir / f"lite-{concurrent}", calls, concurrent
                    ),
                }  # fmt: skip
        return {"server": str(binaries), "rows": rows, "proxied": proxied}
    finally:
        server.stop()
