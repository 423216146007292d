"""Through `agentrt proxy`: what a server sends while NO request to it is in flight is
heard at once (docs/decisions/0049-idle-reader.md), over stdio (an idle reader on the
server's stdout) and over streamable HTTP (the session's standalone GET stream, held open
because the server advertises `listChanged`).

The changing server's "later" tool answers at once and acts afterwards, on no request's
stream: it changes a tool, floods notifications, writes garbage or dies.  The host sends
nothing while it waits, so only the proxy's own reading can notice.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import anyio
import pytest
from proxy_helpers import text_of
from test_proxy_live_listing import _host, _listing_events, _setup, changing

from agentrt.proxy._live import RELIST_INTERVAL

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120), pytest.mark.slow]

__all__ = ["changing"]  # the fixture, parametrized over stdio and HTTP

# How long a change made while idle may take to reach the host: the change itself
# (half a second), at most one relisting interval, the listing, on a loaded machine.
TOLD_WITHIN = 15.0
REASON = "its description changed since it was pinned; review it and pin again"


def _proxy_process() -> int:
    """The proxy the SDK's stdio client started: this process's child running it."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        parent = int(stat.rpartition(")")[2].split()[1])
        if parent == os.getpid() and b"proxy" in command:
            return int(entry.name)
    raise LookupError("no proxy process is running")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise LookupError("no VmRSS")


async def _until(condition: Any, limit: float = TOLD_WITHIN) -> None:
    with anyio.fail_after(limit):
        while not condition():
            await anyio.sleep(0.05)


async def test_a_tool_changed_while_no_request_is_in_flight_is_told_to_the_host_at_once(
    tmp_path: Path, changing: dict[str, Any]
) -> None:
    setup = await _setup(tmp_path, changing)
    async with _host(setup) as host:
        assert "chg_note" in await host.names()
        # The server withdraws the reviewed tool half a second after this answer; the
        # host then sends nothing at all until it is told.
        later = await host.session.call_tool("chg_later", {"what": "redescribe", "after": 0.5})
        assert text_of(later) == "later: redescribe"
        await host.wait_changed(TOLD_WITHIN)
        withheld = await host.names()
        # The tool comes back as it was pinned, again while idle: the host is told it is
        # there again, and it runs.
        await host.session.call_tool("chg_later", {"what": "restore", "after": 0.5})
        await host.wait_changed(TOLD_WITHIN)
        back = await host.names()
        noted = await host.session.call_tool("chg_note", {"text": "back"})
        # A tool nobody pinned, added while idle: recorded and said, never shown.
        await host.session.call_tool("chg_later", {"what": "add", "after": 0.5})
        await _until(lambda: len(_listing_events(setup)) >= 3)
        added = await host.names()
        other = await host.session.call_tool("up_echo", {"text": "other server"})
    assert "chg_note" not in withheld
    assert {"chg_echo", "up_echo"} <= withheld
    assert "chg_note" in back
    assert text_of(noted) == "noted back"
    assert added == back
    assert text_of(other) == "other server"
    assert host.changed == 2
    assert _listing_events(setup) == [
        {"server": "chg", "session": "test-session", "refused": {"note": REASON}, "unpinned": []},
        {"server": "chg", "session": "test-session", "refused": {}, "unpinned": []},
        {"server": "chg", "session": "test-session", "refused": {}, "unpinned": ["plugin"]},
    ]
    assert (
        f"agentrt proxy: server chg listed its tools again: refused note: {REASON}"
    ) in setup.stderr().splitlines()


async def test_a_flood_of_notifications_while_idle_costs_bounded_listings_memory_and_cpu(
    tmp_path: Path, changing: dict[str, Any]
) -> None:
    setup = await _setup(tmp_path, changing)
    async with _host(setup) as host:
        proxy = _proxy_process()
        base = json.loads(text_of(await host.session.call_tool("chg_listings", {})))
        rss_before = _rss_mib(proxy)
        cpu_before = _cpu_seconds(proxy)
        started = anyio.current_time()
        await host.session.call_tool("chg_later", {"what": "flood", "count": 20000, "after": 0})
        # Idle while the server floods: the proxy reads, at a bounded pace, on its own.
        await anyio.sleep(3.0)
        cpu_idle = _cpu_seconds(proxy) - cpu_before
        rss_after = _rss_mib(proxy)
        seen = json.loads(text_of(await host.session.call_tool("chg_listings", {})))
        lasted = anyio.current_time() - started
        echo = await host.session.call_tool("chg_echo", {"text": "still serving"})
        other = await host.session.call_tool("up_echo", {"text": "unharmed"})
        names = await host.names()
    listings = seen["count"] - base["count"]
    # At least the first notification was heard while idle; one listing a second at most.
    assert 1 <= listings <= 2 + int(lasted / RELIST_INTERVAL), (base, seen, lasted)
    assert seen["max_in_flight"] == 1
    assert rss_after - rss_before < 40, (rss_before, rss_after)
    # 20,000 notifications: the proxy's reading between requests is paced
    # (`_stdio.IDLE_MESSAGES_PER_SECOND`), and each costs a parse and a mark.  Measured
    # 0.25 s (stdio) and 0.63 s (HTTP) on a quiet machine, 1.52 s once in a loaded CI run;
    # the bound is for a reader that never pauses, not a timing.
    assert cpu_idle < 3.0, cpu_idle
    assert text_of(echo) == "still serving"
    assert text_of(other) == "unharmed"
    assert {"chg_echo", "chg_note", "up_echo"} <= names
    assert host.changed == 0
    assert _listing_events(setup) == []  # nothing changed what is served


@pytest.mark.parametrize("changing", ["stdio"], indirect=True)
async def test_a_server_that_dies_while_idle_is_reported_at_once_and_started_at_its_next_call(
    tmp_path: Path, changing: dict[str, Any]
) -> None:
    setup = await _setup(tmp_path, changing)
    noticed = (
        'agentrt: server "chg" exited (status 3) while no request was in flight; it is '
        "started again at its next call"
    )
    async with _host(setup) as host:
        await host.session.call_tool("chg_later", {"what": "die", "after": 0.5})
        # Nothing is sent: the death is noticed by the proxy's own reading.
        await _until(lambda: noticed in setup.stderr().splitlines())
        other = await host.session.call_tool("up_echo", {"text": "unharmed"})
        again = await host.session.call_tool("chg_echo", {"text": "started again"})
        names = await host.names()
    assert text_of(other) == "unharmed"
    assert text_of(again) == "started again"
    assert {"chg_echo", "chg_note", "up_echo"} <= names
    lines = setup.stderr().splitlines()
    assert lines.count(noticed) == 1
    assert (
        'agentrt: server "chg" exited (status 3); started it again and listed its tools '
        "(every loaded tool still matches its pin)"
    ) in lines
    assert _listing_events(setup) == []  # the chain verifies, nothing was recorded


@pytest.mark.parametrize("changing", ["stdio"], indirect=True)
async def test_garbage_written_while_idle_is_set_aside_and_the_reader_keeps_reading(
    tmp_path: Path, changing: dict[str, Any]
) -> None:
    setup = await _setup(tmp_path, changing)
    async with _host(setup) as host:
        await host.session.call_tool("chg_later", {"what": "garbage", "after": 0.2})
        await anyio.sleep(0.5)
        # After the garbage, a change made while idle is still heard.
        await host.session.call_tool("chg_later", {"what": "redescribe", "after": 0.5})
        await host.wait_changed(TOLD_WITHIN)
        names = await host.names()
        echo = await host.session.call_tool("chg_echo", {"text": "after garbage"})
        other = await host.session.call_tool("up_echo", {"text": "unharmed"})
    assert "chg_note" not in names
    assert text_of(echo) == "after garbage"
    assert text_of(other) == "unharmed"
    assert "exited" not in setup.stderr()
    assert [event["refused"] for event in _listing_events(setup)] == [{"note": REASON}]


@pytest.mark.parametrize("changing", ["stdio"], indirect=True)
async def test_a_flood_of_log_lines_while_idle_is_read_at_a_bounded_pace(
    tmp_path: Path, changing: dict[str, Any]
) -> None:
    setup = await _setup(tmp_path, changing)
    async with _host(setup) as host:
        proxy = _proxy_process()
        cpu_before = _cpu_seconds(proxy)
        rss_before = _rss_mib(proxy)
        # 60,000 log lines written as fast as the pipe takes them; no call is open, so
        # nothing relists: only the idle reader reads, at its pace, and the server blocks.
        await host.session.call_tool("chg_later", {"what": "logflood", "count": 60000})
        await anyio.sleep(3.0)
        cpu_idle = _cpu_seconds(proxy) - cpu_before
        rss_after = _rss_mib(proxy)
        other = await host.session.call_tool("up_echo", {"text": "unharmed"})
        # The next call reads past what is left of the flood to its answer.
        echo = await host.session.call_tool("chg_echo", {"text": "after the flood"})
    # Paced at 1000 lines a second: measured 0.09 s of CPU over the 3 s, and 0.4 s
    # unpaced (the reader taking the whole flood as fast as the server writes it).
    assert cpu_idle < 0.25, cpu_idle
    assert rss_after - rss_before < 40, (rss_before, rss_after)
    assert text_of(other) == "unharmed"
    assert text_of(echo) == "after the flood"
    assert _listing_events(setup) == []
