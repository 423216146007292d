"""Notifications from a real `agentrt proxy` driven by a real host: a proxy killed between
the event and its delivery delivers it after its restart, and a slow receiver never delays
a call."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from approver_support import secret_file
from inbox_support import notes_setup
from notify_receiver import Receiver
from proxy_helpers import ProxySetup, RawHost, host, text_of

from agentrt.store import open_store
from agentrt.store._outbox import outbox_rows

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

RECEIVER_SECRET = b"k" * 40


async def _notifying_setup(tmp_path: Path, receiver: Receiver) -> ProxySetup:
    setup, _notes = await notes_setup(tmp_path)
    document = dict(setup.document)
    del document["inbox"]
    document["notify"] = [
        {"url": receiver.url, "secret_file": str(secret_file(tmp_path, RECEIVER_SECRET))}
    ]
    setup.document.clear()
    setup.rewrite(**document)
    return setup


def _rows(setup: ProxySetup) -> list[Any]:
    with open_store(setup.database, read_only=True, create=False) as store:
        return outbox_rows(store)


async def _until(condition: Any, seconds: float = 60.0) -> None:
    with anyio.fail_after(seconds):
        while not condition():
            await anyio.sleep(0.1)


@pytest.mark.slow
async def test_a_proxy_killed_between_the_event_and_its_delivery_delivers_it_after_restart(
    tmp_path: Path,
) -> None:
    receiver = Receiver(RECEIVER_SECRET)
    setup = await _notifying_setup(tmp_path, receiver)
    async with RawHost.start(setup) as raw:
        answer = await raw.response(
            await raw.call("notes_write_note", {"path": "a.md", "content": "a\n"})
        )
        assert "PENDING_APPROVAL" in str(answer["result"])
        # The row was committed with the event; the receiver is down, so it waits.
        await _until(lambda: any(row.attempts >= 1 for row in _rows(setup)))
        raw.process.kill()  # SIGKILL: nothing of the proxy's shutdown runs
        await raw.process.wait()
    (row,) = _rows(setup)
    assert row.state == "pending" and receiver.received == []
    async with receiver.serving(), host(setup) as session:
        await _until(lambda: str(row.event_seq) in receiver.delivered_keys())
        await session.list_tools()
    assert receiver.delivered_keys() == {str(row.event_seq)}
    bodies = receiver.by_key()[str(row.event_seq)]
    assert all(body == bodies[0] for body in bodies)
    assert bodies[0]["event"] == "approval_requested" and bodies[0]["seq"] == row.event_seq
    assert [row.state for row in _rows(setup)] == ["delivered"]


@pytest.mark.slow
async def test_a_slow_receiver_never_delays_a_call(tmp_path: Path) -> None:
    # The receiver answers nothing until released, after the calls: a call that waited on
    # a delivery would never be answered (and fail on its deadline).
    receiver = Receiver(RECEIVER_SECRET, held=True)
    setup = await _notifying_setup(tmp_path, receiver)
    async with receiver.serving(), host(setup) as session:
        timings = []
        for index in range(3):
            started = time.monotonic()
            with anyio.fail_after(30):
                held = await session.call_tool(
                    "notes_write_note", {"path": f"{index}.md", "content": "x\n"}
                )
            timings.append(time.monotonic() - started)
            assert text_of(held).startswith("PENDING_APPROVAL: ")
            if index == 0:
                # The later calls are made while the first call's delivery hangs.
                await _until(lambda: receiver.holding >= 1)
        assert receiver.delivered_keys() == set()
        receiver.release()
        await _until(lambda: len(receiver.delivered_keys()) == 3, 60)
    # The hold is 300 ms; the calls took no longer than calls without notifications do.
    assert max(timings) < 4.0, timings
