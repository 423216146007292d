"""Instructions per allowed gate step and per proxied call, counted by valgrind's cachegrind.

    python benchmarks/instructions.py gate|proxy|proxy-http [--small N] [--large M]

A count, unlike a time, does not move with the machine's other tenants: it is what
an A/B of a behaviour-preserving change reads (issue 28).  `gate` runs a process
twice, N and M allowed steps on a temporary SQLite file after the same warm-up,
and reports (I(M) - I(N)) / (M - N) over every thread (the store's writer
included), so start-up and imports cancel out.  `proxy` counts `agentrt proxy`
over stdio only while it serves M - N calls after a warm-up (its upstream, a
child, is not counted); `proxy-http` the same over streamable HTTP, one call at a time
(issue 36).  To measure another tree's code with this one's venv, set
PYTHONPATH=<that tree>/src.  Needs `valgrind`.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile
from pathlib import Path

import anyio
from _common import PYTHON, find_descendant
from bench_gate import _check, _gate
from bench_proxy import (
    _call,
    _free_port,
    _proxy_command,
    http_session,
    stdio_session,
    upstream_entry,
    write_config,
)

from agentrt import Decision

WARM_UP = 20
VALGRIND = ["valgrind", "--tool=cachegrind", "--cache-sim=no"]


def _refs(output: str) -> int:
    match = re.search(r"I\s+refs:\s+([\d,]+)", output)
    if match is None:
        raise RuntimeError(f"valgrind printed no instruction count: {output[-500:]!r}")
    return int(match.group(1).replace(",", ""))


def _steps(steps: int) -> None:
    """The measured child: WARM_UP then `steps` allowed steps on one run."""
    with tempfile.TemporaryDirectory(prefix="agentrt-instructions-") as name:
        gate = _gate(Path(name) / "gate.db", WARM_UP + steps)

        async def run() -> None:
            run_id = await gate.start("instructions")
            for index in range(WARM_UP + steps):
                _check(await gate.step(run_id, Decision.tool_call("noop", f'{{"n": {index}}}')))

        anyio.run(run)
        gate.store.close()


def gate_instructions(steps: int) -> int:
    child = [PYTHON, __file__, "--child", str(steps)]
    command = [*VALGRIND, "--cachegrind-out-file=/dev/null", *child]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return _refs(done.stderr)


async def _proxied(calls: int) -> int:
    """Instructions of `agentrt proxy` while it serves `calls` calls: callgrind with
    instrumentation switched on only around them, so neither start-up nor exit (whose
    garbage collection moves from run to run) is counted."""
    with tempfile.TemporaryDirectory(prefix="agentrt-instructions-") as name:
        root = Path(name)
        out = root / "callgrind.out"
        config = write_config(root, [await upstream_entry(root, "bench", 1)])
        command = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
                   f"--callgrind-out-file={out}", *_proxy_command(config)]  # fmt: skip
        environment = {key: os.environ[key] for key in ("PATH", "HOME", "PYTHONPATH")
                       if key in os.environ}  # fmt: skip
        async with stdio_session(command, cwd=root, env=environment) as session:
            await session.list_tools()
            for index in range(WARM_UP):
                await _call(session, "bench_noop_0000", index)
            await anyio.run_process(["callgrind_control", "--instr=on", str(session_pid(root))])
            for index in range(calls):
                await _call(session, "bench_noop_0000", WARM_UP + index)
            await anyio.run_process(["callgrind_control", "--instr=off", str(session_pid(root))])
        match = re.search(r"^totals:\s+(\d+)", out.read_text(), re.MULTILINE)
        if match is None:
            raise RuntimeError("callgrind wrote no totals for the proxy")
        return int(match.group(1))


async def _proxied_http(calls: int) -> int:
    """`_proxied` over streamable HTTP: the proxy under callgrind serves an SDK host's
    session on a free port."""
    with tempfile.TemporaryDirectory(prefix="agentrt-instructions-") as name:
        root = Path(name)
        out = root / "callgrind.out"
        config = write_config(root, [await upstream_entry(root, "bench", 1)])
        port = _free_port()
        command = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
                   f"--callgrind-out-file={out}", *_proxy_command(config),
                   "--http", f"127.0.0.1:{port}"]  # fmt: skip
        async with http_session(command, port, "/mcp", wait_seconds=900.0) as session:
            await session.list_tools()
            for index in range(WARM_UP):
                await _call(session, "bench_noop_0000", index)
            await anyio.run_process(["callgrind_control", "--instr=on", str(session_pid(root))])
            for index in range(calls):
                await _call(session, "bench_noop_0000", WARM_UP + index)
            await anyio.run_process(["callgrind_control", "--instr=off", str(session_pid(root))])
        match = re.search(r"^totals:\s+(\d+)", out.read_text(), re.MULTILINE)
        if match is None:
            raise RuntimeError("callgrind wrote no totals for the proxy")
        return int(match.group(1))


def session_pid(root: Path) -> int:
    """The proxy's process: the one valgrind runs on this configuration."""
    pid = find_descendant(os.getpid(), str(root / "conf" / "proxy.json"))
    if pid is None:
        raise RuntimeError("the proxy under callgrind was not found under this process")
    return pid


def proxy_instructions(calls: int) -> int:
    return anyio.run(_proxied, calls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("measure", choices=["gate", "proxy", "proxy-http"], nargs="?")
    parser.add_argument("--small", type=int, default=100)
    parser.add_argument("--large", type=int, default=1100)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child is not None:
        _steps(options.child)
        return
    if options.measure is None:
        parser.error("say gate or proxy")
    if options.measure in ("proxy", "proxy-http"):
        calls = options.large - options.small
        measure = _proxied if options.measure == "proxy" else _proxied_http
        counted = anyio.run(measure, calls)
        print(f"{counted / calls:,.0f} instructions per proxied call ({calls})")
        return
    small, large = gate_instructions(options.small), gate_instructions(options.large)
    per = (large - small) / (options.large - options.small)
    print(
        f"{per:,.0f} instructions per step ({options.small}: {small:,}; {options.large}: {large:,})"
    )


if __name__ == "__main__":
    main()
