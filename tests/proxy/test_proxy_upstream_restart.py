"""Through `agentrt proxy`: an upstream killed between calls is started again, and the next
mutating call runs once with a known outcome instead of becoming an unknown one."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import anyio
import pytest
from proxy_helpers import UPSTREAM, build_setup, host, text_of

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120), pytest.mark.slow]


def _upstream_pids(log: Path) -> list[int]:
    """The upstream processes started for this test (its log path is in their environment)."""
    pids = []
    marker = f"PROXY_UPSTREAM_LOG={log}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                command = handle.read()
            with open(f"/proc/{entry}/environ", "rb") as handle:
                environment = handle.read().split(b"\0")
            with open(f"/proc/{entry}/stat", encoding="ascii") as handle:
                state = handle.read().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if str(UPSTREAM).encode() in command and marker in environment and state != "Z":
            pids.append(int(entry))
    return pids


async def test_an_upstream_killed_between_calls_is_restarted_and_the_next_call_runs_once(
    tmp_path: Path,
) -> None:
    setup = await build_setup(tmp_path)
    async with host(setup) as session:
        first = await session.call_tool("up_write_note", {"note": "before"})
        assert text_of(first) == "noted before"
        [pid] = _upstream_pids(setup.upstream_log)
        os.kill(pid, signal.SIGKILL)
        # "Between calls": the kill has finished before the next call is sent
        # (a server that dies while a call is on its way is an unknown outcome).
        deadline = time.monotonic() + 10
        while _upstream_pids(setup.upstream_log) and time.monotonic() < deadline:
            await anyio.sleep(0.02)
        second = await session.call_tool("up_write_note", {"note": "after"})
        echo = await session.call_tool("up_echo", {"text": "still here"})
        [restarted] = _upstream_pids(setup.upstream_log)
    assert text_of(second) == "noted after"
    assert text_of(echo) == "still here"
    assert restarted != pid
    assert setup.executions("write_note") == ["write_note before", "write_note after"]
    restarts = [line for line in setup.stderr().splitlines() if "started it again" in line]
    assert restarts == [
        'agentrt: server "up" exited (signal 9); started it again and listed its tools '
        "(every loaded tool still matches its pin)"
    ]
