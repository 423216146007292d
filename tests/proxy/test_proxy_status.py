"""`gate_status`: answers from the database, never executes, decides or writes."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from proxy_helpers import ProxySetup, host, text_of

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


def snapshot(database: Path) -> tuple[int, int, int, list[tuple[object, ...]]]:
    connection = sqlite3.connect(f"file:{database}?mode=ro", uri=True)
    try:
        events = connection.execute("SELECT COUNT(*) FROM events").fetchone()[0]
        runs = connection.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
        approvals = connection.execute("SELECT COUNT(*) FROM approvals").fetchone()[0]
        calls = connection.execute("SELECT * FROM proxy_calls ORDER BY run_id").fetchall()
    finally:
        connection.close()
    return events, runs, approvals, calls


async def test_gate_status_reports_waiting_approvals_without_running_or_writing(
    setup: ProxySetup,
) -> None:
    async with host(setup) as session:
        empty = await session.call_tool("gate_status", {})
        assert text_of(empty).startswith("No request")
        await session.call_tool("up_send_mail", {"to": "a@b.c", "body": "x"})
        _, approval_id = setup.waiting_commands()[-1]
        before = snapshot(setup.database)
        listing = await session.call_tool("gate_status", {})
        one = await session.call_tool("gate_status", {"approval_id": approval_id})
        after = snapshot(setup.database)
    assert approval_id in text_of(listing) and "up_send_mail" in text_of(listing)
    assert "is waiting for a person's decision" in text_of(one)
    assert listing.is_error is False and one.is_error is False
    assert before == after
    assert setup.executions() == []


async def test_gate_status_tells_a_rejection_and_its_note(setup: ProxySetup) -> None:
    async with host(setup) as session:
        await session.call_tool("up_send_mail", {"to": "a@b.c", "body": "x"})
        _, approval_id = setup.waiting_commands()[-1]
        setup.reject_latest("wrong recipient")
        answer = await session.call_tool("gate_status", {"approval_id": approval_id})
    assert "was rejected" in text_of(answer)
    assert "wrong recipient" in text_of(answer)


async def test_gate_status_knows_nothing_of_another_sessions_approvals(
    setup: ProxySetup, tmp_path: Path
) -> None:
    async with host(setup) as session:
        await session.call_tool("up_send_mail", {"to": "a@b.c", "body": "x"})
    _, approval_id = setup.waiting_commands()[-1]
    setup.rewrite(session="other-session")
    async with host(setup) as session:
        foreign = await session.call_tool("gate_status", {"approval_id": approval_id})
        listing = await session.call_tool("gate_status", {})
        made_up = await session.call_tool("gate_status", {"approval_id": "\u202enope"})
    assert text_of(foreign).startswith("There is no approval")
    assert text_of(listing).startswith("No request")
    assert "\u202e" not in text_of(made_up)


async def test_gate_status_with_a_wrong_argument_is_invalid(setup: ProxySetup) -> None:
    async with host(setup) as session:
        answer = await session.call_tool("gate_status", {"run_id": "x"})
    assert text_of(answer).startswith("INVALID: ")
    assert answer.is_error is True
