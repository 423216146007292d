"""Benchmarks 4 and 5: a host calling through `agentrt proxy` against calling the upstream
directly (and through peer proxies, where they install), sequentially and with 8 calls in
flight; and the proxy's peak RSS with 5 upstream servers and 1000 tools.

The host is the SDK's `ClientSession`.  `agentrt proxy` is measured over stdio
(how a desktop host starts it) and over streamable HTTP (like for like with
mcp-proxy, which only serves HTTP).  The proxy's floor is the commits one
proxied call makes, counted by running the proxy once with a COMMIT counter
(`_traced_proxy.py`), each taken right after the call in the timed pass.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
from _common import (
    HERE,
    PYTHON,
    Result,
    cpu_seconds,
    find_descendant,
    log,
    private_file,
    ratio,
    rss_kib,
    summary,
)
from bench_gate import Floor
from bench_mcp import raw_session, server_command
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from peers import Peer

from agentrt.mcp import Server, pin

CONCURRENCY = 8


@dataclass
class Target:
    name: str
    tool: str
    open: Callable[[], AbstractAsyncContextManager[ClientSession]]
    # A word of the serving process's command line, to read its CPU time: CPU per call
    # holds up on a shared machine where calls per second move with everyone's load.
    process: str


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def _wait_for_port(port: int, process: Any, seconds: float = 60.0) -> None:
    with anyio.fail_after(seconds):
        while True:
            if process.returncode is not None:
                raise RuntimeError(f"the server exited with {process.returncode} before listening")
            try:
                stream = await anyio.connect_tcp("127.0.0.1", port)
            except OSError:
                await anyio.sleep(0.1)
                continue
            await stream.aclose()
            return


@asynccontextmanager
async def stdio_session(
    command: list[str], cwd: Path | None = None, env: dict[str, str] | None = None
) -> AsyncIterator[ClientSession]:
    parameters = StdioServerParameters(
        command=command[0], args=command[1:], cwd=str(cwd) if cwd else None, env=env
    )
    with open(os.devnull, "w") as errlog:
        async with (
            stdio_client(parameters, errlog=errlog) as (read_stream, write_stream),
            ClientSession(read_stream, write_stream) as session,
        ):
            await session.initialize()
            yield session


@asynccontextmanager
async def http_session(
    command: list[str], port: int, path: str, wait_seconds: float = 60.0
) -> AsyncIterator[ClientSession]:
    """Start an HTTP-serving process, wait until it listens, and open an SDK session to it."""
    with open(os.devnull, "w") as devnull:
        process = await anyio.open_process(command, stdout=devnull, stderr=devnull)
        try:
            await _wait_for_port(port, process, wait_seconds)
            async with (
                httpx2.AsyncClient(timeout=60.0) as client,
                streamable_http_client(f"http://127.0.0.1:{port}{path}", http_client=client) as (
                    read_stream,
                    write_stream,
                ),
                ClientSession(read_stream, write_stream) as session,
            ):
                await session.initialize()
                yield session
        finally:
            if process.returncode is None:
                process.terminate()
                with anyio.move_on_after(5):
                    await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()


@asynccontextmanager
async def http_client_2026(command: list[str], port: int, path: str) -> AsyncIterator[Any]:
    """The same, for a host of the 2026-07-28 era: no session, each call its own POST with
    its envelope (the SDK's `Client`, which `_call` drives as it drives a session)."""
    from mcp import Client

    with open(os.devnull, "w") as devnull:
        process = await anyio.open_process(command, stdout=devnull, stderr=devnull)
        try:
            await _wait_for_port(port, process)
            url = f"http://127.0.0.1:{port}{path}"
            async with Client(url, mode="2026-07-28", cache=None) as client:
                yield client
        finally:
            if process.returncode is None:
                process.terminate()
                with anyio.move_on_after(5):
                    await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()


def _text(result: Any) -> str:
    return "".join(getattr(block, "text", "") for block in result.content)


async def _call(session: ClientSession, tool: str, index: int) -> float:
    began = time.perf_counter()
    result = await session.call_tool(tool, {"n": index})
    elapsed = time.perf_counter() - began
    if result.is_error or f"ok {index}" not in _text(result):
        raise RuntimeError(f"call {index} to {tool} failed: {_text(result)[:300]!r}")
    return elapsed


def write_config(root: Path, servers: list[dict[str, Any]]) -> Path:
    """A private proxy configuration, manifests beside it, in root/conf."""
    document = {"database": "proxy.db", "session": "bench", "servers": servers}
    return private_file(root / "conf" / "proxy.json", json.dumps(document))


async def upstream_entry(root: Path, name: str, tools: int, prefix: str = "noop") -> dict[str, Any]:
    command = server_command(tools, 100, prefix)
    server = Server(name=name, command=command, connect_timeout=60.0)
    manifest = await pin(server)
    private_file(root / "conf" / f"{name}.manifest.json", manifest.to_json())
    return {
        "name": name,
        "command": command,
        "default_timeout": "30s",
        "connect_timeout": "60s",
        "manifest": f"{name}.manifest.json",
        "rules": {tool: {"side_effect": "read_only"} for tool in manifest.tools},
    }


def _proxy_command(config: Path) -> list[str]:
    return [PYTHON, "-m", "agentrt.proxy", "--config", str(config)]


def _environment() -> dict[str, str]:
    environment = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp")}
    if "AGENTRT_ANCHOR_DIR" in os.environ:  # set by the PostgreSQL benchmark for its runs
        environment["AGENTRT_ANCHOR_DIR"] = os.environ["AGENTRT_ANCHOR_DIR"]
    return environment


def _fastmcp_config(commands: dict[str, list[str]]) -> str:
    servers = {
        name: {"command": command[0], "args": command[1:], "transport": "stdio"}
        for name, command in commands.items()
    }
    return json.dumps({"mcpServers": servers})


async def _count_commits(config: Path, root: Path, tool: str, calls: int = 20) -> dict[str, float]:
    """COMMITs per proxied call: all of them, and those that wrote (and so waited for fsync)."""
    count_file = root / "commits.count"
    command = [PYTHON, str(HERE / "_traced_proxy.py"), "--config", str(config)]
    count_file.unlink(missing_ok=True)
    environment = {**_environment(), "BENCH_COMMIT_COUNT": str(count_file)}

    def totals() -> tuple[int, int]:
        if not count_file.exists():
            return 0, 0
        commits, writing = count_file.read_text().split()
        return int(commits), int(writing)

    async with stdio_session(command, cwd=root, env=environment) as session:
        await session.list_tools()
        before = totals()
        for index in range(calls):
            await _call(session, tool, index)
        after = totals()
    return {
        "commits": (after[0] - before[0]) / calls,
        "writing_commits": (after[1] - before[1]) / calls,
    }


def _targets(config: Path, root: Path, peers: dict[str, Peer]) -> list[Target]:
    command = server_command(1)
    agentrt_port = _free_port()
    targets = [
        Target("direct", "noop_0000", lambda: raw_session(command), "bench_server.py"),
        Target(
            "agentrt-stdio",
            "bench_noop_0000",
            lambda: stdio_session(_proxy_command(config), cwd=root),
            "agentrt.proxy",
        ),
        Target(
            "agentrt-http",
            "bench_noop_0000",
            lambda: http_session(
                [*_proxy_command(config), "--http", f"127.0.0.1:{agentrt_port}"],
                agentrt_port,
                "/mcp",
            ),
            "agentrt.proxy",
        ),
    ]
    modern_port = _free_port()
    targets.append(
        Target(
            "agentrt-http-2026",
            "bench_noop_0000",
            lambda: http_client_2026(
                [*_proxy_command(config), "--http", f"127.0.0.1:{modern_port}"],
                modern_port,
                "/mcp",
            ),
            "agentrt.proxy",
        )
    )
    peer = peers.get("mcp-proxy")
    if peer is not None and peer.python is not None:
        port = _free_port()
        mcp_proxy = [str(peer.bin / "mcp-proxy"), "--port", str(port), "--host", "127.0.0.1",
                     "--", *command]  # fmt: skip
        targets.append(
            Target(
                "mcp-proxy-http",
                "noop_0000",
                lambda: http_session(mcp_proxy, port, "/mcp"),
                "mcp-proxy",
            )
        )
    peer = peers.get("fastmcp")
    if peer is not None and peer.python is not None:
        fastmcp = [str(peer.python), str(HERE / "fastmcp_proxy.py"),
                   _fastmcp_config({"bench": command})]  # fmt: skip
        targets.append(
            Target("fastmcp-stdio", "noop_0000", lambda: stdio_session(fastmcp), "fastmcp_proxy.py")
        )
        fastmcp_port = _free_port()
        fastmcp_http = [*fastmcp, "--http", f"127.0.0.1:{fastmcp_port}"]
        targets.append(
            Target(
                "fastmcp-http",
                "noop_0000",
                lambda: http_session(fastmcp_http, fastmcp_port, "/mcp"),
                "fastmcp_proxy.py",
            )
        )
    return targets


async def _sequential(
    targets: list[Target], calls: int, floor: Floor, commits: int, problems: dict[str, str]
) -> dict[str, Any]:
    samples: dict[str, list[float]] = {target.name: [] for target in targets}
    samples["floor"] = []
    startup: dict[str, float] = {}
    async with anyio.create_task_group():
        sessions: dict[str, ClientSession] = {}
        stack: list[AbstractAsyncContextManager[ClientSession]] = []
        try:
            for target in targets:
                began = time.perf_counter()
                manager = target.open()
                try:
                    sessions[target.name] = await manager.__aenter__()
                except Exception as exc:
                    problems[target.name] = f"{type(exc).__name__}: {exc}"[:500]
                    continue
                stack.append(manager)
                startup[target.name] = time.perf_counter() - began
            live = [target for target in targets if target.name in sessions]
            for index in range(calls + 10):
                for target in live:
                    elapsed = await _call(sessions[target.name], target.tool, index)
                    if index >= 10:
                        samples[target.name].append(elapsed)
                    if target.name == "agentrt-stdio":
                        floor_seconds = floor.commits(commits)
                        if index >= 10:
                            samples["floor"].append(floor_seconds)
        finally:
            log("proxy: closing the sessions")
            for manager in reversed(stack):
                await manager.__aexit__(None, None, None)
    return {
        "stats": {name: summary(values) for name, values in samples.items() if values},
        "startup_s": startup,
    }


async def _concurrent(target: Target, per_worker: int) -> dict[str, Any]:
    latencies: list[float] = []
    async with target.open() as session:
        for index in range(CONCURRENCY):  # warm-up
            await _call(session, target.tool, index)

        async def worker(worker_index: int) -> None:
            for step in range(per_worker):
                latencies.append(await _call(session, target.tool, worker_index * 1000 + step))

        pid = find_descendant(os.getpid(), target.process)
        cpu_before = cpu_seconds(pid) if pid is not None else None
        began = time.perf_counter()
        async with anyio.create_task_group() as group:
            for worker_index in range(CONCURRENCY):
                group.start_soon(worker, worker_index)
        wall = time.perf_counter() - began
        cpu = cpu_seconds(pid) - cpu_before if pid is not None and cpu_before is not None else None
    total = CONCURRENCY * per_worker
    log(f"proxy: {target.name} done")
    return {
        "calls": total,
        "wall_s": wall,
        "throughput": total / wall,
        # The serving process's own CPU (its upstream is a child, not counted).
        "cpu_s_per_call": cpu / total if cpu is not None else None,
        **summary(latencies),
    }


async def _proxy_latency(quick: bool, peers: dict[str, Peer], root: Path) -> Result:
    log("proxy: pinning the upstream")
    config = write_config(root, [await upstream_entry(root, "bench", 1)])
    log("proxy: counting commits per proxied call")
    counted = await _count_commits(config, root, "bench_noop_0000")
    commits_per_call = counted["writing_commits"]
    log("proxy: sequential calls")
    floor = Floor(root / "proxy-floor.db")
    floor.commits(1100)
    targets = _targets(config, root, peers)
    problems: dict[str, str] = {}
    sequential = await _sequential(
        targets, 60 if quick else 200, floor, max(1, round(commits_per_call)), problems
    )
    concurrent: dict[str, Any] = {}
    for target in targets:
        if target.name in problems:
            continue
        log(f"proxy: {CONCURRENCY} concurrent calls through {target.name}")
        try:
            concurrent[target.name] = await _concurrent(target, 10 if quick else 25)
        except Exception as exc:
            problems[f"{target.name} (concurrent)"] = f"{type(exc).__name__}: {exc}"[:500]
    floor.close()
    stats = sequential["stats"]
    added: dict[str, dict[str, float]] = {}
    direct = stats.get("direct")
    if direct is not None:
        for name, values in stats.items():
            if name not in ("direct", "floor"):
                added[name] = {key: values[key] - direct[key] for key in ("p50", "p99", "mean")}
    comparisons: dict[str, float] = {}
    floor_p50 = stats["floor"]["p50"] if "floor" in stats else 0.0
    for ours in ("agentrt-stdio", "agentrt-http"):
        for peer_name in ("fastmcp-stdio", "mcp-proxy-http", "fastmcp-http"):
            if ours in added and peer_name in added:
                comparisons[f"{ours} vs {peer_name}"] = ratio(
                    added[ours]["p50"], added[peer_name]["p50"] + floor_p50
                )
    if "direct" in concurrent:
        for values in concurrent.values():
            values["throughput_ratio_to_direct"] = ratio(
                values["throughput"], concurrent["direct"]["throughput"]
            )
    return {
        "commits_per_call": commits_per_call,
        "all_commits_per_call": counted["commits"],
        "sequential": sequential,
        "added_latency_s": added,
        "comparisons": comparisons,
        "concurrent": concurrent,
        "problems": problems,
    }


async def _peak_rss(peers: dict[str, Peer], root: Path) -> Result:
    """Peak RSS of the proxy with 5 upstreams of 200 tools each, after listing and calling."""
    log("memory: pinning 5 upstreams of 200 tools")
    servers = [await upstream_entry(root, f"s{index}", 200) for index in range(1, 6)]
    log("memory: the proxy over 5 upstreams")
    config = write_config(root, servers)
    result: dict[str, Any] = {"upstreams": 5, "tools": 1000}
    began = time.perf_counter()
    async with stdio_session(_proxy_command(config), cwd=root) as session:
        result["startup_s"] = time.perf_counter() - began
        began = time.perf_counter()
        listed = await session.list_tools()
        result["list_s"] = time.perf_counter() - began
        result["listed"] = len(listed.tools)
        began = time.perf_counter()
        for index in range(50):
            await _call(session, f"s{1 + index % 5}_noop_{index % 200:04d}", index)
        result["call_mean_s"] = (time.perf_counter() - began) / 50
        pid = find_descendant(os.getpid(), "agentrt.proxy")
        if pid is None:
            raise RuntimeError("the proxy process was not found under this process")
        result["proxy_kib"] = rss_kib(pid)
        upstream = find_descendant(pid, "bench_server.py")
        result["one_upstream_kib"] = rss_kib(upstream) if upstream is not None else None
    log("memory: a bare upstream")
    # Baseline in the same run: one bare SDK server with the same 200 tools, called directly.
    async with raw_session(server_command(200)) as session:
        await session.list_tools()
        await _call(session, "noop_0000", 1)
        bare = find_descendant(os.getpid(), "bench_server.py")
        result["bare_server_kib"] = rss_kib(bare) if bare is not None else None
    if result["bare_server_kib"]:
        result["ratio_to_bare_server"] = ratio(
            result["proxy_kib"]["VmHWM"], result["bare_server_kib"]["VmHWM"]
        )
    peer = peers.get("fastmcp")
    if peer is not None and peer.python is not None:
        commands = {entry["name"]: entry["command"] for entry in servers}
        command = [str(peer.python), str(HERE / "fastmcp_proxy.py"), _fastmcp_config(commands)]
        log("memory: fastmcp's proxy over 5 upstreams")
        try:
            with anyio.move_on_after(180) as deadline:
                await _fastmcp_memory(command, result)
            if deadline.cancelled_caught:
                result["fastmcp_problem"] = (
                    "FastMCP's proxy did not list and answer 10 calls within 180 s; "
                    "its RSS is as last sampled"
                )
        except Exception as exc:
            result["fastmcp_problem"] = f"{type(exc).__name__}: {exc}"[:500]
    return result


async def _fastmcp_memory(command: list[str], result: dict[str, Any]) -> None:
    began = time.perf_counter()
    async with stdio_session(command) as session:
        result["fastmcp_startup_s"] = time.perf_counter() - began
        fastmcp_pid = find_descendant(os.getpid(), "fastmcp_proxy.py")
        began = time.perf_counter()
        listed = await session.list_tools()
        result["fastmcp_list_s"] = time.perf_counter() - began
        names = [tool.name for tool in listed.tools]
        result["fastmcp_listed"] = len(names)
        if fastmcp_pid is not None:
            result["fastmcp_kib"] = rss_kib(fastmcp_pid)
        # FastMCP's multi-server proxy is slow per call here; a few calls suffice.
        began = time.perf_counter()
        for index in range(10):
            await _call(session, names[index * 97 % len(names)], index)
        result["fastmcp_call_mean_s"] = (time.perf_counter() - began) / 10
        if fastmcp_pid is not None:
            result["fastmcp_kib"] = rss_kib(fastmcp_pid)


def run(quick: bool, peers: dict[str, Peer]) -> Result:
    with tempfile.TemporaryDirectory(prefix="agentrt-bench-proxy-") as name:
        root = Path(name)
        latency = anyio.run(_proxy_latency, quick, peers, root / "latency")
        memory = anyio.run(_peak_rss, peers, root / "memory")
    return {"latency": latency, "memory": memory}


if __name__ == "__main__":
    import peers as peer_module

    found = {name: peer_module.ensure(name) for name in peer_module.PEERS}
    print(json.dumps(run(True, found), indent=1, default=str))
