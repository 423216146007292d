"""Faults at the proxy's edges, through real `agentrt proxy` processes on a real database:
a proxy killed between its index row and its run, a database locked while a result is
recorded, identical reads in flight, and every way a host ends the session."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import sys
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from proxy_helpers import (
    RULES,
    ProxySetup,
    RawHost,
    build_setup,
    host,
    proxy_pid_from_lease,
    text_of,
    until,
)

from agentrt.proxy._index import MIGRATIONS, CallIndex
from agentrt.store import RunStatus, open_store

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

DIES_BEFORE_ITS_RUN = Path(__file__).parent / "servers" / "proxy_dies_before_its_run.py"
SHORT_BUSY_DEADLINE = Path(__file__).parent / "servers" / "proxy_with_short_busy_deadline.py"
TYPESCRIPT_CLOSE = "stdin closed, SIGTERM 2 s later, SIGKILL 2 s after that"
SLOW_RULES: dict[str, Any] = {
    **RULES,
    "write_note": {"side_effect": "local_mutation", "timeout": "30s"},
}


def _index_rows(database: Path) -> list[sqlite3.Row]:
    with sqlite3.connect(database) as connection:
        connection.row_factory = sqlite3.Row
        return connection.execute("SELECT * FROM proxy_calls ORDER BY created_at").fetchall()


def _text(response: dict[str, Any]) -> str:
    return "".join(block.get("text", "") for block in response["result"]["content"])


# -- the call index and its run are one fact ---------------------------------


async def test_a_call_whose_proxy_died_before_its_run_started_runs_on_the_next_identical_call(
    tmp_path: Path,
) -> None:
    setup = await build_setup(tmp_path)
    normal_command = setup.command
    setup.command = lambda: [  # type: ignore[method-assign]
        sys.executable, str(DIES_BEFORE_ITS_RUN), "proxy", "--config", str(setup.config_path),
    ]  # fmt: skip
    async with RawHost.start(setup) as raw:
        await raw.call("up_write_note", {"note": "orphan"})
        with anyio.fail_after(30):
            died = await raw.process.wait()
    setup.command = normal_command  # type: ignore[method-assign]
    assert died == 9
    [orphan] = _index_rows(setup.database)
    with open_store(setup.database, read_only=True) as store:
        assert store.list_runs() == []
    # The dead proxy's hold lapses; until then the row is a call being started.
    await until(lambda: time.time() > orphan["held_until"] + 0.1)
    async with host(setup) as session:
        status = text_of(await session.call_tool("gate_status", {}))
        ran = text_of(await session.call_tool("up_write_note", {"note": "orphan"}))
        again = text_of(await session.call_tool("up_write_note", {"note": "orphan"}))
    assert status == "No request of this session waits for a person's approval."
    assert ran == "noted orphan"
    assert again.startswith("DUPLICATE: ")
    assert setup.executions() == ["write_note orphan"]
    with open_store(setup.database, read_only=True) as store:
        [run] = store.list_runs()
    # The run began under the row's id: one call, one fact.
    assert run.run_id == orphan["run_id"]
    assert run.status is RunStatus.COMPLETED
    [row] = _index_rows(setup.database)
    assert (row["settled"], row["outcome"]) == (1, "result")


async def test_gate_status_never_raises_or_names_a_run_or_the_database(tmp_path: Path) -> None:
    """A row without its run (a proxy starting a call right now, or one that died) and
    a second proxy calling at the same time: status answers, naming nothing operational."""
    setup = await build_setup(tmp_path)
    async with host(setup) as session:
        await session.call_tool("up_send_mail", {"to": "a@b.c", "body": "held"})
    with sqlite3.connect(setup.database) as connection:
        connection.execute(
            "INSERT INTO proxy_calls (run_id, session, call_key, tool, mutating, created_at,"
            " holder, held_until) VALUES ('test-session.0000000000000000', 'test-session',"
            " 'k', 'up_write_note', 1, ?, 'proxy:elsewhere#t', ?)",
            (time.time(), time.time() + 3600),
        )
    answers: list[str] = []
    async with host(setup) as caller, host(setup) as watcher:

        async def call(number: int) -> None:
            await caller.call_tool("up_echo", {"text": f"load {number}"})

        async def status() -> None:
            answers.append(text_of(await watcher.call_tool("gate_status", {})))

        async with anyio.create_task_group() as group:
            for number in range(12):
                group.start_soon(call, number)
                group.start_soon(status)
    assert len(answers) == 12
    for answer in answers:
        assert answer.startswith("1 request(s) wait for a person's decision:"), answer
        assert "up_send_mail" in answer
        for operational in ("proxy.db", str(setup.database.parent), "test-session.", "no run"):
            assert operational not in answer


# -- never "nothing ran" after something ran ---------------------------------


@pytest.mark.slow
async def test_a_store_failure_after_the_call_reached_the_server_answers_unknown_outcome(
    tmp_path: Path,
) -> None:
    setup = await build_setup(tmp_path, rules=SLOW_RULES)
    # The store waits out the held database for its busy deadline, 3 s here.
    setup.command = lambda: [  # type: ignore[method-assign]
        sys.executable, str(SHORT_BUSY_DEADLINE), "proxy", "--config", str(setup.config_path),
    ]  # fmt: skip
    release = threading.Event()
    locked = threading.Event()

    def hold_the_database() -> None:
        # Another writer takes the database while the tool runs, and keeps it
        # until the proxy has failed to record the result.
        connection = sqlite3.connect(setup.database, timeout=30)
        connection.execute("BEGIN IMMEDIATE")
        locked.set()
        release.wait(120)
        connection.rollback()
        connection.close()

    async with host(setup) as session:
        async with anyio.create_task_group() as group:
            answers: list[str] = []

            async def call() -> None:
                answers.append(
                    text_of(await session.call_tool("up_write_note", {"note": "x", "seconds": 1}))
                )

            group.start_soon(call)
            await until(lambda: len(setup.started()) == 1)
            holder = threading.Thread(target=hold_the_database)
            holder.start()
            await until(locked.is_set)
            await until(lambda: "outcome could not be recorded" in setup.stderr(), 90)
            release.set()
        holder.join()
        await until(lambda: _index_rows(setup.database)[0]["unknown_outcome"] == 1, 30)
        other = text_of(await session.call_tool("up_write_note", {"note": "other"}))
        same = text_of(await session.call_tool("up_write_note", {"note": "x", "seconds": 1}))
    [answer] = answers
    assert answer.startswith("UNKNOWN_OUTCOME: "), answer
    assert "Nothing ran" not in answer
    assert other.startswith("BLOCKED: ")
    assert same.split(":")[0] in ("IN_PROGRESS", "INTERRUPTED"), same
    assert setup.executions() == ["write_note x"]


BUSY_DEADLINE = 3.0  # what SHORT_BUSY_DEADLINE sets
# A proxy's own work around one call: its answer, the host's read of it, a loaded machine.
ANSWER_SLACK = 1.5


class _WriteLock:
    """Another process's writer: a connection holding `BEGIN IMMEDIATE` on the database
    from `take()` until `free()`."""

    def __init__(self, database: Path) -> None:
        self._database = database
        self._held = threading.Event()
        self._release = threading.Event()
        self._thread = threading.Thread(target=self._hold, daemon=True)

    def _hold(self) -> None:
        connection = sqlite3.connect(self._database, timeout=30, isolation_level=None)
        connection.execute("BEGIN IMMEDIATE")
        self._held.set()
        self._release.wait(120)
        connection.execute("ROLLBACK")
        connection.close()

    async def take(self) -> None:
        self._thread.start()
        await until(self._held.is_set)

    def free(self) -> None:
        self._release.set()
        self._thread.join()


def _short_busy_deadline(setup: ProxySetup) -> None:
    setup.command = lambda: [  # type: ignore[method-assign]
        sys.executable, str(SHORT_BUSY_DEADLINE), "proxy", "--config", str(setup.config_path),
    ]  # fmt: skip


@pytest.mark.slow
async def test_a_database_locked_mid_call_delays_the_answer_by_one_busy_deadline_at_most(
    tmp_path: Path,
) -> None:
    """Issue 38: another process takes the write lock while a call runs and keeps it.  The
    call outlasts half its lease, so the renewal due a third of the way in waits on the
    lock too; the host must still be answered UNKNOWN_OUTCOME one busy deadline after the
    server answered, not after the renewal's, the result's and the release's waits in turn
    (three deadlines).  Once the lock is freed the record catches up."""
    setup = await build_setup(tmp_path, rules=SLOW_RULES)
    _short_busy_deadline(setup)
    lock = _WriteLock(setup.database)
    seen: dict[str, float] = {}
    async with host(setup) as session:
        async with anyio.create_task_group() as group:
            answers: list[str] = []

            async def call() -> None:
                arguments = {"note": "x", "seconds": 1.5}
                answers.append(text_of(await session.call_tool("up_write_note", arguments)))
                seen["answered"] = time.monotonic()

            group.start_soon(call)
            await until(lambda: len(setup.started()) == 1)
            # Taken at once: the lease's first renewal (0.67 s in, lease 2 s) meets it.
            await lock.take()
            await until(lambda: setup.executions() == ["write_note x"])
            seen["returned"] = time.monotonic()
        waited = seen["answered"] - seen["returned"]
        [answer] = answers
        assert answer.startswith("UNKNOWN_OUTCOME: "), answer
        assert "Nothing ran" not in answer
        assert waited < BUSY_DEADLINE + ANSWER_SLACK, (
            f"the host waited {waited:.1f}s after the server answered (deadline {BUSY_DEADLINE:g}s)"
        )
        lock.free()
        # The unknown outcome is marked in the background once the database is free.
        await until(lambda: _index_rows(setup.database)[0]["unknown_outcome"] == 1, 30)
        other = text_of(await session.call_tool("up_write_note", {"note": "other"}))
        same = text_of(await session.call_tool("up_write_note", {"note": "x", "seconds": 1.5}))
    # Its own process let the call go: asked again, a person decides (INTERRUPTED), at once.
    assert same.startswith("INTERRUPTED: "), same
    assert other.startswith("BLOCKED: "), other
    assert setup.executions() == ["write_note x"]
    with open_store(setup.database, read_only=True) as store:
        assert store.verify_chain().ok and store.verify_state().ok
        [run] = [run for run in store.list_runs() if run.status is not RunStatus.COMPLETED]
        assert run.status is RunStatus.WAITING_FOR_APPROVAL
        approval = store.waiting_approval(run.run_id)
        assert approval is not None and approval.kind == "interrupted_side_effect"


@pytest.mark.slow
async def test_a_call_refused_for_a_locked_database_is_answered_after_one_busy_deadline(
    tmp_path: Path,
) -> None:
    """Another process holds the write lock before the call: its first write gives up
    after the busy deadline and nothing ran.  The answer must not wait a second deadline
    to release a hold that was never written."""
    setup = await build_setup(tmp_path, rules=SLOW_RULES)
    _short_busy_deadline(setup)
    lock = _WriteLock(setup.database)
    async with host(setup) as session:
        await session.call_tool("up_echo", {"text": "the proxy is up"})
        await lock.take()
        began = time.monotonic()
        answer = text_of(await session.call_tool("up_write_note", {"note": "y"}))
        waited = time.monotonic() - began
        lock.free()
        again = text_of(await session.call_tool("up_write_note", {"note": "y"}))
    assert answer.startswith("UNAVAILABLE: ") and answer.endswith("Nothing ran."), answer
    assert waited < BUSY_DEADLINE + ANSWER_SLACK, f"the host waited {waited:.1f}s"
    assert again == "noted y"
    assert setup.executions() == ["write_note y"]
    with open_store(setup.database, read_only=True) as store:
        assert store.verify_chain().ok and store.verify_state().ok


@pytest.mark.slow
async def test_a_proxy_that_lost_its_lease_mid_call_answers_unknown_outcome(
    tmp_path: Path,
) -> None:
    """A proxy frozen past its lease while its call runs; a second proxy takes the call
    over. When the first wakes, the server has answered it, but the run is no longer its
    own to record: it must say the outcome is unknown, never that nothing ran."""
    setup = await build_setup(tmp_path, rules=SLOW_RULES)
    async with RawHost.start(setup) as frozen:
        request_id = await frozen.call("up_write_note", {"note": "lease", "seconds": 3})
        await until(lambda: len(setup.started()) == 1)
        pid = proxy_pid_from_lease(setup.database)
        os.kill(pid, signal.SIGSTOP)
        try:
            with open_store(setup.database, read_only=True) as store:
                [run] = store.list_runs()
            lapsed = max(run.lease_expires_at or 0, _index_rows(setup.database)[0]["held_until"])
            await until(lambda: time.time() > lapsed + 0.2)
            async with host(setup) as second:
                taken = text_of(
                    await second.call_tool("up_write_note", {"note": "lease", "seconds": 3})
                )
        finally:
            os.kill(pid, signal.SIGCONT)
        with anyio.fail_after(30):
            answer = _text(await frozen.response(request_id))
    assert taken.startswith("INTERRUPTED: "), taken
    assert answer.startswith("UNKNOWN_OUTCOME: "), answer
    assert "Nothing ran" not in answer
    assert setup.executions() == ["write_note lease"]


# -- reads have no repeat rule -----------------------------------------------


async def test_two_identical_reads_in_flight_both_run_and_are_recorded(setup: ProxySetup) -> None:
    answers: list[str] = []
    async with host(setup) as first, host(setup) as second:

        async def read(session: Any) -> None:
            answers.append(
                text_of(await session.call_tool("up_echo", {"text": "twice", "seconds": 1.5}))
            )

        async with anyio.create_task_group() as group:
            group.start_soon(read, first)
            await until(lambda: len(setup.started()) == 1)
            group.start_soon(read, second)
    assert answers == ["twice", "twice"]
    assert setup.executions() == ["echo twice", "echo twice"]
    rows = _index_rows(setup.database)
    assert len(rows) == 2 and rows[0]["call_key"] == rows[1]["call_key"]
    assert [(row["settled"], row["outcome"]) for row in rows] == [(1, "result"), (1, "result")]
    with open_store(setup.database, read_only=True) as store:
        assert [run.status for run in store.list_runs()] == [RunStatus.COMPLETED] * 2


# -- the lookup reads through an index ---------------------------------------


def test_the_index_lookup_reads_only_unsettled_and_deciding_rows_through_partial_indexes(
    tmp_path: Path,
) -> None:
    from agentrt.proxy._index import _DECIDING_OF_KEY, _UNSETTLED_OF_KEY

    database = tmp_path / "old.db"
    with open_store(database) as store:
        # A database the first proxy build made: its migration alone.
        store.migrate_extension("proxy", MIGRATIONS[:1])
    with open_store(database) as store:
        CallIndex(store, "s", "proxy:test", 30.0)
        assert store.extension_version("proxy") == len(MIGRATIONS)
    with sqlite3.connect(database) as connection:
        unsettled = connection.execute(
            "EXPLAIN QUERY PLAN " + _UNSETTLED_OF_KEY, ("s", "k")
        ).fetchall()
        deciding = connection.execute(
            "EXPLAIN QUERY PLAN " + _DECIDING_OF_KEY, ("s", "k", 0.0)
        ).fetchall()
    assert "proxy_calls_unsettled" in str(unsettled)
    assert "proxy_calls_deciding" in str(deciding)


def _call_indexes(database: Path) -> set[str]:
    with sqlite3.connect(database) as connection:
        rows = connection.execute(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'proxy_calls'"
        ).fetchall()
    return {row[0] for row in rows}


def test_the_full_call_indexes_are_dropped_and_every_lookup_still_reads_through_an_index(
    tmp_path: Path,
) -> None:
    # The third migration drops the two full indexes the partial ones replaced;
    # every query of the index then still searches an index, none scans the table.
    database = tmp_path / "old.db"
    with open_store(database) as store:
        store.migrate_extension("proxy", MIGRATIONS[:2])
    assert {"proxy_calls_by_key", "proxy_calls_open"} <= _call_indexes(database)
    with open_store(database) as store:
        CallIndex(store, "s", "proxy:test", 30.0)
    # Every statement the index module writes over proxy_calls, its string pieces joined.
    source = (Path(__file__).parents[2] / "src/agentrt/proxy/_index.py").read_text()
    pieces = re.findall(r'("(?:SELECT|UPDATE) [^"]*proxy_calls[^"]*"(?:\s*"[^"]*")*)', source)
    queries = ["".join(re.findall(r'"([^"]*)"', piece)) for piece in pieces]
    assert len(queries) >= 12
    assert _call_indexes(database) == {
        "sqlite_autoindex_proxy_calls_1", "proxy_calls_unsettled", "proxy_calls_deciding"
    }  # fmt: skip
    with sqlite3.connect(database) as connection:
        for sql in queries:
            plan = str(connection.execute(
                "EXPLAIN QUERY PLAN " + sql, [None] * sql.count("?")
            ).fetchall())  # fmt: skip
            assert "USING INDEX" in plan and "SCAN proxy_calls" not in plan, (sql, plan)


# -- shutdown answers what it finished ---------------------------------------


async def _end(raw: RawHost, how: str) -> None:
    process = raw.process
    if how == TYPESCRIPT_CLOSE:
        # The official TypeScript SDK client's close().
        await process.stdin.aclose()
        with anyio.move_on_after(2):
            await process.wait()
            return
        process.send_signal(signal.SIGTERM)
        with anyio.move_on_after(2):
            await process.wait()
            return
        process.kill()
    elif how == "stdin closed":
        await process.stdin.aclose()
    else:
        process.send_signal(signal.SIGTERM if how == "SIGTERM" else signal.SIGINT)


@pytest.mark.slow
@pytest.mark.parametrize("how", [TYPESCRIPT_CLOSE, "stdin closed", "SIGTERM", "SIGINT"])
async def test_shutdown_answers_the_call_in_flight_records_it_and_exits_0(
    tmp_path: Path, how: str
) -> None:
    setup = await build_setup(tmp_path, rules=SLOW_RULES)
    async with RawHost.start(setup) as raw:
        # Still running when the SIGTERM comes 2 s after stdin closed, done well
        # before the SIGKILL 2 s after that.
        request_id = await raw.call("up_write_note", {"note": "last", "seconds": 2.2})
        await until(lambda: len(setup.started()) == 1)
        async with anyio.create_task_group() as group:
            group.start_soon(_end, raw, how)
            with anyio.fail_after(30):
                answer = await raw.response(request_id)
        with anyio.fail_after(30):
            code = await raw.process.wait()
    assert _text(answer) == "noted last"
    assert code == 0, setup.stderr()
    assert setup.executions() == ["write_note last"]
    with open_store(setup.database, read_only=True) as store:
        assert [run.status for run in store.list_runs()] == [RunStatus.COMPLETED]
    [row] = _index_rows(setup.database)
    assert (row["settled"], row["outcome"]) == (1, "result")


@pytest.mark.slow
async def test_sigterm_over_http_answers_the_call_in_flight_and_exits_0(tmp_path: Path) -> None:
    import json

    import httpx2
    from proxy_helpers import free_port
    from test_proxy_hosts import _listening

    setup = await build_setup(tmp_path, rules=SLOW_RULES)
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    initialize = {
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "http-host", "version": "0"}},
    }  # fmt: skip
    call = {
        "jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "up_write_note", "arguments": {"note": "h", "seconds": 2}},
    }  # fmt: skip
    bodies: list[str] = []
    with setup.stderr_path.open("a") as errlog:
        process = await anyio.open_process(
            [*setup.command(), "--http", f"127.0.0.1:{port}"],
            stderr=errlog, env=setup.environment(), cwd=str(setup.root),
        )  # fmt: skip
        await until(lambda: _listening(port), 30)
        async with httpx2.AsyncClient(headers=headers, timeout=30) as client:
            opened = await client.post(url, content=json.dumps(initialize))
            session = {"mcp-session-id": opened.headers["mcp-session-id"]}
            await client.post(
                url, headers=session,
                content=json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}),
            )  # fmt: skip

            async def post_call() -> None:
                response = await client.post(url, headers=session, content=json.dumps(call))
                bodies.append(response.text)

            async with anyio.create_task_group() as group:
                group.start_soon(post_call)
                await until(lambda: len(setup.started()) == 1)
                process.terminate()
        with anyio.fail_after(30):
            code = await process.wait()
    [body] = bodies
    assert '"id":2' in body and "noted h" in body, body
    assert code == 0, setup.stderr()
    assert setup.executions() == ["write_note h"]


async def test_a_database_with_proxy_tables_from_a_newer_build_stops_the_proxy_with_exit_2(
    tmp_path: Path,
) -> None:
    import subprocess

    setup = await build_setup(tmp_path)
    with open_store(setup.database) as store:
        store.migrate_extension("proxy", MIGRATIONS)
    with sqlite3.connect(setup.database) as connection:
        connection.execute("UPDATE extensions SET version = 99 WHERE name = 'proxy'")
    finished = subprocess.run(
        setup.command(), capture_output=True, text=True, timeout=60,
        stdin=subprocess.DEVNULL, env=setup.environment(), cwd=setup.root,
    )  # fmt: skip
    assert finished.returncode == 2, finished.stderr
    assert "proxy tables from a newer build" in finished.stderr
    assert "Traceback" not in finished.stderr
    assert finished.stdout == ""
