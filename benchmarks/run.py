"""`make bench`: what governance costs, as ratios against baselines measured in the same run.

    python benchmarks/run.py [--quick]
                             [--only gate,concurrency,mcp,proxy,index,postgres,startup,
                                     retention,scale]
                             [--no-peers]

Prints a table of ratios and writes everything measured (every sample summary,
the profiles, the machine) to benchmarks/results/.  Absolute times are not
comparable between runs on a shared machine; the ratios are what to read.
Targets are reported, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _common import HERE, REPO, Result, log, ms, ratio, table

RESULTS = HERE / "results"


def machine() -> dict[str, Any]:
    cpu = ""
    with open("/proc/cpuinfo") as handle:
        for line in handle:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    disk = ""
    try:
        disk = subprocess.run(
            ["lsblk", "-d", "-n", "-o", "NAME,ROTA,SIZE,MODEL"],
            capture_output=True, text=True, timeout=10, check=False,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        disk = "unknown"
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
        capture_output=True, text=True, timeout=10, check=False,
    ).stdout.strip()  # fmt: skip
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "disk": disk,
        "python": platform.python_version(),
        "sqlite": __import__("sqlite3").sqlite_version,
        "commit": commit,
        "load_average": os.getloadavg(),
    }


def _verdict(value: float, target: float) -> str:
    if value != value:  # NaN
        return "n/a"
    return "met" if value <= target else "MISSED"


def ratio_rows(results: dict[str, Any]) -> list[list[str]]:
    rows: list[list[str]] = []
    gate = results.get("gate")
    if isinstance(gate, dict) and "rows" in gate:
        for row in gate["rows"]:
            rows.append([
                f"1 gate step, runs of {row['run_length']} (vs {gate['commits_per_step']:g} "
                "bare commits)",
                f"{row['ratio']:.2f}x", f"p50 {row['ratio_p50']:.2f}x",
                "<= 1.5x", _verdict(row["ratio"], 1.5),
                f"{ms(row['gate_per_step_s'])} vs {ms(row['floor_per_step_s'])}",
            ])  # fmt: skip
        rows.append([
            "1 gate step, CPU only (in-memory store)", "", "", "", "",
            f"{ms(gate['rows'][-1]['memory_gate_per_step_s'])} per step",
        ])  # fmt: skip
        for name, seconds in gate.get("parts_s", {}).items():
            rows.append([f"1   CPU part: {name}", "", "", "", "", f"{seconds * 1e6:.0f} us"])
        for name, value in gate.get("ablation", {}).get("file_ratio_to_floor", {}).items():
            rows.append([
                f"1 gate step on a file vs 2 bare commits, {name}",
                f"{value:.2f}x", "", "<= 1.5x", _verdict(value, 1.5), "",
            ])  # fmt: skip
        frames = gate.get("ablation", {}).get("wal_frames_per_commit", {})
        if frames:
            rows.append([
                "1 WAL frames (pages) per commit: gate step vs page-matched floor",
                f"{frames.get('gate', float('nan')):.1f}",
                f"floor {frames.get('floor', float('nan')):.1f}", "", "", "",
            ])  # fmt: skip
        if "chain" in gate.get("ablation", {}):
            rows.append([
                "1 hash chain of the gate's file", gate["ablation"]["chain"], "", "", "", "",
            ])  # fmt: skip
        rows.append([
            "1 flat in run length (runs of 1000 / runs of 10, p50)",
            f"{gate['flatness']:.2f}x", "", "~1.0x", "", "",
        ])  # fmt: skip
    concurrency = results.get("concurrency")
    if isinstance(concurrency, dict) and "rows" in concurrency:
        for row in concurrency["rows"]:
            grouped, single = row["grouped"], row["one_commit_per_write"]
            fsyncs = row.get("fsyncs_per_step")
            target = "<= 0.5" if row["runs"] == 32 else ""
            verdict = _verdict(fsyncs, 0.5) if row["runs"] == 32 and fsyncs is not None else ""
            rows.append([
                f"6 {row['runs']} concurrent runs on one store: fsyncs per step (strace)",
                "n/a" if fsyncs is None else f"{fsyncs:.3f}",
                f"commits {grouped['commits_per_step']:.3f}", target, verdict,
                f"without group commit: {row['fsyncs_per_step_one_commit_per_write'] or 0:.2f}"
                f" fsyncs, {single['commits_per_step']:.2f} commits",
            ])  # fmt: skip
            rows.append([
                f"6 {row['runs']} concurrent runs: steps/s, group commit vs one commit per write",
                f"{row['throughput_ratio']:.2f}x", "", "", "",
                f"{grouped['steps_per_s']:.0f} vs {single['steps_per_s']:.0f} steps/s",
            ])  # fmt: skip
    postgres = results.get("postgres")
    if isinstance(postgres, dict) and "skipped" in postgres:
        rows.append(["7 the store on PostgreSQL", "skipped", "", "", "", postgres["skipped"]])
    if isinstance(postgres, dict) and "rows" in postgres:
        for row in postgres["rows"]:
            pg, lite, floor = row["postgres"], row["sqlite"], row["floor"]
            rows.append([
                f"7 {row['runs']} gate step(s) at once on PostgreSQL vs 2 bare PG commits (p50)",
                f"{row['ratio_to_floor_p50']:.2f}x", "", "", "",
                f"{ms(pg['p50'])} vs 2 x {ms(floor['p50'])}",
            ])  # fmt: skip
            rows.append([
                f"7 {row['runs']} gate step(s) at once, PostgreSQL vs SQLite (p50; steps/s)",
                f"{row['ratio_to_sqlite_p50']:.2f}x",
                f"{row['throughput_ratio_to_sqlite']:.2f}x steps/s", "", "",
                f"{pg['steps_per_s']:.0f} vs {lite['steps_per_s']:.0f} steps/s; "
                f"floor {floor['commits_per_s']:.0f} commits/s",
            ])  # fmt: skip
        for concurrent, pair in postgres.get("proxied", {}).items():
            pg, lite = pair["postgres"], pair["sqlite"]
            rows.append([
                f"7 proxied call, {concurrent} at once, PostgreSQL vs SQLite (p50)",
                f"{ratio(pg['p50'], lite['p50']):.2f}x",
                f"{ratio(pg['calls_per_s'], lite['calls_per_s']):.2f}x calls/s", "", "",
                f"p50 {ms(pg['p50'])} vs {ms(lite['p50'])}",
            ])  # fmt: skip
    mcp = results.get("mcp")
    if isinstance(mcp, dict) and "governed_call" in mcp:
        call = mcp["governed_call"]
        stats = call["stats"]
        rows.append([
            "2 governed MCP call vs raw SDK call + floor",
            f"p50 {call['ratio_p50']:.2f}x", f"p99 {call['ratio_p99']:.2f}x",
            "<= 1.3x", _verdict(call["ratio_p50"], 1.3),
            f"p50 {ms(stats['governed']['p50'])} vs {ms(stats['raw']['p50'])} + "
            f"{ms(stats['floor']['p50'])}",
        ])  # fmt: skip
        rows.append([
            "2 agentrt.mcp tool call (no gate) vs raw SDK call",
            f"p50 {call['tool_to_raw_p50']:.2f}x", "", "", "",
            f"p50 {ms(stats['tool']['p50'])}",
        ])  # fmt: skip
        load = mcp["load"]
        rows.append([
            "3 load of 1000 tools vs raw SDK connect + listing",
            f"{load['ratio']:.2f}x", f"after connect {load['ratio_after_connect']:.1f}x",
            "<= 2x", _verdict(load["ratio"], 2.0),
            f"median {sorted(load['load_s'])[len(load['load_s']) // 2]:.2f} s",
        ])  # fmt: skip
    proxy = results.get("proxy")
    if isinstance(proxy, dict) and "latency" in proxy:
        latency = proxy["latency"]
        stats = latency["sequential"]["stats"]
        direct = stats.get("direct", {}).get("p50", float("nan"))
        for name, values in stats.items():
            if name in ("direct", "floor"):
                continue
            rows.append([
                f"4 sequential call through {name} vs direct", f"p50 {values['p50'] / direct:.2f}x",
                f"p99 {values['p99'] / stats['direct']['p99']:.2f}x", "", "",
                f"added p50 {ms(values['p50'] - direct)}",
            ])  # fmt: skip
        rows.append([
            "4 commits per proxied call (writing / all)",
            f"{latency['commits_per_call']:g} / {latency.get('all_commits_per_call', 0):g}",
            "", "", "", "",
        ])  # fmt: skip
        for name, value in latency["comparisons"].items():
            rows.append([
                f"4 added latency {name} (+ floor of "
                f"{latency['commits_per_call']:g} commits)",
                f"{value:.2f}x", "", "<= 1.0x", _verdict(value, 1.0), "",
            ])  # fmt: skip
        for name, values in latency["concurrent"].items():
            cpu = values.get("cpu_s_per_call")
            rows.append([
                f"4 8 concurrent calls through {name}: throughput vs direct",
                f"{values.get('throughput_ratio_to_direct', float('nan')):.3f}x",
                f"p50 {ms(values['p50'])}", "", "",
                f"{values['throughput']:.0f} calls/s"
                + (f", own CPU {ms(cpu)} a call" if cpu is not None else ""),
            ])  # fmt: skip
        for name, problem in latency["problems"].items():
            rows.append([f"4 {name}", "not measured", "", "", "", problem[:80]])
    if isinstance(proxy, dict) and "memory" in proxy:
        memory = proxy["memory"]
        peak = memory["proxy_kib"]["VmHWM"]
        rows.append([
            "5 proxy peak RSS, 5 upstreams / 1000 tools, vs one bare SDK server",
            f"{memory.get('ratio_to_bare_server', float('nan')):.2f}x", "", "", "",
            f"{peak / 1024:.0f} MiB",
        ])  # fmt: skip
        if "fastmcp_kib" in memory:
            rows.append([
                "5 fastmcp proxy peak RSS, same 5 upstreams, vs agentrt proxy",
                f"{memory['fastmcp_kib']['VmHWM'] / peak:.2f}x", "", "", "",
                f"{memory['fastmcp_kib']['VmHWM'] / 1024:.0f} MiB",
            ])  # fmt: skip
    index = results.get("index")
    if isinstance(index, dict) and "rows" in index:
        for row in index["rows"][1:]:
            rows.append([
                f"11 proxy index lookup p50, {row['history']:,} earlier identical calls vs 10",
                f"{row['ratio_p50']:.2f}x", "", "<= 1.5x", _verdict(row["ratio_p50"], 1.5),
                f"{ms(row['p50_s'])} vs {ms(index['rows'][0]['p50_s'])}",
            ])  # fmt: skip
    startup = results.get("startup")
    if isinstance(startup, dict) and "skipped" in startup:
        rows.append(["12 start-up", "skipped", "", "", "", startup["skipped"]])
    if isinstance(startup, dict) and "ready" in startup:
        ready = startup["ready"]
        rows.append([
            "12 proxy ready (tools/list) after spawn vs the filesystem server direct (p50)",
            f"+{ready['delta_p50_s']:.2f} s", f"{ready['ratio_p50']:.2f}x", "<= +0.3 s",
            _verdict(ready["delta_p50_s"], 0.3),
            f"{ready['agentrt_p50_s']:.2f} s vs {ready['direct_p50_s']:.2f} s; proxy CPU "
            f"{ready['agentrt_cpu_to_ready_p50_s']:.2f} s",
        ])  # fmt: skip
        ready_2026 = startup.get("ready_2026")
        if isinstance(ready_2026, dict):
            rows.append([
                "12 the same, a 2026-07-28 host (as Claude Code: discover, listen, lists)",
                f"+{ready_2026['delta_p50_s']:.2f} s", f"{ready_2026['ratio_p50']:.2f}x",
                "<= +0.3 s", _verdict(ready_2026["delta_p50_s"], 0.3),
                f"{ready_2026['agentrt_p50_s']:.2f} s vs {ready_2026['direct_p50_s']:.2f} s; "
                f"proxy CPU {ready_2026['agentrt_cpu_to_ready_p50_s']:.2f} s",
            ])  # fmt: skip
        for key, host in (("instant", "handshake-era host"), ("instant_2026", "2026-07-28 host")):
            instant = startup.get(key)
            if isinstance(instant, dict):
                rows.append([
                    f"12 the same, a server ready at once (plain Python, no SDK), {host}",
                    f"+{instant['delta_p50_s']:.2f} s", f"{instant['ratio_p50']:.1f}x",
                    "<= +0.3 s", _verdict(instant["delta_p50_s"], 0.3),
                    f"{instant['agentrt_p50_s']:.2f} s vs {instant['direct_p50_s']:.3f} s; "
                    f"proxy CPU {instant['agentrt_cpu_to_ready_p50_s']:.2f} s",
                ])  # fmt: skip
        memory = startup["memory"]
        rss = memory["proxy_rss_kib"] / 1024
        rows.append([
            f"12 proxy RSS, one upstream, after {memory['calls']} calls", f"{rss:.0f} MiB",
            f"peak {memory['proxy_peak_kib'] / 1024:.0f} MiB", "<= 45 MiB", _verdict(rss, 45),
            f"bare interpreter {memory['interpreter_rss_kib'] / 1024:.0f} MiB",
        ])  # fmt: skip
        commands = startup["commands"]
        for name, seconds in commands["cpu_p50_s"].items():
            if name == "python":
                continue
            rows.append([
                f"12 agentrt {name}: CPU time (p50)", f"{seconds:.2f} s",
                f"+{commands['minus_interpreter_p50_s'][name]:.2f} s over python -c pass",
                "<= 0.25 s", _verdict(seconds, 0.25), "",
            ])  # fmt: skip
    retention = results.get("retention")
    if isinstance(retention, dict):
        import bench_retention

        rows.extend(bench_retention.rows(retention))
    scale = results.get("scale")
    if isinstance(scale, dict) and "error" not in scale:
        import bench_scale

        rows.extend(bench_scale.rows(scale))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer samples (a smoke run)")
    parser.add_argument(
        "--only",
        default="gate,concurrency,mcp,proxy,index,postgres,startup,retention,scale",
        help="comma-separated benchmarks",
    )
    parser.add_argument("--no-peers", action="store_true", help="skip the peer proxies")
    parser.add_argument(
        "--results",
        type=Path,
        default=RESULTS,
        help=f"where the JSON goes (default {RESULTS.relative_to(REPO)})",
    )
    options = parser.parse_args(argv)
    selected = {name.strip() for name in options.only.split(",") if name.strip()}
    began = time.perf_counter()
    results: dict[str, Any] = {
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "quick": options.quick,
        "machine": machine(),
    }
    failed = False
    commits_per_step = 2
    if "gate" in selected:
        log("gate: steps against bare commits")
        failed |= _guarded(results, "gate", lambda: _gate(options.quick))
        gate = results.get("gate")
        if isinstance(gate, dict) and "commits_per_step" in gate:
            commits_per_step = max(1, round(gate["commits_per_step"]))
    if "concurrency" in selected:
        log("concurrency: 1, 8 and 32 runs at once on one store")
        failed |= _guarded(results, "concurrency", lambda: _concurrency(options.quick))
    if "mcp" in selected:
        log("mcp: governed calls and a load of 1000 tools")
        failed |= _guarded(results, "mcp", lambda: _mcp(options.quick, commits_per_step))
    if "proxy" in selected:
        failed |= _guarded(results, "proxy", lambda: _proxy(options.quick, options.no_peers))
    if "index" in selected:
        failed |= _guarded(results, "index", lambda: _index(options.quick))
    if "postgres" in selected:
        log("postgres: the store on PostgreSQL against SQLite and bare commits")
        failed |= _guarded(results, "postgres", lambda: _postgres(options.quick))
    if "startup" in selected:
        log("startup: a proxy's start-up, memory, and the command's CPU time")
        failed |= _guarded(results, "startup", lambda: _startup(options.quick))
    if "retention" in selected:
        log("retention: checkpoints, verify, archive and evidence at size")
        failed |= _guarded(results, "retention", lambda: _retention(options.quick))
    if "scale" in selected:
        log("scale: 1, 2, 4 and 8 proxies on one database")
        failed |= _guarded(results, "scale", lambda: _scale(options.quick))
    results["machine"]["load_average_end"] = os.getloadavg()
    results["seconds"] = time.perf_counter() - began

    options.results.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = options.results / f"bench-{stamp}.json"
    path.write_text(json.dumps(results, indent=1, default=str))
    (options.results / "latest.json").write_text(json.dumps(results, indent=1, default=str))

    info = results["machine"]
    print(
        f"\nagentrt benchmarks ({'quick' if options.quick else 'full'}), commit {info['commit']}: "
        f"{info['nproc']} x {info['cpu']}, Python {info['python']}, SQLite {info['sqlite']}, "
        f"load average {info['load_average'][0]:.1f} -> {info['load_average_end'][0]:.1f}"
    )
    print(
        table(
            ratio_rows(results),
            ["benchmark", "ratio", "also", "target", "verdict", "absolute (this run only)"],
        )
    )
    proxy = results.get("proxy")
    peers = proxy.get("peers", {}) if isinstance(proxy, dict) else {}
    for name, problem in peers.items():
        if problem:
            print(f"peer {name}: {problem}")
    shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path
    print(f"\nall results: {shown} ({results['seconds']:.0f} s)")
    return 1 if failed else 0


def _guarded(results: dict[str, Any], name: str, work: Any) -> bool:
    """Run one benchmark; a failure is recorded and reported, and the others still run."""
    try:
        results[name] = work()
    except Exception:
        results[name] = {"error": traceback.format_exc()}
        log(f"{name}: FAILED\n{results[name]['error']}")
        return True
    return False


def _postgres(quick: bool) -> Result:
    import bench_postgres

    return bench_postgres.run(quick)


def _scale(quick: bool) -> Result:
    import bench_scale

    return bench_scale.run(quick)


def _retention(quick: bool) -> Result:
    import bench_retention

    return bench_retention.run(quick)


def _startup(quick: bool) -> Result:
    import bench_startup

    return bench_startup.run(quick)


def _index(quick: bool) -> Result:
    import bench_index

    return bench_index.run(quick)


def _gate(quick: bool) -> Result:
    import bench_gate

    result = bench_gate.run(quick)
    log("gate: the gate on a file against a page-matched floor")
    result["ablation"] = bench_gate.ablation(quick)
    return result


def _concurrency(quick: bool) -> Result:
    import bench_concurrency

    return bench_concurrency.run(quick)


def _mcp(quick: bool, commits: int) -> Result:
    import bench_mcp

    return bench_mcp.run(quick, commits)  # type: ignore[no-any-return]


def _proxy(quick: bool, no_peers: bool) -> Result:
    import bench_proxy
    import peers

    found: dict[str, peers.Peer] = {}
    if not no_peers:
        for name in peers.PEERS:
            log(f"peers: making sure {name} is installed in benchmarks/.peers/{name}")
            found[name] = peers.ensure(name)
            if found[name].problem:
                log(found[name].problem)
    result = bench_proxy.run(quick, found)
    result["peers"] = {name: peer.problem for name, peer in found.items()}
    return result


if __name__ == "__main__":
    sys.exit(main())
