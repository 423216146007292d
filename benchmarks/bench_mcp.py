"""Benchmarks 2 and 3: a governed MCP call against the raw SDK call, and a load of
1000 tools against the raw SDK listing, both against the same stdio server.

The raw side is the SDK's `ClientSession` over `stdio_client`; the governed
side is `agentrt.mcp.pin`/`load` and `Gate.step` on a file-backed store.
The governed call's floor is the raw call plus the commits one allowed step
makes (bench_gate measures that count), each taken right after the governed
call so a burst of disk latency from elsewhere hits both alike.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from _common import BENCH_SERVER, PYTHON, Result, percentile, ratio, summary
from bench_gate import Floor
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from agentrt import Decision, Gate, Limits, SideEffect, StepOutcome, ToolCall, open_store
from agentrt.mcp import Manifest, Rule, Server, load, pin

SERVER_NAME = "bench"


def server_command(tools: int, page_size: int = 100, prefix: str = "noop") -> list[str]:
    return [PYTHON, str(BENCH_SERVER), "--tools", str(tools), "--page-size", str(page_size),
            "--prefix", prefix]  # fmt: skip


def agentrt_server(tools: int, page_size: int = 100) -> Server:
    return Server(
        name=SERVER_NAME,
        command=server_command(tools, page_size),
        default_timeout=30.0,
        connect_timeout=60.0,
    )


@asynccontextmanager
async def raw_session(command: list[str]) -> AsyncIterator[ClientSession]:
    """The SDK's own client over stdio, initialized."""
    parameters = StdioServerParameters(command=command[0], args=command[1:])
    with open("/dev/null", "w") as errlog:
        async with (
            stdio_client(parameters, errlog=errlog) as (read_stream, write_stream),
            ClientSession(read_stream, write_stream) as session,
        ):
            await session.initialize()
            yield session


def all_read_only(manifest: Manifest) -> dict[str, Rule]:
    return {name: Rule(side_effect=SideEffect.READ_ONLY) for name in manifest.tools}


def _text(result: Any) -> str:
    return "".join(getattr(block, "text", "") for block in result.content)


def _check(outcome: StepOutcome, index: int) -> None:
    observation = outcome.observation
    if (
        observation is None
        or observation.kind != "result"
        or f"ok {index}" not in observation.content
    ):
        raise RuntimeError(f"governed call {index} did not give its result: {outcome}")


async def _governed_call(quick: bool, commits: int, workdir: Path) -> Result:
    calls = 150 if quick else 500
    warmup = 20
    server = agentrt_server(1)
    manifest = await pin(server)
    tools, report = await load(server, manifest, all_read_only(manifest))
    assert report.connection is not None
    store = open_store(workdir / "governed.db")
    floor = Floor(workdir / "governed-floor.db")
    floor.commits(1100)  # past the WAL's first checkpoint, like the store after warm-up
    gate = Gate(store, tools, limits=Limits(max_steps=calls + warmup + 10))
    tool = tools[0]
    samples: dict[str, list[float]] = {"raw": [], "tool": [], "governed": [], "floor": []}
    try:
        async with raw_session(server_command(1)) as session:
            run_id = await gate.start("bench")
            for index in range(calls + warmup):
                arguments = {"n": index}
                began = time.perf_counter()
                result = await session.call_tool("noop_0000", arguments)
                raw = time.perf_counter() - began
                if _text(result) != f"ok {index}":
                    raise RuntimeError(f"raw call {index} gave {_text(result)!r}")
                began = time.perf_counter()
                await tool.call(ToolCall(args=f'{{"n": {index}}}', tool=tool.spec.name))
                direct = time.perf_counter() - began
                began = time.perf_counter()
                outcome = await gate.step(
                    run_id, Decision.tool_call(tool.spec.name, f'{{"n": {index}}}')
                )
                governed = time.perf_counter() - began
                _check(outcome, index)
                floor_seconds = floor.commits(commits)
                if index >= warmup:
                    samples["raw"].append(raw)
                    samples["tool"].append(direct)
                    samples["governed"].append(governed)
                    samples["floor"].append(floor_seconds)
    finally:
        await report.connection.aclose()
        store.close()
        floor.close()
    stats = {key: summary(values) for key, values in samples.items()}
    baseline = {key: stats["raw"][key] + stats["floor"][key] for key in ("p50", "p99", "mean")}
    return {
        "calls": calls,
        "stats": stats,
        "ratio_p50": ratio(stats["governed"]["p50"], baseline["p50"]),
        "ratio_p99": ratio(stats["governed"]["p99"], baseline["p99"]),
        "ratio_to_raw_p50": ratio(stats["governed"]["p50"], stats["raw"]["p50"]),
        "tool_to_raw_p50": ratio(stats["tool"]["p50"], stats["raw"]["p50"]),
        "target_ratio": 1.3,
    }


async def _raw_listing(command: list[str]) -> dict[str, float]:
    parameters = StdioServerParameters(command=command[0], args=command[1:])
    began = time.perf_counter()
    with open("/dev/null", "w") as errlog:
        async with (
            stdio_client(parameters, errlog=errlog) as (read_stream, write_stream),
            ClientSession(read_stream, write_stream) as session,
        ):
            await session.initialize()
            connected = time.perf_counter()
            names: list[str] = []
            cursor: str | None = None
            while True:
                params = None if cursor is None else types.PaginatedRequestParams(cursor=cursor)
                page = await session.list_tools(params=params)
                names.extend(tool.name for tool in page.tools)
                cursor = page.next_cursor
                if cursor is None:
                    break
            listed = time.perf_counter()
    if len(names) != 1000:
        raise RuntimeError(f"the raw listing found {len(names)} tools, not 1000")
    return {"connect_s": connected - began, "list_s": listed - connected, "total_s": listed - began}


async def _agentrt_load(server: Server, manifest: Manifest, rules: dict[str, Rule]) -> float:
    began = time.perf_counter()
    tools, report = await load(server, manifest, rules)
    elapsed = time.perf_counter() - began
    assert report.connection is not None
    await report.connection.aclose()
    if len(tools) != 1000:
        raise RuntimeError(f"load registered {len(tools)} tools, not 1000: {report}")
    return elapsed


def _profile_load(server: Server, manifest: Manifest, rules: dict[str, Rule]) -> dict[str, Any]:
    profiler = cProfile.Profile()

    async def run() -> None:
        profiler.enable()
        _tools, report = await load(server, manifest, rules)
        profiler.disable()
        assert report.connection is not None
        await report.connection.aclose()

    anyio.run(run)
    stream = io.StringIO()
    stats = pstats.Stats(profiler, stream=stream)
    stats.sort_stats("cumulative").print_stats(35)
    parts: dict[str, float] = {}
    raw_stats: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    for (filename, _, function), (_, _, _, cumulative, _) in raw_stats.items():
        if "agentrt/mcp" in filename and function in ("connect_and_list", "_check_all"):
            parts[function] = parts.get(function, 0.0) + cumulative
        if "agentrt/mcp" in filename and function == "list_tools":
            parts["list_tools"] = parts.get("list_tools", 0.0) + cumulative
    return {"parts_s": parts, "profile": stream.getvalue()}


async def _load_rounds(rounds: int) -> Result:
    server = agentrt_server(1000)
    pin_began = time.perf_counter()
    manifest = await pin(server)
    pin_seconds = time.perf_counter() - pin_began
    rules = all_read_only(manifest)
    raw: list[dict[str, float]] = []
    loads: list[float] = []
    for _ in range(rounds):
        raw.append(await _raw_listing(server_command(1000)))
        loads.append(await _agentrt_load(server, manifest, rules))
    return {"pin_s": pin_seconds, "raw": raw, "load_s": loads, "manifest": manifest, "rules": rules}


def run(quick: bool = False, commits: int = 2) -> Result:
    with tempfile.TemporaryDirectory(prefix="agentrt-bench-mcp-") as name:
        governed = anyio.run(_governed_call, quick, commits, Path(name))
    rounds = 3 if quick else 5
    loaded = anyio.run(_load_rounds, rounds)
    raw_total = [entry["total_s"] for entry in loaded["raw"]]
    raw_list = [entry["list_s"] for entry in loaded["raw"]]
    raw_connect = [entry["connect_s"] for entry in loaded["raw"]]
    load_p50 = percentile(loaded["load_s"], 0.5)
    profiled = _profile_load(agentrt_server(1000), loaded["manifest"], loaded["rules"])
    return {
        "governed_call": governed,
        "load": {
            "tools": 1000,
            "pages": 10,
            "rounds": rounds,
            "pin_s": loaded["pin_s"],
            "load_s": loaded["load_s"],
            "raw_total_s": raw_total,
            "raw_connect_s": raw_connect,
            "raw_list_s": raw_list,
            "ratio": ratio(load_p50, percentile(raw_total, 0.5)),
            # Load less the raw side's spawn-and-handshake, against the raw listing alone.
            "ratio_after_connect": ratio(
                load_p50 - percentile(raw_connect, 0.5), percentile(raw_list, 0.5)
            ),
            "target_ratio": 2.0,
            "profile_parts_s": profiled["parts_s"],
            "profile": profiled["profile"],
        },
    }
