"""Crashes, cancellations, shutdown, restarts and two proxies on one database."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream
from proxy_helpers import (
    RULES,
    RawHost,
    build_setup,
    host,
    proxy_pid_from_lease,
    text_of,
    until,
)

from agentrt.store import RunStatus, open_store

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]

SLOW_RULES: dict[str, Any] = {
    **RULES,
    "write_note": {"side_effect": "local_mutation", "timeout": "30s"},
}


def run_statuses(database: Path) -> list[RunStatus]:
    with open_store(database, read_only=True) as store:
        return [run.status for run in store.list_runs(limit=100)]


def result_text(response: dict[str, Any]) -> str:
    return "".join(block.get("text", "") for block in response["result"]["content"])


async def test_a_crash_mid_call_answers_interrupted_and_runs_again_only_when_approved(
    tmp_path: Path, on_backend: dict[str, Any]
) -> None:
    setup = await build_setup(tmp_path, rules=SLOW_RULES, **on_backend)
    arguments = {"note": "migrate", "seconds": 3}
    async with RawHost.start(setup) as raw:
        await raw.call("up_write_note", arguments)
        await until(lambda: len(setup.started()) == 1)
        os.kill(proxy_pid_from_lease(setup.database), signal.SIGKILL)
        await raw.process.wait()
    # The hold and the lease (2s) lapse with the dead process.
    await anyio.sleep(2.5)
    async with host(setup) as session:
        first = await session.call_tool("up_write_note", arguments)
        assert text_of(first).startswith("INTERRUPTED: ")
        assert first.is_error is False
        assert "may have taken effect" in text_of(first)
        again = await session.call_tool("up_write_note", arguments)
        assert text_of(again).startswith("INTERRUPTED: ")
        assert len(setup.started()) == 1
        assert setup.executions() == []
        assert len(setup.waiting_commands()) == 1
        setup.approve_latest()
        approved = await session.call_tool("up_write_note", arguments)
    assert text_of(approved) == "noted migrate"
    assert setup.executions() == ["write_note migrate"]


async def test_a_restarted_proxy_collects_an_approval_granted_while_it_was_gone(
    tmp_path: Path, on_backend: dict[str, Any]
) -> None:
    setup = await build_setup(tmp_path, **on_backend)
    arguments = {"to": "later@example.org", "body": "x"}
    async with host(setup) as session:
        first = await session.call_tool("up_send_mail", arguments)
    assert text_of(first).startswith("PENDING_APPROVAL: ")
    setup.approve_latest()
    announced = setup.stderr().count(" waits for ")
    async with host(setup) as session:
        second = await session.call_tool("up_send_mail", arguments)
    assert text_of(second) == "sent to later@example.org"
    assert setup.executions() == ["send_mail later@example.org"]
    # The restarted proxy collected an approved request: it does not announce it as waiting.
    assert setup.stderr().count(" waits for ") == announced == 1


async def test_a_host_cancelling_a_call_lets_the_upstream_call_finish_and_be_recorded(
    tmp_path: Path,
) -> None:
    setup = await build_setup(tmp_path, rules=SLOW_RULES)
    arguments = {"note": "cancelled", "seconds": 1.5}
    async with host(setup) as session:
        with anyio.move_on_after(0.5) as scope:
            await session.call_tool("up_write_note", arguments)
        assert scope.cancelled_caught
        await until(lambda: setup.executions() == ["write_note cancelled"])
        await until(lambda: RunStatus.COMPLETED in run_statuses(setup.database))
        retry = await session.call_tool("up_write_note", arguments)
    assert text_of(retry).startswith("DUPLICATE: ")
    assert setup.executions() == ["write_note cancelled"]


@pytest.mark.parametrize("how", ["stdin_close", "SIGTERM", "SIGINT"])
async def test_shutdown_lets_a_call_in_flight_finish_and_be_recorded(
    tmp_path: Path, how: str
) -> None:
    setup = await build_setup(tmp_path, rules=SLOW_RULES)
    async with RawHost.start(setup) as raw:
        await raw.call("up_write_note", {"note": "inflight", "seconds": 1.5})
        await until(lambda: len(setup.started()) == 1)
        if how == "stdin_close":
            await raw.process.stdin.aclose()
        else:
            raw.process.send_signal(getattr(signal, how))
        with anyio.fail_after(20):
            code = await raw.process.wait()
    assert code == 0
    assert setup.executions() == ["write_note inflight"]
    assert run_statuses(setup.database) == [RunStatus.COMPLETED]
    with open_store(setup.database, read_only=True) as store:
        assert store.verify_chain().ok


async def test_a_call_after_shutdown_began_is_not_taken(tmp_path: Path) -> None:
    setup = await build_setup(tmp_path, rules=SLOW_RULES)
    async with RawHost.start(setup) as raw:
        await raw.call("up_write_note", {"note": "first", "seconds": 1.5})
        await until(lambda: len(setup.started()) == 1)
        raw.process.send_signal(signal.SIGTERM)
        await anyio.sleep(0.3)
        # The proxy stopped reading its input: this request is never taken.
        with pytest.raises((anyio.BrokenResourceError, anyio.ClosedResourceError, OSError)):
            for _ in range(50):
                await raw.call("up_write_note", {"note": "second"})
                await anyio.sleep(0.05)
        code = await raw.process.wait()
    assert code == 0
    assert setup.executions() == ["write_note first"]
    assert run_statuses(setup.database) == [RunStatus.COMPLETED]


async def test_two_proxies_on_one_database_run_an_identical_call_once(
    tmp_path: Path, on_backend: dict[str, Any]
) -> None:
    setup = await build_setup(tmp_path, rules=SLOW_RULES, **on_backend)
    arguments = {"note": "once", "seconds": 1.5}
    answers: list[str] = []
    async with host(setup) as first, host(setup) as second:

        async def call(session: Any) -> None:
            answers.append(text_of(await session.call_tool("up_write_note", arguments)))

        async with anyio.create_task_group() as group:
            group.start_soon(call, first)
            group.start_soon(call, second)
        retry = text_of(await second.call_tool("up_write_note", arguments))
    assert sorted(answer.split(":")[0] for answer in answers) == ["IN_PROGRESS", "noted once"]
    assert retry.startswith("DUPLICATE: ")
    assert setup.executions() == ["write_note once"]


async def test_garbage_from_the_host_costs_only_that_line(tmp_path: Path) -> None:
    setup = await build_setup(tmp_path)
    async with RawHost.start(setup) as raw:
        await raw.process.stdin.send(b"{not json\n\xff\xfe\n" + b"[" * 100_000 + b"\n")
        response = await raw.request(
            "tools/call", {"name": "up_echo", "arguments": {"text": "after garbage"}}
        )
        bidi = await raw.request("tools/call", {"name": "up_\u202eecho", "arguments": {}})
    assert result_text(response) == "after garbage"
    assert result_text(bidi).startswith("INVALID: ")
    assert "\u202e" not in result_text(bidi)
    assert setup.executions() == []


async def test_calls_from_one_host_are_handled_concurrently(tmp_path: Path) -> None:
    setup = await build_setup(tmp_path, rules=SLOW_RULES)
    finished: list[str] = []
    async with host(setup) as session:

        async def slow() -> None:
            await session.call_tool("up_write_note", {"note": "slow", "seconds": 2})
            finished.append("slow")

        async def quick() -> None:
            await until(lambda: len(setup.started()) == 1)
            await session.call_tool("up_echo", {"text": "quick"})
            finished.append("quick")

        async with anyio.create_task_group() as group:
            group.start_soon(slow)
            group.start_soon(quick)
    assert finished == ["quick", "slow"]


# Claude Code closes an MCP server with SIGINT, SIGTERM 0.11 s later, SIGKILL 0.4 s after that.
HOST_SECOND_SIGNAL = 0.11
HOST_SIGKILL = 0.4


def _signal(process: Any, number: int) -> None:
    """Send `number` to `process` as a host does, with kill(2) alone: `Process.send_signal`
    first polls (waitpid) the child, which can reap an exiting proxy under asyncio's child
    watcher, which then reports exit status 255 for it ("Unknown child process")."""
    os.kill(process.pid, number)


async def _close_as_a_host_does(process: Any, first: int, second: int) -> float:
    """Signal `process` on a host's schedule; the seconds from the first signal to its exit
    (a SIGKILL at the end of the grace, as the host sends it, shows as -9)."""
    started = anyio.current_time()
    _signal(process, first)
    with anyio.move_on_after(HOST_SECOND_SIGNAL):
        await process.wait()
    if process.returncode is None:
        _signal(process, second)
        with anyio.move_on_after(HOST_SIGKILL):
            await process.wait()
    if process.returncode is None:
        process.kill()
        await process.wait()
    return anyio.current_time() - started


@pytest.mark.parametrize(
    ("first", "second"),
    [("SIGINT", "SIGTERM"), ("SIGINT", "SIGINT"), ("SIGTERM", "SIGTERM"), ("SIGTERM", "SIGINT")],
)
async def test_a_second_signal_records_the_call_in_flight_as_an_unknown_outcome_and_exits_0(
    tmp_path: Path, first: str, second: str
) -> None:
    setup = await build_setup(tmp_path, rules=SLOW_RULES)
    async with RawHost.start(setup) as raw:
        request_id = await raw.call("up_write_note", {"note": "slow", "seconds": 20})
        await until(lambda: len(setup.started()) == 1)
        async with anyio.create_task_group() as group:
            answers: list[dict[str, Any]] = []

            async def read_answer() -> None:
                answers.append(await raw.response(request_id))

            group.start_soon(read_answer)
            took = await _close_as_a_host_does(
                raw.process, getattr(signal, first), getattr(signal, second)
            )
            with anyio.fail_after(5):
                await until(lambda: bool(answers))
    assert raw.process.returncode == 0, setup.stderr()
    assert took < HOST_SECOND_SIGNAL + HOST_SIGKILL
    # The host was answered, and the record says what the answer says: sent, outcome unknown.
    assert result_text(answers[0]).startswith("UNKNOWN_OUTCOME: ")
    assert setup.executions() == []
    with open_store(setup.database, read_only=True) as store:
        [run] = store.list_runs(limit=100)
        assert run.status is RunStatus.WAITING_FOR_APPROVAL
        approval = store.latest_approval(run.run_id)
        assert approval is not None and approval.kind == "unknown_outcome"
        assert store.verify_chain().ok


@pytest.mark.parametrize("first", ["SIGINT", "SIGTERM"])
async def test_signals_stay_caught_until_the_proxy_has_exited(tmp_path: Path, first: str) -> None:
    setup = await build_setup(tmp_path, rules=SLOW_RULES)
    async with RawHost.start(setup) as raw:
        others = [signal.SIGINT, signal.SIGTERM]
        _signal(raw.process, getattr(signal, first))
        # A signal every 10 ms, alternating, until the process is gone: none may kill it.
        with anyio.fail_after(10):
            for count in range(10_000):
                with anyio.move_on_after(0.01):
                    await raw.process.wait()
                if raw.process.returncode is not None:
                    break
                with contextlib.suppress(ProcessLookupError):
                    _signal(raw.process, others[count % 2])
    assert raw.process.returncode == 0, setup.stderr()


# Another writer on the database: a transaction holding the write lock for 0.3 s
# every 0.45 s, until the file argv[2] appears.
_BUSY_WRITER = """
import os, sys, time
from agentrt.store import open_store
with open_store(sys.argv[1]) as store:
    print("writing", flush=True)
    while not os.path.exists(sys.argv[2]):
        with store.transaction() as connection:
            store.append_event(connection, "busy-writer", "held", {})
            time.sleep(0.3)
        time.sleep(0.15)
"""


@pytest.mark.timeout(150)
async def test_proxies_starting_together_on_one_database_while_another_writes_all_start(
    tmp_path: Path,
) -> None:
    database = tmp_path / "shared" / "proxy.db"
    database.parent.mkdir(mode=0o700)
    setups = [
        await build_setup(tmp_path / f"proxy-{number}", database=str(database))
        for number in range(4)
    ]
    stop = tmp_path / "stop-writing"
    answers: dict[int, str] = {}
    async with await anyio.open_process(
        [sys.executable, "-c", _BUSY_WRITER, str(database), str(stop)]
    ) as writer:
        assert writer.stdout is not None
        assert await BufferedByteReceiveStream(writer.stdout).receive_until(b"\n", 64) == (
            b"writing"
        )

        async def start_and_call(number: int) -> None:
            try:
                async with RawHost.start(setups[number]) as raw:
                    request = await raw.call("up_write_note", {"note": f"from {number}"})
                    answers[number] = result_text(await raw.response(request))
                    await raw.process.stdin.aclose()
                    with anyio.fail_after(30):
                        answers[number] += f" / exit {await raw.process.wait()}"
            except (anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError):
                answers[number] = "exited at start: " + setups[number].stderr()[-300:]

        try:
            with anyio.fail_after(120):
                async with anyio.create_task_group() as group:
                    for number in range(len(setups)):
                        group.start_soon(start_and_call, number)
        finally:
            stop.touch()
            with anyio.fail_after(10):
                await writer.wait()
    assert answers == {number: f"noted from {number} / exit 0" for number in range(4)}
    with open_store(database, read_only=True) as store:
        assert store.verify_chain().ok and store.check_anchor().ok
