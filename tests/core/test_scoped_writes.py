"""Scoped writes (decision 0065): on PostgreSQL a write scoped to one session runs beside
other sessions' scoped writes, from several stores (proxies) at once; only its events wait
for the chain's lock, at its end.  Every other write still excludes them all, and the chain
stays one ordered, verifiable chain."""

from __future__ import annotations

import functools
import random
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from agentrt import open_store
from agentrt.canonical import canonical_json
from agentrt.errors import StoreError
from agentrt.store import Store, ledger
from agentrt.store._chain import event_hash
from agentrt.store._outbox import enable_outbox, outbox_rows
from agentrt.store._times import utc_now

pytestmark = pytest.mark.anyio


class _Refused(Exception):
    pass


@pytest.fixture
def url(postgres_server: Any) -> str:
    return str(postgres_server.database())


def _starting(
    store: Store,
    run_id: str,
    *,
    entered: threading.Event | None = None,
    release: threading.Event | None = None,
    fail: bool = False,
) -> Any:
    """A unit that starts run `run_id` (a row and its `run_started` event, through the
    ledger), then says it is inside, waits for `release`, and raises if told to."""

    def unit(connection: Any) -> str:
        ledger.start_run(store, connection, run_id, f"goal of {run_id}", ["read"], None,
                         utc_now(), None)  # fmt: skip
        if entered is not None:
            entered.set()
        if release is not None and not release.wait(timeout=30):
            raise TimeoutError("the test never released the write")
        if fail:
            raise _Refused(f"{run_id} refused after writing")
        return run_id

    return unit


async def _inside(entered: threading.Event) -> None:
    with anyio.fail_after(10):
        while not entered.is_set():
            await anyio.sleep(0.01)


def _started(store: Store) -> list[tuple[str, int, int]]:
    """Each run's id, its `run_started` event's seq and its creation order, by seq."""
    rows = store.query(
        "SELECT e.run_id, e.seq, r.created_seq FROM events e JOIN runs r ON r.run_id = e.run_id"
        " WHERE e.type = 'run_started' ORDER BY e.seq"
    )
    return [(row[0], int(row[1]), int(row[2])) for row in rows]


def _sound(store: Store) -> None:
    assert store.verify_chain().ok
    assert store.verify_state().ok


async def test_two_sessions_scoped_writes_commit_beside_each_other_in_one_chain(url: str) -> None:
    """One proxy's write for session a is inside its transaction (its session's lock held,
    its row written); another proxy's write for session b starts, commits and is answered
    meanwhile.  Then a's commits: its event follows b's in the chain, its creation order
    and its time too, and the chain and the tables verify."""
    first, second = open_store(url), open_store(url)
    entered, release = threading.Event(), threading.Event()
    answered: dict[str, str] = {}

    async def write_a() -> None:
        answered["a"] = await first.write_scoped(
            ("session-a", "", ""), _starting(first, "run-a", entered=entered, release=release)
        )

    async with anyio.create_task_group() as group:
        group.start_soon(write_a)
        await _inside(entered)
        with anyio.fail_after(10):  # under one write lock for all, this would wait for a
            answered["b"] = await second.write_scoped(
                ("session-b", "", ""), _starting(second, "run-b")
            )
        assert "a" not in answered
        release.set()
    assert answered == {"a": "run-a", "b": "run-b"}
    assert _started(first) == [("run-b", 1, 1), ("run-a", 2, 2)]
    # Stamped when written, under the chain's lock: a's event, made first, is dated after
    # b's, so the chain stays in time order (the archive's cut bisects on it).
    times = [event.created_at for event in first.events_after(0)]
    assert times == sorted(times) and times[0] < times[1]
    _sound(first)
    for store in (first, second):
        store.close()


async def test_an_unscoped_write_waits_for_every_scoped_write_in_progress(url: str) -> None:
    """A write that is not scoped (an approval decided, a checkpoint, an archive) takes
    the write lock whole: it waits for a scoped write in progress, and sees it committed."""
    first, second = open_store(url), open_store(url)
    entered, release = threading.Event(), threading.Event()
    answered: list[str] = []

    async def scoped() -> None:
        answered.append(
            await first.write_scoped(
                ("session-a", "", ""), _starting(first, "run-a", entered=entered, release=release)
            )
        )

    async def whole() -> None:
        answered.append(await second.write(_starting(second, "run-whole")))

    async with anyio.create_task_group() as group:
        group.start_soon(scoped)
        await _inside(entered)
        group.start_soon(whole)
        await anyio.sleep(0.5)
        assert answered == []
        release.set()
    assert sorted(answered) == ["run-a", "run-whole"]
    assert [run_id for run_id, _, _ in _started(second)] == ["run-a", "run-whole"]
    _sound(second)
    for store in (first, second):
        store.close()


async def test_a_scoped_write_killed_holding_its_session_leaves_nothing_and_frees_it(
    url: str,
) -> None:
    """The server ends a proxy's connection while its scoped write holds the session's lock
    (its row written, its events not yet): the session is free at once for another proxy,
    whose write commits; the killed write's caller is told nothing of it was written, and
    nothing of it stands."""
    import psycopg

    killed, other = open_store(url), open_store(url)
    entered, release = threading.Event(), threading.Event()
    outcome: dict[str, Any] = {}

    async def doomed() -> None:
        try:
            outcome["killed"] = await killed.write_scoped(
                ("session-a", "", ""),
                _starting(killed, "run-killed", entered=entered, release=release),
            )
        except StoreError as exc:
            outcome["killed"] = exc

    async with anyio.create_task_group() as group:
        group.start_soon(doomed)
        await _inside(entered)
        pid = killed._connection._connection.info.backend_pid  # type: ignore[attr-defined]
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        with anyio.fail_after(10):  # the session's lock went with the killed connection
            outcome["other"] = await other.write_scoped(
                ("session-a", "", ""), _starting(other, "run-b")
            )
        release.set()
    assert outcome["other"] == "run-b"
    assert isinstance(outcome["killed"], StoreError)
    assert "nothing of it was written" in str(outcome["killed"]) or "broke" in str(
        outcome["killed"]
    )
    assert _started(other) == [("run-b", 1, 1)]
    assert not other.query("SELECT run_id FROM runs WHERE run_id = 'run-killed'")
    _sound(other)
    # The killed proxy's store opens another connection and goes on from the chain's head.
    assert (
        await killed.write_scoped(("session-a", "", ""), _starting(killed, "run-after"))
        == "run-after"
    )
    assert _started(killed)[-1] == ("run-after", 2, 2)
    _sound(killed)
    for store in (killed, other):
        store.close()


async def test_a_scoped_write_appending_outside_the_ledger_is_refused_and_nothing_written(
    url: str,
) -> None:
    """A scoped unit that appends an event itself (not through the ledger, whose events a
    scoped write writes at its end) is refused in one sentence; nothing of it stands, and
    the store's next writes go on."""
    store = open_store(url)

    def stray(connection: Any) -> None:
        ledger.start_run(store, connection, "run-stray", "stray", [], None, utc_now(), None)
        store.append_event(connection, "run-stray", "note", {"by": "a unit"})

    with pytest.raises(StoreError, match="a scoped write appends its events through the ledger"):
        await store.write_scoped(("session-a", "", ""), stray)
    assert not store.query("SELECT run_id FROM runs")
    assert store.query("SELECT COUNT(*) FROM events")[0][0] == 0
    assert (
        await store.write_scoped(("session-a", "", ""), _starting(store, "run-next")) == "run-next"
    )
    assert await store.write(_starting(store, "run-whole")) == "run-whole"
    assert _started(store) == [("run-next", 1, 1), ("run-whole", 2, 2)]
    _sound(store)
    store.close()


async def _hold_scoped_writer(
    store: Store, scope: tuple[str, str, str], release: threading.Event
) -> None:
    """Keep `store`'s writer inside a scoped unit until `release`, so later writes queue."""

    def wait(connection: Any) -> None:
        if not release.wait(timeout=30):
            raise TimeoutError("the test never released the writer")

    await store.write_scoped(scope, wait)


async def test_a_batch_of_scoped_writes_keeps_each_ones_failure_its_own_and_holds_back_others(
    url: str,
) -> None:
    """Writes queued behind a scoped batch: the scoped ones share the next transaction (a
    failing one drops its own row and events only), an unscoped one waits for the batch
    after it, and one whose session another proxy holds is given back until it is free;
    every caller is answered with what committed, and the chain has no gap."""
    store, other = open_store(url), open_store(url)
    release, held_entered, held_release = threading.Event(), threading.Event(), threading.Event()
    outcomes: dict[str, Any] = {}

    async def write(name: str, scope: str | None, fail: bool = False) -> None:
        unit = _starting(store, name, fail=fail)
        try:
            if scope is None:
                outcomes[name] = await store.write(unit)
            else:
                outcomes[name] = await store.write_scoped((scope, "", ""), unit)
        except _Refused as exc:
            outcomes[name] = exc

    async def hold_elsewhere() -> None:
        unit = _starting(other, "run-held", entered=held_entered, release=held_release)
        await other.write_scoped(("session-held", "", ""), unit)

    async with anyio.create_task_group() as group:
        group.start_soon(hold_elsewhere)
        await _inside(held_entered)
        group.start_soon(_hold_scoped_writer, store, ("session-0", "", ""), release)
        await anyio.sleep(0.2)  # the writer is inside the holding unit
        commits = store.commits
        for name, scope, fail in (
            ("run-1", "session-1", False),
            ("run-whole", None, False),
            ("run-2", "session-2", True),
            ("run-3", "session-held", False),
            ("run-4", "session-4", False),
        ):
            group.start_soon(write, name, scope, fail)
            await anyio.sleep(0.02)  # queued in this order
        await anyio.sleep(0.2)
        release.set()
        with anyio.fail_after(10):
            while not {"run-1", "run-2", "run-4"} <= set(outcomes):
                await anyio.sleep(0.01)
        await anyio.sleep(0.2)
        # run-3's session is the other proxy's; the unscoped write waits for that one too.
        assert "run-3" not in outcomes and "run-whole" not in outcomes
        held_release.set()
    assert isinstance(outcomes["run-2"], _Refused)
    assert {name: outcomes[name] for name in ("run-1", "run-3", "run-4", "run-whole")} == {
        "run-1": "run-1", "run-3": "run-3", "run-4": "run-4", "run-whole": "run-whole",
    }  # fmt: skip
    # run-1 and run-4 in one transaction; the other proxy's write; run-3 once its session
    # was free; the unscoped write, which waited for every scoped one.
    order = [run_id for run_id, _, _ in _started(store)]
    assert order == ["run-1", "run-4", "run-held", "run-3", "run-whole"]
    assert store.commits - commits == 4  # the holder's, run-1 with run-4, run-3, run-whole
    assert [seq for _, seq, _ in _started(store)] == [1, 2, 3, 4, 5]
    assert sorted(created for _, _, created in _started(store)) == [1, 2, 3, 4, 5]
    _sound(store)
    for each in (store, other):
        each.close()


async def test_many_scoped_writers_on_two_stores_never_deadlock_and_append_one_chain(
    url: str,
) -> None:
    """Two proxies write for the same few sessions in random orders, many at once (batches
    whose sessions overlap in every order), with unscoped writes among them: every write
    is answered, none waits on another for ever, and the chain, its creation orders and
    the tables agree."""
    stores = [open_store(url), open_store(url)]
    rng = random.Random(36)
    plan = [
        (
            rng.choice(stores),
            rng.choice(
                [
                    ("s1", "", ""),
                    ("s2", "", ""),
                    ("s1", "t1", ""),
                    ("s1", "t1", "k1"),
                    ("s1", "t1", "k2"),
                    ("s1", "t2", "k1"),
                    ("s2", "t1", "k1"),
                    None,
                ]
            ),
            f"run-{n}",
        )
        for n in range(120)
    ]
    answered: list[str] = []

    async def write(store: Store, scope: tuple[str, str, str] | None, run_id: str) -> None:
        unit = _starting(store, run_id)
        if scope is None:
            answered.append(await store.write(unit))
        else:
            answered.append(await store.write_scoped(scope, unit))

    began = time.monotonic()
    with anyio.fail_after(60):
        async with anyio.create_task_group() as group:
            for store, scope, run_id in plan:
                group.start_soon(write, store, scope, run_id)
    assert sorted(answered) == sorted(run_id for _, _, run_id in plan)
    started = _started(stores[0])
    assert [seq for _, seq, _ in started] == list(range(1, 121))
    assert sorted(created for _, _, created in started) == list(range(1, 121))
    _sound(stores[0])
    assert time.monotonic() - began < 60
    for store in stores:
        store.close()


@pytest.mark.parametrize(
    ("first_scope", "second_scope"),
    [
        (("team", "read", "a"), ("team", "read", "b")),  # two requests of one tool
        (("team", "write", ""), ("team", "read", "a")),  # a tool, and another's request
    ],
)
async def test_writes_of_disjoint_scopes_of_one_session_commit_beside_each_other(
    url: str, first_scope: tuple[str, str, str], second_scope: tuple[str, str, str]
) -> None:
    """Two proxies of one session (a team's, as docs/postgresql.md sets it up) writing for
    scopes that share no rows: the second commits while the first is inside its
    transaction; the chain has both, in commit order."""
    first, second = open_store(url), open_store(url)
    entered, release = threading.Event(), threading.Event()
    answered: dict[str, str] = {}

    async def write_a() -> None:
        unit = _starting(first, "run-a", entered=entered, release=release)
        answered["a"] = await first.write_scoped(first_scope, unit)

    async with anyio.create_task_group() as group:
        group.start_soon(write_a)
        await _inside(entered)
        with anyio.fail_after(10):
            answered["b"] = await second.write_scoped(second_scope, _starting(second, "run-b"))
        assert "a" not in answered
        release.set()
    assert _started(first) == [("run-b", 1, 1), ("run-a", 2, 2)]
    _sound(first)
    for store in (first, second):
        store.close()


@pytest.mark.parametrize(
    ("holding", "waiting"),
    [
        (("team", "", ""), ("team", "", "")),  # the same session, whole
        (("team", "read", "a"), ("team", "read", "a")),  # the same request
        (("team", "read", "a"), ("team", "", "")),  # the whole session waits for a request
        (("team", "", ""), ("team", "read", "b")),  # a request for the whole session
        (("team", "read", ""), ("team", "read", "b")),  # a request for its tool
        (("team", "read", "a"), ("team", "read", "")),  # a tool for one of its requests
    ],
)
async def test_a_write_waits_for_one_whose_scope_covers_or_is_covered_by_its_own(
    url: str, holding: tuple[str, str, str], waiting: tuple[str, str, str]
) -> None:
    """The same session or request, a whole session and one of its tools or requests, a
    tool and one of its requests: the second waits for the one in progress, is answered
    only after it committed, and sees what it wrote."""
    first, second = open_store(url), open_store(url)
    entered, release = threading.Event(), threading.Event()
    answered: list[str] = []

    async def write(store: Store, scope: tuple[str, str, str], run_id: str, **waits: Any) -> None:
        answered.append(await store.write_scoped(scope, _starting(store, run_id, **waits)))

    async with anyio.create_task_group() as group:
        group.start_soon(
            functools.partial(write, first, holding, "run-1", entered=entered, release=release)
        )
        await _inside(entered)
        group.start_soon(write, second, waiting, "run-2")
        await anyio.sleep(0.5)
        assert answered == []
        release.set()
    assert sorted(answered) == ["run-1", "run-2"]  # (answered in either order: see the chain)
    assert _started(second) == [("run-1", 1, 1), ("run-2", 2, 2)]
    _sound(second)
    for store in (first, second):
        store.close()


async def test_events_hashed_by_the_database_are_the_chains_own_hashes(url: str) -> None:
    """A scoped write's events are appended after the head and hashed by PostgreSQL
    (decision 0065); text beyond ASCII, quotes, backslashes and control characters in
    every field, after events appended the ordinary way, give the hashes `verify_chain`
    recomputes, and the head this host anchors."""
    store = open_store(url)
    assert await store.write(_starting(store, "run-plain")) == "run-plain"
    odd = 'ünïcödé ✓ 😀 "quoted" back\\slash tab\t newline\n \u2028'
    for number in range(3):
        run_id = f"run {odd} {number}"
        assert await store.write_scoped(("s", "t", odd), _starting(store, run_id)) == run_id
    events = store.events_after(0)
    assert len(events) == 4
    for event in events:
        assert event.hash == event_hash(
            event.prev_hash, event.seq, event.run_id, event.type,
            canonical_json(event.payload), event.created_at,
        )  # fmt: skip
    assert [event.prev_hash for event in events[1:]] == [event.hash for event in events[:-1]]
    _sound(store)
    anchor = store.check_anchor()
    assert anchor.ok and anchor.anchor_seq == 4
    store.close()


async def test_a_scoped_writes_announcements_are_written_with_its_events(url: str) -> None:
    """With an outbox (`notify` configured), a scoped write's events are answered before
    its COMMIT so each announcement is written in the same transaction, naming the seq
    the database gave the event; a scoped unit that fails leaves neither."""
    store = open_store(url)
    enable_outbox(
        store,
        lambda type_, payload: [("r", "started")] if type_ == "run_started" else [],
        lambda: 1.0,
        ["r"],
    )
    assert await store.write(_starting(store, "run-plain")) == "run-plain"
    for number in range(2):
        scope = ("s", "t", str(number))
        assert await store.write_scoped(scope, _starting(store, f"run-{number}")) == f"run-{number}"
    with pytest.raises(_Refused):
        await store.write_scoped(("s", "t", "x"), _starting(store, "run-refused", fail=True))
    started = {run_id: seq for run_id, seq, _ in _started(store)}
    rows = outbox_rows(store)
    assert sorted((row.run_id, row.event_seq) for row in rows) == sorted(started.items())
    assert "run-refused" not in started
    _sound(store)
    store.close()


@pytest.mark.parametrize("backend", ["sqlite"])
async def test_on_sqlite_a_scoped_write_is_a_write(backend: str, tmp_path: Path) -> None:
    """SQLite has one writer: a scoped write is an ordinary write, its events appended at
    once (a unit may append one itself)."""
    store = open_store(tmp_path / "runs.db")

    def unit(connection: Any) -> int:
        ledger.start_run(store, connection, "run-a", "goal", [], None, utc_now(), None)
        return store.append_event(connection, "run-a", "note", {"by": "the unit"}).seq

    assert not store.deferring
    assert await store.write_scoped(("session-a", "", ""), unit) == 2
    assert _started(store) == [("run-a", 1, 1)]
    _sound(store)
    store.close()


@pytest.mark.parametrize("lock", ["chain", "write"])
async def test_a_session_holding_the_advisory_locks_delays_scoped_writes_but_cannot_reorder_them(
    url: str, lock: str
) -> None:
    """A role that can take advisory locks (SECURITY.md) holds the chain's lock, or the write
    lock, from a session of its own: two proxies' scoped writes wait (at their tail, or at
    their BEGIN), and once it lets go both commit into one chain whose order is the order
    of their commits (seq and creation order agree, every hash recomputes)."""
    import psycopg

    from agentrt.store._postgres import CHAIN_LOCK, WRITE_LOCK

    key = CHAIN_LOCK if lock == "chain" else WRITE_LOCK
    first, second = open_store(url), open_store(url)
    answered: dict[str, str] = {}

    async def write(store: Store, session: str, run_id: str) -> None:
        answered[run_id] = await store.write_scoped((session, "", ""), _starting(store, run_id))

    with psycopg.connect(url, autocommit=True) as rogue:
        rogue.execute("SELECT pg_advisory_lock(%s)", (key,))
        async with anyio.create_task_group() as group:
            group.start_soon(write, first, "session-a", "run-a")
            group.start_soon(write, second, "session-b", "run-b")
            await anyio.sleep(0.5)
            assert answered == {}  # delayed
            rogue.execute("SELECT pg_advisory_unlock(%s)", (key,))
    assert sorted(answered) == ["run-a", "run-b"]
    started = _started(first)
    assert [seq for _, seq, _ in started] == [1, 2]
    assert [order for _, _, order in started] == [1, 2]
    _sound(first)
    for store in (first, second):
        store.close()
