"""The write lock: how long a write holds it, and what a writer that dies or loses its
connection while holding it leaves behind (decision 0044).

On PostgreSQL a write's statements go out in pipeline mode: the chain's appends and a
unit's savepoints are not waited for one by one, so the lock every writer queues for
is held for a few round trips a write, not one per statement.  Measured here through
a socket that delays every answer of the server: the round trips are what it costs.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from agentrt import open_store
from agentrt.errors import StoreError
from agentrt.store import Store

_DELAY_S = 0.03


class _SlowSocket:
    """A Unix socket in front of the test's PostgreSQL server that holds every chunk the
    server sends for `_DELAY_S`, as a server a few milliseconds away would: each round
    trip a client waits for costs it that much."""

    def __init__(self, server_directory: str) -> None:
        self._target = str(Path(server_directory) / ".s.PGSQL.5432")
        self.directory = tempfile.mkdtemp(prefix="agentrt-slow-")
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(Path(self.directory) / ".s.PGSQL.5432"))
        self._listener.listen(16)
        self.answers = 0  # chunks of the server's answers passed on (each one waited for)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.connect(self._target)
            threading.Thread(target=self._pipe, args=(client, server, 0.0), daemon=True).start()
            threading.Thread(
                target=self._pipe, args=(server, client, _DELAY_S), daemon=True
            ).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, delay: float) -> None:
        try:
            while chunk := source.recv(65536):
                if delay:
                    time.sleep(delay)
                    self.answers += 1
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._listener.close()
        shutil.rmtree(self.directory, ignore_errors=True)


@pytest.fixture
def url(postgres_server: Any) -> str:
    return str(postgres_server.database())


@pytest.fixture
def slow_url(url: str) -> Iterator[str]:
    """The same database, reached through `_SlowSocket`."""
    from urllib.parse import quote, unquote

    head, database = url.rsplit("/", 1)
    directory = unquote(head.split("@", 1)[1])
    slow = _SlowSocket(directory)
    try:
        yield f"{head.split('@', 1)[0]}@{quote(slow.directory, safe='')}/{database}"
    finally:
        slow.close()


def _append(store: Store, connection: Any, count: int, name: str) -> list[int]:
    return [store.append_event(connection, name, "probe", {"n": n}).seq for n in range(count)]


def test_a_write_of_twenty_events_holds_the_lock_for_a_few_round_trips_not_twenty(
    slow_url: str,
) -> None:
    store = open_store(slow_url)
    with store.transaction() as connection:  # the chain's head read once, a warm start
        _append(store, connection, 1, "first")
    held_before = store.write_lock_held_s
    began = time.perf_counter()
    with store.transaction() as connection:
        seqs = _append(store, connection, 20, "twenty")
    elapsed = time.perf_counter() - began
    # BEGIN with the lock, the head, the appends answered together, COMMIT: 4 waits for
    # the server; one wait per statement would be 24 (over 0.7 s).
    assert elapsed < 10 * _DELAY_S, f"the write took {elapsed:.3f}s"
    assert store.write_lock_held_s - held_before < 10 * _DELAY_S
    assert seqs == list(range(2, 22))
    report = store.verify_chain()
    assert report.ok and report.checked == 21
    store.close()


@pytest.mark.anyio
async def test_units_of_one_batch_are_answered_each_and_commit_together_over_a_slow_link(
    slow_url: str,
) -> None:
    store = open_store(slow_url)

    def unit(connection: Any, name: str) -> list[int]:
        return _append(store, connection, 5, name)

    outcomes: dict[str, list[int]] = {}

    async def write(name: str) -> None:
        outcomes[name] = await store.write(unit, name)

    began = time.perf_counter()
    async with anyio.create_task_group() as group:
        for name in ("a", "b", "c", "d"):
            group.start_soon(write, name)
    elapsed = time.perf_counter() - began
    # 20 events in at most two batches; one wait per statement would be 28+ waits.
    assert elapsed < 18 * _DELAY_S, f"the writes took {elapsed:.3f}s"
    seqs = sorted(seq for found in outcomes.values() for seq in found)
    assert seqs == list(range(1, 21))
    assert store.verify_chain().ok
    store.close()


def test_a_refused_statement_fails_its_own_unit_and_the_others_of_the_batch_commit(
    url: str,
) -> None:
    store = open_store(url)

    def refused(connection: Any) -> None:
        _append(store, connection, 2, "refused")
        # A statement whose answer is read (a duplicate key): refused at once, in its unit.
        connection.execute("INSERT INTO extensions (name, version) VALUES ('x', 1)")
        connection.execute("INSERT INTO extensions (name, version) VALUES ('x', 1)")

    def kept(connection: Any, name: str) -> list[int]:
        return _append(store, connection, 2, name)

    release = threading.Event()
    outcomes: dict[str, Any] = {}

    def hold(connection: Any) -> None:
        release.wait(30)

    async def main() -> None:
        async def write(name: str, function: Any, *args: Any) -> None:
            try:
                outcomes[name] = await store.write(function, *args)
            except StoreError as exc:
                outcomes[name] = exc

        async with anyio.create_task_group() as group:
            group.start_soon(write, "hold", hold)
            await anyio.sleep(0.2)
            group.start_soon(write, "before", kept, "before")
            group.start_soon(write, "refused", refused)
            group.start_soon(write, "after", kept, "after")
            await anyio.sleep(0.2)
            release.set()

    anyio.run(main)
    assert isinstance(outcomes["refused"], StoreError)
    assert "refused a write" in str(outcomes["refused"])
    assert outcomes["before"] == [1, 2] and outcomes["after"] == [3, 4]
    assert [event.run_id for event in store.events_after(0)] == ["before"] * 2 + ["after"] * 2
    assert store._query("SELECT name FROM extensions WHERE name = 'x'") == []
    assert store.verify_chain().ok
    store.close()


# -- a writer that dies or is cut off while it holds the lock -----------------------

_HOLDER = textwrap.dedent(
    """
    import sys, time
    from agentrt import open_store

    store = open_store(sys.argv[1])
    with store.transaction() as connection:
        for n in range(5):
            store.append_event(connection, "doomed", "probe", {"n": n})
        print("holding", flush=True)
        time.sleep(60)
    """
)


def _chain_is_whole(store: Store) -> list[int]:
    report = store.verify_chain()
    assert report.ok, report.reason
    seqs = [event.seq for event in store.events_after(0)]
    assert seqs == list(range(1, len(seqs) + 1)), "a seq is duplicated or skipped"
    return seqs


def test_a_writer_killed_while_it_holds_the_lock_leaves_a_whole_chain(
    database: str | Path, tmp_path: Path
) -> None:
    store = open_store(database)
    with store.transaction() as connection:
        _append(store, connection, 3, "before")
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(database)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "AGENTRT_ANCHOR_DIR": str(tmp_path / "anchors")},
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "holding"
        # Another writer queues for the lock the holder will never give back by itself.
        results: list[Any] = []

        def write() -> None:
            with store.transaction() as connection:
                results.append(_append(store, connection, 2, "after"))

        waiter = threading.Thread(target=write)
        waiter.start()
        time.sleep(0.3)
        assert results == [] and waiter.is_alive()
        holder.send_signal(signal.SIGKILL)
        waiter.join(30)
    finally:
        holder.kill()
        holder.wait()
    # The dead writer's events are not there; the waiter's follow the chain without a gap.
    assert results == [[4, 5]]
    assert _chain_is_whole(store) == [1, 2, 3, 4, 5]
    assert {event.run_id for event in store.events_after(0)} == {"before", "after"}
    store.close()


@pytest.mark.anyio
async def test_a_batch_whose_connection_is_lost_mid_write_writes_nothing_and_the_chain_goes_on(
    url: str,
) -> None:
    import psycopg

    store = open_store(url)
    await store.write(lambda connection: _append(store, connection, 2, "before"))
    release = threading.Event()
    outcomes: dict[str, Any] = {}

    def cut(connection: Any) -> list[int]:
        seqs = _append(store, connection, 3, "cut")  # sent, their answers not yet read
        database = url.rsplit("/", 1)[1]
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = %s AND application_name = 'agentrt'",
                (database,),
            )
        return seqs

    def hold(connection: Any) -> None:
        release.wait(30)

    async def write(name: str, function: Any) -> None:
        try:
            outcomes[name] = await store.write(function)
        except StoreError as exc:
            outcomes[name] = exc

    async with anyio.create_task_group() as group:
        group.start_soon(write, "hold", hold)
        await anyio.sleep(0.2)
        group.start_soon(write, "cut", cut)
        group.start_soon(
            write, "beside", lambda connection: _append(store, connection, 2, "beside")
        )
        await anyio.sleep(0.2)
        release.set()
    # Every unit of the cut batch is told nothing of it was written.
    for name in ("cut", "beside"):
        assert isinstance(outcomes[name], StoreError), outcomes[name]
        assert "nothing of it was written" in str(outcomes[name])
    # The next write goes on, on a new connection, right after the last kept event.
    after = await store.write(lambda connection: _append(store, connection, 2, "after"))
    assert after == [3, 4]
    assert _chain_is_whole(store) == [1, 2, 3, 4]
    store.close()


def test_a_commit_after_an_error_the_caller_caught_is_refused_not_reported_written(
    url: str,
) -> None:
    store = open_store(url)
    with (
        pytest.raises(StoreError, match="rolled back a transaction after an error in it"),
        store.transaction() as connection,
    ):
        _append(store, connection, 2, "lost")
        connection.execute("INSERT INTO extensions (name, version) VALUES ('y', 1)")
        with pytest.raises(StoreError, match="refused a write"):
            connection.execute("INSERT INTO extensions (name, version) VALUES ('y', 1)")
    assert store._query("SELECT name FROM extensions WHERE name = 'y'") == []
    with store.transaction() as connection:
        assert _append(store, connection, 1, "next") == [1]
    assert _chain_is_whole(store) == [1]
    store.close()


def test_a_commit_the_server_refuses_is_one_sentence_and_the_store_goes_on(url: str) -> None:
    import psycopg

    store = open_store(url)
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(
            "CREATE FUNCTION refuse_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$"
            " BEGIN RAISE EXCEPTION 'refused at commit'; END $$"
        )
        admin.execute(
            "CREATE CONSTRAINT TRIGGER refuses_at_commit AFTER INSERT ON extensions"
            " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW"
            " WHEN (NEW.name = 'refused') EXECUTE FUNCTION refuse_at_commit()"
        )
    with (
        pytest.raises(StoreError, match=r"^database postgresql://.*: refused at commit$"),
        store.transaction() as connection,
    ):
        _append(store, connection, 2, "lost")
        connection.execute("INSERT INTO extensions (name, version) VALUES ('refused', 1)")
    assert store._query("SELECT name FROM extensions WHERE name = 'refused'") == []
    with store.transaction() as connection:
        assert _append(store, connection, 1, "next") == [1]
    assert _chain_is_whole(store) == [1]
    store.close()


def test_without_libpq_pipeline_mode_each_statement_is_waited_for_and_writes_still_work(
    slow_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentrt.store import _postgres

    monkeypatch.setattr(_postgres, "_PIPELINE", False)  # as with a libpq older than 14
    store = open_store(slow_url)
    with store.transaction() as connection:
        _append(store, connection, 1, "first")
    began = time.perf_counter()
    with store.transaction() as connection:
        seqs = _append(store, connection, 20, "twenty")
    assert time.perf_counter() - began > 20 * _DELAY_S  # one wait per statement
    assert seqs == list(range(2, 22))
    assert _chain_is_whole(store) == list(range(1, 22))
    store.close()


def test_the_store_counts_the_seconds_its_writes_wait_for_and_hold_the_write_lock(
    database: str | Path,
) -> None:
    holder, waiter = open_store(database), open_store(database)
    taken = threading.Event()

    def hold() -> None:
        with holder.transaction() as connection:
            _append(holder, connection, 1, "holder")
            taken.set()
            time.sleep(0.4)

    thread = threading.Thread(target=hold)
    thread.start()
    assert taken.wait(10)
    with waiter.transaction() as connection:
        _append(waiter, connection, 1, "waiter")
    thread.join()
    # The waiter waited for the holder's lock; the holder held it through its sleep.
    assert 0.2 <= waiter.write_lock_wait_s < 10
    assert 0.4 <= holder.write_lock_held_s < 10
    assert waiter.write_lock_held_s < holder.write_lock_held_s
    assert _chain_is_whole(holder) == [1, 2]
    holder.close()
    waiter.close()


@pytest.mark.anyio
async def test_a_session_ended_by_the_server_mid_write_is_a_lost_connection_even_read_first(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server's "terminating connection" answer can be read before the socket's end
    is: the write is still one the break cut (nothing of it was written, the other units
    of the batch told so too), and the next write goes on on a new connection."""
    import psycopg

    store = open_store(url)
    await store.write(lambda connection: _append(store, connection, 2, "before"))
    ending = threading.Event()
    original_sync = psycopg.Pipeline.sync

    def sync(pipeline: Any) -> None:
        if ending.is_set():
            ending.clear()
            # The session really ends; its answer is what libpq reads first.
            database = url.rsplit("/", 1)[1]
            with psycopg.connect(url, autocommit=True) as admin:
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = %s AND application_name = 'agentrt'",
                    (database,),
                )
            raise psycopg.errors.AdminShutdown(
                "terminating connection due to administrator command"
            )
        original_sync(pipeline)

    monkeypatch.setattr(psycopg.Pipeline, "sync", sync)

    def cut(connection: Any) -> list[int]:
        seqs = _append(store, connection, 3, "cut")
        ending.set()
        return seqs

    outcomes: dict[str, Any] = {}
    release = threading.Event()

    async def write(name: str, function: Any) -> None:
        try:
            outcomes[name] = await store.write(function)
        except StoreError as exc:
            outcomes[name] = exc

    async with anyio.create_task_group() as group:
        group.start_soon(write, "hold", lambda connection: release.wait(30))
        await anyio.sleep(0.2)
        group.start_soon(write, "cut", cut)
        await anyio.sleep(0.05)
        group.start_soon(
            write, "beside", lambda connection: _append(store, connection, 2, "beside")
        )
        await anyio.sleep(0.2)
        release.set()
    for name in ("cut", "beside"):
        assert isinstance(outcomes[name], StoreError), outcomes[name]
        assert "nothing of it was written" in str(outcomes[name])
    after = await store.write(lambda connection: _append(store, connection, 2, "after"))
    assert after == [3, 4]
    assert _chain_is_whole(store) == [1, 2, 3, 4]
    store.close()
