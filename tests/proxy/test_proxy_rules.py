"""The rules a host's retries meet: unknown outcomes, blocked tools, the pending limit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from proxy_helpers import build_setup, host, text_of

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


async def test_a_timed_out_write_has_an_unknown_outcome_and_blocks_other_writes_to_the_tool(
    tmp_path: Path,
    on_backend: dict[str, Any],
) -> None:
    setup = await build_setup(tmp_path, **on_backend)
    slow = {"note": "slow", "seconds": 4}
    async with host(setup) as session:
        first = await session.call_tool("up_write_note", slow)
        assert text_of(first).startswith("UNKNOWN_OUTCOME: ")
        assert first.is_error is False
        other = await session.call_tool("up_write_note", {"note": "other"})
        assert text_of(other).startswith("BLOCKED: ")
        assert other.is_error is True
        # A read-only tool is not held hostage.
        echo = await session.call_tool("up_echo", {"text": "still here"})
        assert text_of(echo) == "still here"
        same = await session.call_tool("up_write_note", slow)
        assert text_of(same).startswith("UNKNOWN_OUTCOME: ")
        assert [line.split()[1] for line in setup.started()] == ["slow"]
        setup.reject_latest("it went through; do not repeat")
        rejected = await session.call_tool("up_write_note", slow)
        assert text_of(rejected).startswith("REJECTED: ")
        unblocked = await session.call_tool("up_write_note", {"note": "other"})
    assert text_of(unblocked) == "noted other"
    assert [line.split()[1] for line in setup.started()] == ["slow", "other"]
    with_kind = setup.approval(setup.waiting_commands()[0][1])
    assert with_kind.kind == "unknown_outcome"


async def test_no_more_than_max_pending_approvals_wait_at_once(
    tmp_path: Path, on_backend: dict[str, Any]
) -> None:
    setup = await build_setup(tmp_path, **on_backend, max_pending=1, hold="100ms")
    async with host(setup) as session:
        first = await session.call_tool("up_send_mail", {"to": "a@x.y", "body": "1"})
        second = await session.call_tool("up_send_mail", {"to": "b@x.y", "body": "2"})
        allowed = await session.call_tool("up_write_note", {"note": "local"})
        same = await session.call_tool("up_send_mail", {"to": "a@x.y", "body": "1"})
    assert text_of(first).startswith("PENDING_APPROVAL: ")
    assert text_of(second).startswith("UNAVAILABLE: ")
    assert second.is_error is True
    assert text_of(allowed) == "noted local"
    # The waiting request itself is still collected, not refused.
    assert text_of(same).startswith("PENDING_APPROVAL: ")
    assert len(setup.waiting_commands()) == 1


async def test_a_duplicate_is_only_a_duplicate_within_the_repeat_window(
    tmp_path: Path, on_backend: dict[str, Any]
) -> None:
    import anyio

    setup = await build_setup(tmp_path, **on_backend, repeat_window="2s")
    async with host(setup) as session:
        first = await session.call_tool("up_write_note", {"note": "w"})
        second = await session.call_tool("up_write_note", {"note": "w"})
        await anyio.sleep(2.3)
        third = await session.call_tool("up_write_note", {"note": "w"})
    assert text_of(first) == "noted w"
    assert text_of(second).startswith("DUPLICATE: ")
    assert text_of(third) == "noted w"
    assert setup.executions() == ["write_note w", "write_note w"]


async def test_read_only_calls_are_never_duplicates(
    tmp_path: Path, on_backend: dict[str, Any]
) -> None:
    setup = await build_setup(tmp_path, **on_backend)
    async with host(setup) as session:
        answers = [await session.call_tool("up_echo", {"text": "again"}) for _ in range(3)]
    assert [text_of(answer) for answer in answers] == ["again"] * 3


async def test_the_same_arguments_in_another_key_order_are_the_same_call(
    tmp_path: Path, on_backend: dict[str, Any]
) -> None:
    setup = await build_setup(tmp_path, **on_backend)
    async with host(setup) as session:
        first = await session.call_tool("up_send_mail", {"to": "o@x.y", "body": "b"})
        second = await session.call_tool("up_send_mail", {"body": "b", "to": "o@x.y"})
    assert text_of(first).startswith("PENDING_APPROVAL: ")
    assert text_of(second).startswith("PENDING_APPROVAL: ")
    assert len(setup.waiting_commands()) == 1


async def test_a_server_dying_mid_call_leaves_an_unknown_outcome_and_the_proxy_serving(
    tmp_path: Path,
    on_backend: dict[str, Any],
) -> None:
    setup = await build_setup(tmp_path, **on_backend)
    async with host(setup) as session:
        crashed = await session.call_tool("up_crash", {"target": "prod"})
        assert text_of(crashed).startswith("UNKNOWN_OUTCOME: ")
        blocked = await session.call_tool("up_crash", {"target": "staging"})
        assert text_of(blocked).startswith("BLOCKED: ")
        # The next call starts the server again; the unknown outcome stays blocked.
        back = await session.call_tool("up_echo", {"text": "anyone?"})
        assert text_of(back) == "anyone?"
        status = await session.call_tool("gate_status", {})
    assert "up_crash" in text_of(status)
    assert len([line for line in setup.started() if "crash" in line]) == 1


async def test_an_unknown_outcome_approved_runs_the_call_again_exactly_once(
    tmp_path: Path,
    on_backend: dict[str, Any],
) -> None:
    setup = await build_setup(tmp_path, **on_backend)
    arguments = {"note": "retry", "first_seconds": 3}
    async with host(setup) as session:
        first = await session.call_tool("up_write_note", arguments)
        assert text_of(first).startswith("UNKNOWN_OUTCOME: ")
        approval = setup.approval(setup.waiting_commands()[-1][1])
        assert "may have taken effect" in approval.presentation["warning"]
        setup.approve_latest()
        again = await session.call_tool("up_write_note", arguments)
        after = await session.call_tool("up_write_note", arguments)
    assert text_of(again) == "noted retry"
    assert text_of(after).startswith("DUPLICATE: ")
    assert len([line for line in setup.started() if " retry " in line]) == 2
