"""A server that floods notifications holds neither the reader, the event loop, nor a deadline."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import pytest
from servers.harness import kill_quietly, read_json, stdio_server, wait_until

from agentrt.mcp import _stdio
from agentrt.mcp._connection import connect
from agentrt.mcp._connection_errors import CallTimeout

# The backstop: before the fix, the reader never yielded and these ran for good.
pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

_FLOOD = {"flood_notifications": True}
_DEADLINE = 3.0
# The deadline plus a stop of the server with the short grace below; generous for a busy host.
_WITHIN = 15.0


@pytest.fixture
def short_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    """Shorten the polite-shutdown waits: a flooding server never reads its closed stdin."""
    monkeypatch.setattr(_stdio, "GRACE_AFTER_STDIN_CLOSED", 0.3)
    monkeypatch.setattr(_stdio, "GRACE_AFTER_SIGTERM", 0.3)


def _group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes in process group `pgid`."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text(encoding="ascii")
        except OSError:
            continue
        state, _ppid, group = stat.rpartition(")")[2].split()[:3]
        if int(group) == pgid and state not in ("Z", "X"):
            members.append(int(entry.name))
    return members


class _Ticker:
    """Counts turns of the event loop that another task gets while the reader works."""

    def __init__(self) -> None:
        self.ticks = 0

    async def run(self) -> None:
        while True:
            await anyio.sleep(0.05)
            self.ticks += 1


@pytest.mark.parametrize("stage", ["connect", "call_tool"])
async def test_a_server_flooding_notifications_cannot_outlast_the_deadline(
    tmp_path: Path, short_grace: None, stage: str
) -> None:
    pidfile = tmp_path / "pid"
    if stage == "connect":
        server = stdio_server({"initialize": _FLOOD, "pidfile": str(pidfile)})
    else:
        server = stdio_server({"calls": {"flood": _FLOOD}, "pidfile": str(pidfile)})
    ticker = _Ticker()
    pgid = None
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(ticker.run)
            if stage == "connect":
                started = time.monotonic()
                with pytest.raises(TimeoutError), anyio.fail_after(_DEADLINE):
                    await connect(server)
                pgid = read_json(pidfile)["pgid"]
            else:
                connection = await connect(server)
                pgid = read_json(pidfile)["pgid"]
                try:
                    started = time.monotonic()
                    with pytest.raises(TimeoutError), anyio.fail_after(_DEADLINE):
                        await connection.call_tool("flood", "{}", timeout=60)
                finally:
                    await connection.aclose()
            elapsed = time.monotonic() - started
            group.cancel_scope.cancel()
        assert elapsed < _WITHIN
        # The event loop kept turning for other tasks while the server flooded.
        assert ticker.ticks >= 5
        assert wait_until(lambda: not _group_members(pgid), 5)
    finally:
        if pgid is not None:
            for pid in _group_members(pgid):
                kill_quietly(pid)


async def test_a_flooding_server_still_meets_the_call_timeout(
    tmp_path: Path, short_grace: None
) -> None:
    log = tmp_path / "received"
    server = stdio_server({"calls": {"flood": _FLOOD}, "log": str(log)})
    connection = await connect(server)
    try:
        with anyio.fail_after(20), pytest.raises(CallTimeout) as caught:
            await connection.call_tool("flood", "{}", timeout=1)
    finally:
        await connection.aclose()
    assert str(caught.value) == (
        'server "hostile" did not answer tools/call within 1s; the request was cancelled'
    )
    # The server still read its stdin: the cancellation reached it despite the flood.
    assert b'"method":"notifications/cancelled"' in log.read_bytes()
