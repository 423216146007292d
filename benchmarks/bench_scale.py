"""Benchmark 13 (issue 36, scaling): 1, 2, 4 and 8 `agentrt proxy` processes on one
database, each with 8 calls in flight, on PostgreSQL and on one SQLite file.

    python benchmarks/bench_scale.py [--quick]      (or run.py --only scale)

Eight proxies are started once per backend, all on the same database and serving
one session, as docs/postgresql.md sets a team up (`--sessions each`: a session of
its own each), each with its own upstream (`_scale_server.py`: a standard-library
server that costs next to no CPU); each phase then drives the first 1, 2, 4 or 8
of them for a fixed window from one host process speaking newline-delimited
JSON-RPC over their pipes, 8 calls in flight per proxy, every call a request of its
own.  Per phase:

- calls/s over all proxies, and the ratio to the 1-proxy phase of the same run;
- p50 and p99 of a call's latency, as the host sees it;
- COMMITs per call and the write lock: the seconds the proxies' writes waited
  for it and held it, per call, timed by the store itself around taking the
  lock (`Store.write_lock_wait_s`, `write_lock_held_s`, written out by
  `_counted_proxy.py`); held/wall is the lock's utilisation (1.0: the lock is
  never free, every writer queues for it).  A proxy's calls are scoped writes
  (decision 0065), which hold the write lock shared, beside one another (their
  holds add up past 1.0); what they queue for is the chain's lock, from their
  events' head read to their COMMIT (`chain_lock_wait_s`, `chain_lock_held_s`);
- CPU per call and cores used, process by process: the proxies, their upstreams,
  this driver, PostgreSQL's backends (the proxies' connections) and its other
  processes (WAL writer, checkpointer, ...), and the rest of the machine (other
  work sharing the cores);
- the two ceilings no number of proxies can pass, in calls/s: the CPU's (the
  machine's cores over this phase's CPU per call) and the lock's: with scoped
  writes the chain's lock (one holder at a time: calls over its seconds held),
  before them the write lock (all of a write's work happened holding it: the
  writer threads' CPU in their transactions plus PostgreSQL's backends' CPU, per
  call, was the least the lock was held a call, whatever the machine's load);
- the write lock's acquisitions per call and the `Store.write` units each carried
  (the group commit's batch).

Skips PostgreSQL, with the reason, where its programs are not installed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

from _common import (
    HERE,
    PYTHON,
    REPO,
    Result,
    children_of,
    cmdline,
    cpu_of,
    log,
    private_file,
    ratio,
    summary,
)

from agentrt.mcp import Server, pin

sys.path.insert(0, str(REPO / "tests"))
import _postgres

PROXIES: Final = (1, 2, 4, 8)
# The phases of proxies each on its own PostgreSQL database: the machine's ceiling.
APART: Final = (1, 4)
IN_FLIGHT: Final = 8
SERVER: Final = [PYTHON, str(HERE / "_scale_server.py")]
PROXY: Final = [PYTHON, str(HERE / "_counted_proxy.py")]
_INITIALIZE: Final = {
    "protocolVersion": "2025-06-18",
    "capabilities": {},
    "clientInfo": {"name": "bench-scale", "version": "1"},
}


class Host:
    """One proxy process and the calls in flight to it, answered by id."""

    def __init__(self, process: asyncio.subprocess.Process, counts: Path) -> None:
        self.process = process
        self.counts = counts
        self._next = 0
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._reader = asyncio.get_running_loop().create_task(self._read())

    @classmethod
    async def start(cls, config: Path, counts: Path, env: dict[str, str]) -> Host:
        process = await asyncio.create_subprocess_exec(
            *PROXY, "--config", str(config),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL, env={**env, "BENCH_STORE_COUNTS": str(counts)},
            limit=1 << 24,
        )  # fmt: skip
        host = cls(process, counts)
        await host.request("initialize", _INITIALIZE, timeout=120)
        host._send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        await host.request("tools/list", {}, timeout=60)
        return host

    async def request(
        self, method: str, params: dict[str, Any], timeout: float = 30
    ) -> dict[str, Any]:
        self._next += 1
        ident = self._next
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[ident] = future
        self._send({"jsonrpc": "2.0", "id": ident, "method": method, "params": params})
        answer = await asyncio.wait_for(future, timeout)
        if "error" in answer:
            raise RuntimeError(f"{method} failed: {answer['error']}")
        result: dict[str, Any] = answer["result"]
        return result

    async def call(self, number: int) -> float:
        began = time.perf_counter()
        result = await self.request(
            "tools/call", {"name": "bench_noop_0000", "arguments": {"n": number}}
        )
        elapsed = time.perf_counter() - began
        text = result["content"][0]["text"] if result.get("content") else ""
        if result.get("isError") or text != f"ok {number}":
            raise RuntimeError(f"call {number} through the proxy failed: {result!r:.300}")
        return elapsed

    def counters(self) -> dict[str, float]:
        try:
            totals: dict[str, float] = json.loads(self.counts.read_text())
        except (OSError, ValueError):
            totals = {}
        for key in (
            "commits",
            "lock_wait_s",
            "lock_held_s",
            "chain_wait_s",
            "chain_held_s",
            "units",
            "write_locks",
            "writer_cpu_s",
        ):
            totals.setdefault(key, 0.0)
        return totals

    def cpu(self) -> tuple[float, float]:
        """CPU seconds of the proxy, and of its upstream, so far."""
        return cpu_of([self.process.pid]), cpu_of(children_of(self.process.pid))

    def _send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(message).encode() + b"\n")

    async def _read(self) -> None:
        assert self.process.stdout is not None
        while line := await self.process.stdout.readline():
            answer = json.loads(line)
            future = self._waiting.pop(answer.get("id"), None)
            if future is not None and not future.done():
                future.set_result(answer)
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(RuntimeError("the proxy exited"))

    async def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            await asyncio.wait_for(self.process.wait(), 30)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()
        self._reader.cancel()


def _machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of every core so far, from /proc/stat."""
    with open("/proc/stat") as handle:
        fields = [float(value) for value in handle.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def _postgres_cpu(server: _postgres.PostgresServer | None) -> tuple[float, float]:
    """CPU seconds so far of PostgreSQL's backends (its clients' connections), and of
    its other processes (the postmaster, WAL writer, checkpointer, ...)."""
    if server is None:
        return 0.0, 0.0
    try:
        postmaster = int((server.data / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError):
        return 0.0, 0.0
    backends, others = [], [postmaster]
    for pid in children_of(postmaster):
        # A backend's title: "postgres: USER DATABASE [local] STATE".
        title = " ".join(cmdline(pid))
        (backends if "[local]" in title else others).append(pid)
    return cpu_of(backends), cpu_of(others)


def _cpu_snapshot(hosts: list[Host], server: _postgres.PostgresServer | None) -> dict[str, float]:
    """CPU seconds so far, by kind of process; `machine`: every core's busy time."""
    proxies = upstreams = 0.0
    for host in hosts:
        proxy, upstream = host.cpu()
        proxies += proxy
        upstreams += upstream
    backends, others = _postgres_cpu(server)
    busy, _total = _machine_busy()
    return {
        "proxies": proxies,
        "upstreams": upstreams,
        "driver": time.process_time(),
        "postgres_backends": backends,
        "postgres_other": others,
        "machine": busy / os.sysconf("SC_CLK_TCK"),
    }


async def _phase(
    hosts: list[Host], window: float, server: _postgres.PostgresServer | None
) -> dict[str, Any]:
    """Drive `hosts` with IN_FLIGHT calls each for `window` seconds (after a short warm-up)."""
    latencies: list[float] = []
    measuring = False
    stop_at = 0.0

    async def worker(host: Host, number: int) -> None:
        step = 0
        while time.perf_counter() < stop_at:
            elapsed = await host.call(number * 1_000_000 + step)
            step += 1
            if measuring:
                latencies.append(elapsed)

    async def drive(seconds: float) -> None:
        nonlocal stop_at
        stop_at = time.perf_counter() + seconds
        async with asyncio.TaskGroup() as group:
            for host in hosts:
                for number in range(IN_FLIGHT):
                    # Every call in flight a request of its own, across proxies too.
                    group.create_task(worker(host, hosts.index(host) * IN_FLIGHT + number))

    await drive(min(1.0, window / 3))  # warm-up: every proxy's pools and caches filled
    await asyncio.sleep(0.3)  # the counters' files caught up
    before = [host.counters() for host in hosts]
    cpu_before = _cpu_snapshot(hosts, server)
    busy_before, total_before = _machine_busy()
    load_before = os.getloadavg()[0]
    measuring = True
    began = time.perf_counter()
    await drive(window)
    wall = time.perf_counter() - began
    busy_after, total_after = _machine_busy()
    cpu_after = _cpu_snapshot(hosts, server)
    await asyncio.sleep(0.3)
    after = [host.counters() for host in hosts]
    calls = len(latencies)

    def delta(key: str) -> float:
        return sum(a[key] - b[key] for a, b in zip(after, before, strict=True))

    spent = {kind: cpu_after[kind] - cpu_before[kind] for kind in cpu_before}
    machine = spent.pop("machine")
    ours = sum(spent.values())
    spent["rest_of_machine"] = max(machine - ours, 0.0)
    cores = os.cpu_count() or 1
    # Work done only while holding the write lock (seconds).
    serial = delta("writer_cpu_s") + spent["postgres_backends"]
    stats = summary(latencies)
    return {
        "proxies": len(hosts),
        "calls": calls,
        "wall_s": wall,
        "calls_per_s": calls / wall,
        "p50_s": stats["p50"],
        "p99_s": stats["p99"],
        "commits_per_call": delta("commits") / calls,
        "write_locks_per_call": delta("write_locks") / calls,
        "units_per_write_lock": delta("units") / max(delta("write_locks"), 1.0),
        "lock_wait_ms_per_call": 1000 * delta("lock_wait_s") / calls,
        "lock_held_ms_per_call": 1000 * delta("lock_held_s") / calls,
        "lock_utilisation": delta("lock_held_s") / wall,
        # Scoped writes (decision 0065) hold the write lock shared: what serialises them is
        # the chain's lock, from their events' head read to their COMMIT.
        "chain_wait_ms_per_call": 1000 * delta("chain_wait_s") / calls,
        "chain_held_ms_per_call": 1000 * delta("chain_held_s") / calls,
        "chain_utilisation": delta("chain_held_s") / wall,
        "writer_cpu_ms_per_call": 1000 * delta("writer_cpu_s") / calls,
        "cpu_ms_per_call": {kind: 1000 * value / calls for kind, value in spent.items()},
        "cores_used": {kind: value / wall for kind, value in spent.items()},
        "our_cpu_ms_per_call": 1000 * ours / calls,
        "cpu_ceiling_calls_per_s": cores * calls / ours if ours else 0.0,
        "lock_ceiling_calls_per_s": calls / serial if serial else 0.0,
        "chain_ceiling_calls_per_s": (
            calls / delta("chain_held_s") if delta("chain_held_s") else 0.0
        ),
        "cores": cores,
        "machine_busy": (busy_after - busy_before) / max(total_after - total_before, 1.0),
        "load_average": (load_before + os.getloadavg()[0]) / 2,
    }


async def _backend(
    name: str,
    databases: list[str],
    root: Path,
    window: float,
    server: _postgres.PostgresServer | None,
    counts: tuple[int, ...],
    sessions: str = "team",
) -> dict[str, Any]:
    manifest = await pin(Server(name="bench", command=SERVER, connect_timeout=60.0))
    conf = root / "conf"
    private_file(conf / "bench.manifest.json", manifest.to_json())
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", "/tmp"),
        "AGENTRT_ANCHOR_DIR": str(root / "anchors"),
    }
    if "PYTHONPATH" in os.environ:  # (to measure another checkout's agentrt)
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    configs = []
    for index in range(max(counts)):
        document = {
            "database": databases[index % len(databases)],
            "session": "team" if sessions == "team" else f"scale-{index}",
            "servers": [
                {"name": "bench", "command": SERVER, "manifest": "bench.manifest.json",
                 "rules": {tool: {"side_effect": "read_only"} for tool in manifest.tools}},
            ],
        }  # fmt: skip
        configs.append(private_file(conf / f"proxy-{index}.json", json.dumps(document)))
    where = "one database" if len(databases) == 1 else "a database each"
    log(f"scale: {name}: starting {max(counts)} proxies on {where}")
    # One first, so the schema is made once; then the rest together.
    hosts = [await Host.start(configs[0], root / "counts-0.json", env)]
    hosts += await asyncio.gather(
        *(
            Host.start(configs[index], root / f"counts-{index}.json", env)
            for index in range(1, max(counts))
        )
    )
    rows = []
    try:
        for count in counts:
            log(f"scale: {name}: {count} proxies, {IN_FLIGHT} calls in flight each")
            rows.append(await _phase(hosts[:count], window, server))
    finally:
        for host in hosts:
            await host.close()
    baseline = rows[0]["calls_per_s"]
    for row in rows:
        row["ratio_to_one"] = ratio(row["calls_per_s"], baseline)
    chains = [_verified(database) for database in databases]
    return {"rows": rows, "chain": chains[0] if len(chains) == 1 else chains}


def _verified(database: str) -> dict[str, Any]:
    """The chain every proxy extended, verified once the proxies stopped."""
    from agentrt import open_store

    store = open_store(database, read_only=True)
    try:
        report = store.verify_chain()
    finally:
        store.close()
    if not report.ok:
        raise RuntimeError(f"the chain does not verify after the run: {report.reason}")
    return {"events": report.checked, "ok": report.ok}


def run(
    quick: bool = False,
    counts: tuple[int, ...] = PROXIES,
    window: float | None = None,
    backends: tuple[str, ...] = ("postgresql", "sqlite"),
    apart: tuple[int, ...] = APART,
    sessions: str = "team",
) -> Result:
    """Every phase of `counts` proxies (the first must be 1: the others' baseline); on
    PostgreSQL, then the phases of `apart` proxies each on a database of its own (none
    when empty).  `sessions`: "team", one session every proxy serves, as
    docs/postgresql.md sets a team up; "each", a session of its own each."""
    if window is None:
        window = 2.0 if quick else 5.0
    results: dict[str, Any] = {"in_flight": IN_FLIGHT, "window_s": window, "sessions": sessions}
    with tempfile.TemporaryDirectory(prefix="agentrt-bench-scale-") as name:
        root = Path(name)
        binaries = _postgres.find_binaries()
        if "postgresql" not in backends:
            pass
        elif binaries is None:
            results["postgresql"] = {"skipped": "PostgreSQL is not installed; nothing measured"}
        else:
            server = _postgres.PostgresServer(binaries)
            try:
                results["postgresql"] = asyncio.run(
                    _backend(
                        "postgresql", [server.database()], root / "pg", window, server, counts,
                        sessions,
                    )
                )  # fmt: skip
                if apart:
                    # The same work with nothing shared but the server and the machine: each
                    # proxy on a database of its own, so no write lock or chain is shared.
                    # What these proxies reach is the machine's ceiling for the row.
                    separate = [server.database() for _ in range(max(apart))]
                    results["postgresql_apart"] = asyncio.run(
                        _backend(
                            "postgresql", separate, root / "pg-apart", window, server, apart,
                            sessions,
                        )
                    )  # fmt: skip
            finally:
                server.stop()
        if "sqlite" in backends:
            results["sqlite"] = asyncio.run(
                _backend(
                    "sqlite", [str(root / "lite" / "scale.db")], root / "lite", window, None,
                    counts, sessions,
                )
            )  # fmt: skip
    return results


def rows(results: dict[str, Any]) -> list[list[str]]:
    """The `make bench` table's rows: one per backend and proxy count."""
    table: list[list[str]] = []
    for backend, target in (("postgresql", 1.6), ("postgresql_apart", None), ("sqlite", None)):
        part = results.get(backend)
        if not isinstance(part, dict):
            continue
        if "skipped" in part:
            table.append([f"13 scale, {backend}", "skipped", "", "", "", part["skipped"]])
            continue
        for row in part["rows"]:
            goal = target is not None and row["proxies"] == 4
            verdict = ("met" if row["ratio_to_one"] >= target else "missed") if goal else ""
            cpu = row["cpu_ms_per_call"]
            where = (
                "each on its own postgresql database (nothing shared: the machine's ceiling)"
                if backend == "postgresql_apart"
                else f"on one {backend} database"
            )
            table.append([
                f"13 {row['proxies']} proxies {where}, calls/s vs 1 proxy",
                f"{row['ratio_to_one']:.2f}x",
                f"p99 {row['p99_s'] * 1000:.0f} ms",
                ">= 1.6x" if goal else "reported", verdict,
                f"{row['calls_per_s']:.0f} calls/s; write lock wait "
                f"{row['lock_wait_ms_per_call']:.2f} ms/call, held "
                f"{row['lock_held_ms_per_call']:.2f} ms/call "
                f"(writer's CPU {row['writer_cpu_ms_per_call']:.2f}), "
                f"{row['lock_utilisation']:.0%} of the time, "
                f"{row['write_locks_per_call']:.2f} takes/call "
                f"({row['units_per_write_lock']:.1f} writes each); "
                + (
                    f"scoped writes share it; chain lock wait "
                    f"{row['chain_wait_ms_per_call']:.2f} ms/call, held "
                    f"{row['chain_held_ms_per_call']:.2f} ms/call, "
                    f"{row['chain_utilisation']:.0%} of the time; "
                    if row.get("chain_held_ms_per_call")
                    else ""
                )
                + f"CPU ms/call proxies {cpu['proxies']:.2f}, upstreams {cpu['upstreams']:.2f}, "
                f"driver {cpu['driver']:.2f}, postgres {cpu['postgres_backends']:.2f}"
                f"+{cpu['postgres_other']:.2f}; ceilings: CPU "
                f"{row['cpu_ceiling_calls_per_s']:.0f} calls/s, "
                + (
                    # Scoped writes overlap under the shared write lock: the chain's bounds.
                    f"chain lock {row['chain_ceiling_calls_per_s']:.0f}"
                    if row.get("chain_held_ms_per_call")
                    else f"lock {row['lock_ceiling_calls_per_s']:.0f}"
                )
                + f" calls/s; machine {row['machine_busy']:.0%} "
                f"busy, {row['cores_used']['rest_of_machine']:.2f} cores others', "
                f"load {row['load_average']:.1f}",
            ])  # fmt: skip
    return table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a shorter window per phase")
    parser.add_argument(
        "--proxies", default="1,2,4,8", help="the phases' proxy counts, 1 first (default 1,2,4,8)"
    )
    parser.add_argument("--window", type=float, help="seconds per phase (default 5, 2 quick)")
    parser.add_argument(
        "--backend", action="append", choices=("postgresql", "sqlite"), help="(default both)"
    )
    parser.add_argument(
        "--apart",
        default=",".join(map(str, APART)),
        help="the phases' proxy counts with a PostgreSQL database each, 1 first; '' for none"
        " (default 1,4)",
    )
    parser.add_argument(
        "--sessions",
        choices=("team", "each"),
        default="team",
        help="one session every proxy serves, as docs/postgresql.md sets a team up (default),"
        " or a session of its own each",
    )
    options = parser.parse_args()
    counts = tuple(int(part) for part in options.proxies.split(","))
    if counts[0] != 1:
        parser.error("--proxies must start with 1 (the baseline of the ratios)")
    apart = tuple(int(part) for part in options.apart.split(",") if part)
    if apart and apart[0] != 1:
        parser.error("--apart must start with 1 (the baseline of the ratios)")
    backends = tuple(options.backend or ("postgresql", "sqlite"))
    results = run(options.quick, counts, options.window, backends, apart, options.sessions)
    print(json.dumps(results, indent=1))
    for line in rows(results):
        print(" | ".join(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
