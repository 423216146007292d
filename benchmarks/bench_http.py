"""Issue 36's HTTP rows, interleaved: agentrt over streamable HTTP against mcp-proxy and
FastMCP's proxy over HTTP, each in front of the same upstream, alternating target by target
round after round, so that the machine's load falls on all of them alike.

Each round opens every target afresh (its process started, an SDK session opened) and
measures, in this order, 1 call at a time (the added latency: against calling the upstream
directly, and the floor of the two commits a proxied call makes) and 8 calls in flight
(calls/s, and the serving process's own CPU per call from /proc: the figure that holds on a
shared machine).  The medians over the rounds are the result.

Beside the serving process's CPU, each round reads the CPU a call of the two processes every
target shares with it on the machine's cores: this process (the host's SDK client) and the
upstream (the serving process's descendants; for `direct`, none).  Their sum, times calls/s,
is how many of the machine's cores the round kept busy: on 2 cores, a target whose round keeps
them near full is bound by the whole machine's CPU, not by a wait of its own.  The "main"
column is the serving process's main thread alone (the event loop: HTTP, the front, the gate's
Python, the upstream's pipe); the rest of its CPU is its other threads (agentrt's store writer,
which runs each record's statements and COMMIT).

    .venv/bin/python benchmarks/bench_http.py [--rounds N] [--calls N] [--only a,b]
        [--agentrt-src NAME=DIR]  # another checkout's src/ beside this one: before/after
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path

import anyio
import peers as peer_module
from _common import (
    HERE,
    PYTHON,
    cpu_of,
    cpu_seconds,
    descendants_of,
    find_descendant,
    log,
    main_thread_cpu_seconds,
)
from bench_gate import Floor
from bench_mcp import raw_session, server_command
from bench_proxy import (
    CONCURRENCY,
    Target,
    _call,
    _count_commits,
    _fastmcp_config,
    _free_port,
    http_session,
    upstream_entry,
    write_config,
)


def _targets(config: Path, agentrt_sources: dict[str, str | None]) -> list[Target]:
    command = server_command(1)
    targets = [Target("direct", "noop_0000", lambda: raw_session(command), "bench_server.py")]
    for name, source in agentrt_sources.items():
        port = _free_port()
        # Another checkout's code through PYTHONPATH, ahead of this venv's own.
        prefix = ["env", f"PYTHONPATH={source}"] if source is not None else []
        proxy = [*prefix, PYTHON, "-m", "agentrt.proxy", "--config", str(config),
                 "--http", f"127.0.0.1:{port}"]  # fmt: skip
        targets.append(
            Target(
                name,
                "bench_noop_0000",
                lambda proxy=proxy, port=port: http_session(proxy, port, "/mcp"),  # type: ignore[misc]
                "agentrt.proxy",
            )
        )
    peer = peer_module.ensure("mcp-proxy")
    if peer.python is not None:
        port = _free_port()
        mcp_proxy = [str(peer.bin / "mcp-proxy"), "--port", str(port), "--host", "127.0.0.1",
                     "--", *command]  # fmt: skip
        targets.append(
            Target(
                "mcp-proxy",
                "noop_0000",
                lambda port=port: http_session(mcp_proxy, port, "/mcp"),
                "mcp-proxy",
            )
        )
    else:
        log(peer.problem)
    peer = peer_module.ensure("fastmcp")
    if peer.python is not None:
        port = _free_port()
        fastmcp = [str(peer.python), str(HERE / "fastmcp_proxy.py"),
                   _fastmcp_config({"bench": command}), "--http", f"127.0.0.1:{port}"]  # fmt: skip
        targets.append(
            Target(
                "fastmcp",
                "noop_0000",
                lambda port=port: http_session(fastmcp, port, "/mcp"),
                "fastmcp_proxy.py",
            )
        )
    else:
        log(peer.problem)
    return targets


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _round(target: Target, sequential: int, per_worker: int) -> dict[str, float]:
    async with target.open() as session:
        for index in range(10):  # warm-up
            await _call(session, target.tool, index)
        latencies = [await _call(session, target.tool, index) for index in range(sequential)]
        pid = find_descendant(os.getpid(), target.process)
        cpu_before = cpu_seconds(pid) if pid is not None else 0.0
        main_before = main_thread_cpu_seconds(pid) if pid is not None else 0.0
        upstream = descendants_of(pid) if pid is not None else []
        upstream_before = cpu_of(upstream)
        client_before = _own_cpu()

        async def worker(worker_index: int) -> None:
            for step in range(per_worker):
                await _call(session, target.tool, worker_index * 1000 + step)

        began = time.perf_counter()
        async with anyio.create_task_group() as group:
            for worker_index in range(CONCURRENCY):
                group.start_soon(worker, worker_index)
        wall = time.perf_counter() - began
        cpu = cpu_seconds(pid) - cpu_before if pid is not None else float("nan")
        main = main_thread_cpu_seconds(pid) - main_before if pid is not None else float("nan")
        upstream_cpu = cpu_of(upstream) - upstream_before
        client_cpu = _own_cpu() - client_before
    calls = CONCURRENCY * per_worker
    machine_ms = (cpu + upstream_cpu + client_cpu) / calls * 1000
    return {
        "p50_s": statistics.median(latencies),
        "calls_per_s": calls / wall,
        "cpu_ms_per_call": cpu / calls * 1000,
        "main_ms_per_call": main / calls * 1000,
        "client_ms_per_call": client_cpu / calls * 1000,
        "upstream_ms_per_call": upstream_cpu / calls * 1000,
        "machine_ms_per_call": machine_ms,
        "cores_busy": calls / wall * machine_ms / 1000,
    }


async def main(
    rounds: int, sequential: int, per_worker: int, sources: dict[str, str | None]
) -> None:
    with tempfile.TemporaryDirectory(prefix="agentrt-bench-http-") as name:
        root = Path(name)
        config = write_config(root, [await upstream_entry(root, "bench", 1)])
        counted = await _count_commits(config, root, "bench_noop_0000")
        commits = max(1, round(counted["writing_commits"]))
        floor = Floor(root / "floor.db")
        floor.commits(500)
        floors = [floor.commits(commits) for _ in range(200)]
        floor.close()
        floor_s = statistics.median(floors)
        targets = _targets(config, sources)
        results: dict[str, list[dict[str, float]]] = {target.name: [] for target in targets}
        load = [os.getloadavg()[0]]
        for index in range(rounds):
            for target in targets:
                measured = await _round(target, sequential, per_worker)
                results[target.name].append(measured)
                log(f"round {index + 1} {target.name}: " + ", ".join(
                    f"{key} {value:.4g}" for key, value in measured.items()))  # fmt: skip
            load.append(os.getloadavg()[0])
    medians = {
        name: {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        for name, runs in results.items()
    }
    direct = medians["direct"]["p50_s"]
    print(f"\nfloor (two commits) p50 {floor_s * 1000:.3f} ms; 1-min load per round {load}")
    print(f"{'target':<18}{'added p50 ms':>14}{'calls/s':>10}{'CPU ms/call':>13}{'main':>7}"
          f"{'client':>8}{'upstream':>10}{'machine':>9}{'cores':>7}")  # fmt: skip
    for name, values in medians.items():
        added = (values["p50_s"] - direct) * 1000
        print(f"{name:<18}{added:>14.3f}{values['calls_per_s']:>10.1f}"
              f"{values['cpu_ms_per_call']:>13.3f}{values['main_ms_per_call']:>7.3f}"
              f"{values['client_ms_per_call']:>8.3f}"
              f"{values['upstream_ms_per_call']:>10.3f}{values['machine_ms_per_call']:>9.3f}"
              f"{values['cores_busy']:>7.2f}")  # fmt: skip
    for ours in sources:
        for peer in ("mcp-proxy", "fastmcp"):
            if peer in medians:
                ours_added = medians[ours]["p50_s"] - direct
                peer_added = medians[peer]["p50_s"] - direct
                print(
                    f"{ours} vs {peer}: throughput "
                    f"{medians[ours]['calls_per_s'] / medians[peer]['calls_per_s']:.2f}x, "
                    f"added latency vs peer + floor {ours_added / (peer_added + floor_s):.2f}x"
                )
    print(json.dumps({"medians": medians, "rounds": results, "floor_s": floor_s, "load": load}))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=200, help="sequential calls a round")
    parser.add_argument("--per-worker", type=int, default=50)
    parser.add_argument(
        "--agentrt-src", action="append", default=[],
        help="NAME=DIR: another checkout's src/ to measure beside this one (before/after)",
    )  # fmt: skip
    arguments = parser.parse_args()
    sources: dict[str, str | None] = {}
    for item in arguments.agentrt_src:
        label, _, directory = item.partition("=")
        sources[label] = directory
    sources["agentrt"] = None
    anyio.run(main, arguments.rounds, arguments.calls, arguments.per_worker, sources)
