"""The store's guarantees on a real PostgreSQL server: one chain for many writers, leases
on the server's clock, events nobody can rewrite, the schema refusals, no password shown."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest
from click.testing import CliRunner

from agentrt import (
    ApprovalError,
    Decision,
    Gate,
    RunLeased,
    RunStateError,
    RunStatus,
    SideEffect,
    StoreError,
    approve,
    open_store,
)
from agentrt.cli import cli
from agentrt.errors import UnsafeDatabase
from agentrt.gate import Limits
from agentrt.proxy._index import CallIndex
from agentrt.store import SCHEMA_VERSION

from .helpers import RecordingTool, approval_policy

pytestmark = pytest.mark.anyio


@pytest.fixture
def url(postgres_server: Any) -> str:
    return str(postgres_server.database())


def _superuser(url: str) -> Any:
    import psycopg

    return psycopg.connect(url, autocommit=True)


async def _one_event(url: str) -> tuple[Gate, str]:
    gate = Gate(open_store(url), [RecordingTool("read", SideEffect.READ_ONLY)])
    run_id = await gate.start("one run")
    return gate, run_id


async def test_events_refuse_update_delete_and_truncate_even_from_their_owner(url: str) -> None:
    import psycopg

    gate, run_id = await _one_event(url)
    with _superuser(url) as owner:
        for statement in (
            "UPDATE events SET payload = '{}' WHERE seq = 1",
            "DELETE FROM events WHERE seq = 1",
            "TRUNCATE events",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="append-only"):
                owner.execute(statement)
    assert [event.type for event in gate.store.list_events(run_id)] == ["run_started"]
    assert gate.store.verify_chain().ok
    gate.store.close()


# The grants docs/postgresql.md gives the proxies' role (the tables' owner is another role).
_PROXY_GRANTS = """
GRANT CONNECT ON DATABASE {database} TO {role};
GRANT USAGE, CREATE ON SCHEMA public TO {role};
GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA public TO {role};
REVOKE UPDATE, DELETE, TRUNCATE ON events FROM {role};
"""


async def test_the_proxies_role_works_but_cannot_rewrite_events(
    url: str, postgres_server: Any
) -> None:
    import psycopg

    gate, _ = await _one_event(url)  # the owner created and migrated the schema
    gate.store.close()
    role = "proxies_" + uuid.uuid4().hex[:8]
    database = url.rsplit("/", 1)[1]
    postgres_server.admin(f"CREATE ROLE {role} LOGIN")
    with _superuser(url) as owner:
        for statement in _PROXY_GRANTS.format(database=database, role=role).split(";"):
            if statement.strip():
                owner.execute(statement)
    as_proxies = postgres_server.url(database, user=role)
    gate = Gate(open_store(as_proxies), [RecordingTool("read", SideEffect.READ_ONLY)])
    # The proxy's own tables (its call index) it creates itself, and owns.
    CallIndex(gate.store, "session", "holder", 2.0)
    run_id = await gate.start("run by the proxies' role")
    outcome = await gate.step(run_id, Decision.tool_call("read", '{"path": "a"}'))
    assert outcome.observation is not None and outcome.observation.kind == "result"
    gate.store.close()
    with psycopg.connect(as_proxies, autocommit=True) as proxies:
        for statement in (
            "UPDATE events SET payload = '{}' WHERE seq = 1",
            "DELETE FROM events WHERE seq = 1",
            "ALTER TABLE events DISABLE TRIGGER events_append_only",
            "DROP TRIGGER events_append_only ON events",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                proxies.execute(statement)
    with open_store(url, read_only=True) as store:
        report = store.verify_chain()
        assert report.ok and report.checked == report.head_seq
        assert "tool_finished" in [event.type for event in store.list_events(run_id)]


@pytest.mark.parametrize(
    "form",
    [
        "postgresql://agentrt:{secret}@{host}/{db}",
        "postgresql://agentrt@{host}/{db}?password={secret}",
    ],
)
def test_a_url_holding_a_password_is_refused_and_the_password_never_shown(
    url: str, form: str
) -> None:
    host, db = url.removeprefix("postgresql://agentrt@").rsplit("/", 1)
    secret = "s3cret-" + uuid.uuid4().hex[:6]
    with_password = form.format(secret=secret, host=host, db=db)
    with pytest.raises(StoreError, match="holds a password") as refused:
        open_store(with_password)
    assert secret not in str(refused.value)
    assert "PGPASSWORD, a pgpass file or a libpq service" in str(refused.value)
    result = CliRunner().invoke(cli, ["--db", with_password, "verify"])
    assert result.exit_code == 2 and "holds a password" in result.output
    assert secret not in result.output


def test_many_writers_on_two_stores_append_one_chain(url: str) -> None:
    stores = [open_store(url), open_store(url)]
    failures: list[BaseException] = []

    def append(store: Any, name: str) -> None:
        try:
            for index in range(40):
                with store.transaction() as connection:
                    store.append_event(connection, name, "probe", {"index": index})
        except BaseException as exc:  # reported below
            failures.append(exc)

    threads = [
        threading.Thread(target=append, args=(stores[number % 2], f"writer-{number}"))
        for number in range(6)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    report = stores[0].verify_chain()
    assert report.ok and report.checked == 240 and report.head_seq == 240
    for store in stores:
        store.close()


async def test_a_lease_is_judged_on_the_database_clock_not_the_hosts(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    read = RecordingTool("read", SideEffect.READ_ONLY)
    first = Gate(open_store(url), [read], lease_ttl=30.0)
    run_id = await first.start("leased by the first host")
    await first.step(run_id, Decision.tool_call("read", '{"path": "a"}'))
    # A second host whose clock runs an hour ahead would see the lease as lapsed.
    second = Gate(open_store(url), [read], lease_ttl=30.0)
    import time

    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() + 3600.0)
    with pytest.raises(RunLeased):
        await second.step(run_id, Decision.tool_call("read", '{"path": "b"}'))
    monkeypatch.undo()
    assert [step.args for step in first.store.list_steps(run_id)] == ['{"path": "a"}']
    first.store.close()
    second.store.close()


def _skewed_clock(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """This process's wall clock (`time.time` and `time.time_ns`) off by `seconds`."""
    import time

    real_time, real_time_ns = time.time, time.time_ns
    monkeypatch.setattr(time, "time", lambda: real_time() + seconds)
    monkeypatch.setattr(time, "time_ns", lambda: real_time_ns() + int(seconds * 1e9))


async def _waiting_on_approval(url: str, ttl: float) -> tuple[Gate, RecordingTool, str, str]:
    write = RecordingTool("write", SideEffect.LOCAL_MUTATION)
    gate = Gate(open_store(url), [write], policy=approval_policy(), limits=Limits(approval_ttl=ttl))
    run_id = await gate.start("waits for a person")
    approval = (await gate.step(run_id, Decision.tool_call("write", '{"path": "a"}'))).approval
    assert approval is not None
    return gate, write, run_id, approval.approval_hash


async def test_an_approval_is_judged_on_the_database_clock_not_the_deciding_hosts(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Asked on a host with a right clock, with ten minutes to live.
    gate, write, run_id, digest = await _waiting_on_approval(url, ttl=600.0)
    # Decided on a host whose clock runs an hour ahead: the approval has not expired.
    _skewed_clock(monkeypatch, 3600.0)
    approve(open_store(url), run_id, approval_hash=digest, by="ahead")
    outcome = await gate.resume(run_id)
    assert outcome.status is RunStatus.RUNNING and len(write.calls) == 1
    gate.store.close()


async def test_an_approval_past_its_life_expires_on_a_host_whose_clock_is_behind(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate, write, run_id, digest = await _waiting_on_approval(url, ttl=0.5)
    await anyio.sleep(1.0)
    # A host whose clock runs an hour behind still finds it expired, on the server's clock.
    _skewed_clock(monkeypatch, -3600.0)
    with pytest.raises(ApprovalError, match="expired before it was decided"):
        approve(open_store(url), run_id, approval_hash=digest, by="behind")
    run = gate.store.get_run(run_id)
    assert (run.status, run.reason) == (RunStatus.CANCELLED, "approval_expired")
    assert write.calls == []
    gate.store.close()


async def test_a_resumed_run_expires_its_pending_approval_on_the_database_clock(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate, write, run_id, _ = await _waiting_on_approval(url, ttl=0.5)
    await anyio.sleep(1.0)
    _skewed_clock(monkeypatch, -3600.0)
    outcome = await gate.resume(run_id)
    assert (outcome.status, outcome.reason) == (RunStatus.CANCELLED, "approval_expired")
    assert write.calls == []
    gate.store.close()


async def test_a_grant_lifetime_counts_from_the_decision_on_the_database_clock(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    write = RecordingTool("write", SideEffect.LOCAL_MUTATION)
    limits = Limits(grant_ttl=600.0)  # the gate's own: approve is given none
    gate = Gate(open_store(url), [write], policy=approval_policy(), limits=limits)
    run_id = await gate.start("approved on a host whose clock is behind")
    approval = (await gate.step(run_id, Decision.tool_call("write", '{"path": "a"}'))).approval
    assert approval is not None
    # Approved on a host an hour behind: its decision is still dated on the server's clock,
    # so the grant has its ten minutes, not minus fifty.
    with monkeypatch.context() as skewed:
        _skewed_clock(skewed, -3600.0)
        approve(open_store(url), run_id, approval_hash=approval.approval_hash, by="behind")
    outcome = await gate.resume(run_id)
    assert outcome.status is RunStatus.RUNNING and len(write.calls) == 1
    gate.store.close()


async def test_a_run_started_twice_under_one_id_is_refused_and_the_chain_kept(url: str) -> None:
    gate, run_id = await _one_event(url)
    with pytest.raises(RunStateError, match="already exists"):
        await gate.start("again", run_id=run_id)
    run_id_after = await gate.start("another")
    assert gate.store.verify_chain().ok and gate.store.verify_chain().checked == 2
    assert gate.store.get_run(run_id_after).goal == "another"
    gate.store.close()


def test_a_database_from_a_newer_build_is_refused(url: str) -> None:
    open_store(url).close()
    with _superuser(url) as owner:
        owner.execute("UPDATE agentrt_schema SET version = 99")
    with pytest.raises(UnsafeDatabase, match="newer build of agentrt"):
        open_store(url)


def test_a_database_holding_other_tables_is_refused(url: str) -> None:
    with _superuser(url) as owner:
        owner.execute("CREATE TABLE accounts (id INTEGER)")
    with pytest.raises(StoreError, match="holds tables but not the agentrt schema"):
        open_store(url)
    with _superuser(url) as owner:
        assert owner.execute("SELECT to_regclass('events')").fetchone()[0] is None


def test_processes_starting_at_once_migrate_the_schema_once(url: str) -> None:
    failures: list[BaseException] = []

    def start() -> None:
        try:
            open_store(url).close()
        except BaseException as exc:  # reported below
            failures.append(exc)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    with _superuser(url) as owner:
        assert owner.execute("SELECT version FROM agentrt_schema").fetchall() == [(SCHEMA_VERSION,)]
        assert owner.execute(
            "SELECT version FROM extensions WHERE name = 'postgresql'"
        ).fetchall() == [(1,)]


def test_a_database_that_does_not_exist_yet_is_not_created_for_reading(url: str) -> None:
    with pytest.raises(StoreError, match="holds no agentrt schema"):
        open_store(url, read_only=True)
    with _superuser(url) as owner:
        assert owner.execute("SELECT to_regclass('agentrt_schema')").fetchone()[0] is None


async def test_a_read_only_store_never_writes(url: str) -> None:
    gate, run_id = await _one_event(url)
    gate.store.close()
    with open_store(url, read_only=True) as store:
        with pytest.raises(StoreError, match="read-only"), store.transaction():
            pass
        assert store.get_run(run_id).goal == "one run"


async def test_verify_on_postgresql_names_an_event_its_owner_rewrote(url: str) -> None:
    gate, run_id = await _one_event(url)
    await gate.step(run_id, Decision.tool_call("read", '{"path": "a"}'))
    gate.store.close()
    intact = CliRunner().invoke(cli, ["--db", url, "verify"])
    assert intact.exit_code == 0 and "intact" in intact.output
    # Only the tables' owner can, and only by switching the trigger off on purpose.
    with _superuser(url) as owner:
        owner.execute("ALTER TABLE events DISABLE TRIGGER events_append_only")
        owner.execute('UPDATE events SET payload = \'{"goal":"forged"}\' WHERE seq = 1')
        owner.execute("ALTER TABLE events ENABLE TRIGGER events_append_only")
    broken = CliRunner().invoke(cli, ["--db", url, "verify"])
    assert broken.exit_code == 1
    assert "event 1 does not match its hash" in broken.output


def test_an_unreachable_server_is_one_sentence_naming_the_database(tmp_path: Path) -> None:
    url = f"postgresql://agentrt@{str(tmp_path).replace('/', '%2F')}/nowhere"
    with pytest.raises(
        StoreError, match=r"^database postgresql://agentrt@/.*/nowhere cannot be reached"
    ):
        open_store(url)


def test_psycopg_is_imported_only_for_a_postgresql_url(tmp_path: Path) -> None:
    probe = (
        "import sys, agentrt, agentrt.proxy, agentrt.cli, agentrt.telemetry\n"
        f"agentrt.open_store({str(tmp_path / 'runs.db')!r}).close()\n"
        "print('psycopg' in sys.modules)\n"
    )
    finished = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert finished.stdout.strip() == "False"


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_many_rows_in_one_statement_are_written_together_or_not_at_all(
    backend: str, tmp_path: Path, postgres_server: Any
) -> None:
    database = tmp_path / "runs.db" if backend == "sqlite" else str(postgres_server.database())
    store = open_store(database)
    with store.transaction() as connection:
        connection.executemany(
            "INSERT INTO extensions (name, version) VALUES (?, ?)",
            [("first", 1), ("second", 2), ("third", 3)],
        )
    # A row the table refuses (a repeated name) fails the statement and its whole
    # transaction: the row before it in the same batch is not written either.
    with pytest.raises((StoreError, sqlite3.Error)), store.transaction() as connection:
        connection.executemany(
            "INSERT INTO extensions (name, version) VALUES (?, ?)",
            [("fourth", 4), ("first", 5)],
        )
    rows = store._query(
        "SELECT name, version FROM extensions WHERE name IN (?, ?, ?, ?) ORDER BY version",
        ("first", "second", "third", "fourth"),
    )
    assert [tuple(row) for row in rows] == [("first", 1), ("second", 2), ("third", 3)]
    store.close()


# -- a connection that breaks --------------------------------------------------


def _end_sessions(url: str) -> int:
    """End every agentrt session on the test's database, as a server restart would."""
    database = url.rsplit("/", 1)[1]
    with _superuser(url) as admin:
        rows = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = %s AND application_name = 'agentrt'",
            (database,),
        ).fetchall()
    return len(rows)


async def test_a_store_whose_connection_was_ended_opens_another_and_goes_on(url: str) -> None:
    gate = Gate(open_store(url), [RecordingTool("read", SideEffect.READ_ONLY)])
    first = await gate.start("before the break")
    await gate.step(first, Decision.tool_call("read", '{"path": "a"}'))
    assert _end_sessions(url) == 1
    # A read after the break is sent again on a new connection, with the same settings.
    assert gate.store.get_run(first).step_count == 1
    (zone,) = gate.store._query("SHOW TimeZone")[0]
    (lock_timeout,) = gate.store._query("SHOW lock_timeout")[0]
    assert (zone, lock_timeout) == ("UTC", "30s")
    assert _end_sessions(url) == 1
    # So is the BEGIN of the next write: runs go on as if nothing happened.
    second = await gate.start("after the break")
    outcome = await gate.step(second, Decision.tool_call("read", '{"path": "a"}'))
    assert outcome.observation is not None and outcome.observation.kind == "result"
    assert gate.store.verify_chain().ok
    assert [event.type for event in gate.store.list_events(first)][:1] == ["run_started"]
    gate.store.close()


async def test_a_read_only_store_stays_read_only_on_the_connection_it_opens_again(
    url: str,
) -> None:
    gate = Gate(open_store(url), [RecordingTool("read", SideEffect.READ_ONLY)])
    run_id = await gate.start("written before")
    gate.store.close()
    reader = open_store(url, read_only=True)
    assert _end_sessions(url) == 1
    assert reader.get_run(run_id).goal == "written before"
    (setting,) = reader._query("SHOW default_transaction_read_only")[0]
    assert setting == "on"
    reader.close()


def test_a_write_the_break_cut_is_not_written_and_the_next_write_is(url: str) -> None:
    store = open_store(url)
    with (
        pytest.raises(
            StoreError,
            match=r"^the connection to database postgresql://.* broke during a write; "
            r"nothing of it was written$",
        ),
        store.transaction() as connection,
    ):
        connection.execute("INSERT INTO extensions (name, version) VALUES ('cut', 1)")
        assert _end_sessions(url) == 1
        connection.execute("INSERT INTO extensions (name, version) VALUES ('cut too', 2)")
    # Nothing of the cut write stands, and nothing of it went on on the new connection.
    assert store._query("SELECT name FROM extensions WHERE name LIKE 'cut%'") == []
    with store.transaction() as connection:
        connection.execute("INSERT INTO extensions (name, version) VALUES ('after', 3)")
    assert [tuple(row) for row in store._query(
        "SELECT name, version FROM extensions WHERE name = 'after'"
    )] == [("after", 3)]  # fmt: skip
    store.close()


def test_a_write_whose_connection_was_found_broken_elsewhere_is_never_committed(
    url: str,
) -> None:
    import psycopg

    store = open_store(url)
    # The transaction's COMMIT is refused, not sent on a new connection.
    with (
        pytest.raises(StoreError, match=r"broke during a write; nothing of it was written$"),
        store.transaction() as connection,
    ):
        connection.execute("INSERT INTO extensions (name, version) VALUES ('found', 1)")
        assert _end_sessions(url) == 1
        # Something other than the store's statements finds the break first (psycopg
        # then knows the connection is broken before the store sends its COMMIT).  (A
        # write's statements go out in pipeline mode: reading the answer finds it.)
        raw = store._connection._connection  # type: ignore[union-attr]
        with pytest.raises(psycopg.OperationalError):
            raw.execute("SELECT 1").fetchone()
        # The session's end can be read as its FATAL message before libpq sees the socket
        # close (a loaded machine), and the aborted pipeline then sends nothing more: read
        # the socket itself until libpq sees its end.
        deadline = time.monotonic() + 10
        while not raw.broken and time.monotonic() < deadline:
            with contextlib.suppress(psycopg.OperationalError):
                raw.pgconn.consume_input()
            time.sleep(0.02)
        assert raw.broken
    assert store._query("SELECT name FROM extensions WHERE name = 'found'") == []
    store.close()


def test_a_commit_whose_answer_the_break_took_is_reported_unknown_not_failed(url: str) -> None:
    store = open_store(url)
    # A deferred trigger that ends its own session runs inside COMMIT: the break then
    # takes COMMIT's answer, as a server dying mid-commit would.
    with _superuser(url) as admin:
        admin.execute(
            "CREATE FUNCTION end_own_session() RETURNS trigger LANGUAGE plpgsql AS $$"
            " BEGIN PERFORM pg_terminate_backend(pg_backend_pid()); RETURN NULL; END $$"
        )
        admin.execute(
            "CREATE CONSTRAINT TRIGGER ends_at_commit AFTER INSERT ON extensions"
            " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW"
            " WHEN (NEW.name = 'at commit') EXECUTE FUNCTION end_own_session()"
        )
    with (
        pytest.raises(
            StoreError,
            match=r"^the connection to database postgresql://.* broke before its COMMIT was "
            r"answered; whether the write was kept is unknown$",
        ),
        store.transaction() as connection,
    ):
        connection.execute("INSERT INTO extensions (name, version) VALUES ('at commit', 1)")
    # The store goes on with a new connection.
    with store.transaction() as connection:
        connection.execute("INSERT INTO extensions (name, version) VALUES ('next', 2)")
    names = {row[0] for row in store._query("SELECT name FROM extensions")}
    assert "next" in names
    store.close()


@pytest.mark.timeout(120)
async def test_a_store_waits_out_a_server_restart_one_sentence_a_write_meanwhile(
    tmp_path: Path, private_postgres: Any
) -> None:
    url = private_postgres.database()
    gate = Gate(open_store(url), [RecordingTool("read", SideEffect.READ_ONLY)])
    before = await gate.start("before the restart")
    private_postgres.halt()
    with pytest.raises(StoreError, match=r"^database postgresql://.* cannot be reached: "):
        await gate.start("while the server is down")
    with pytest.raises(StoreError, match=r"^database postgresql://.* cannot be reached: "):
        gate.store.get_run(before)
    private_postgres.start()
    after = await gate.start("after the restart")
    await gate.step(after, Decision.tool_call("read", '{"path": "a"}'))
    assert gate.store.get_run(before).goal == "before the restart"
    assert [run.goal for run in gate.store.list_runs()] == [
        "after the restart", "before the restart"
    ]  # fmt: skip
    assert gate.store.verify_chain().ok
    gate.store.close()


# -- this host's head anchor ----------------------------------------------------


async def _start_runs(url: str, *goals: str) -> None:
    gate = Gate(open_store(url), [RecordingTool("read", SideEffect.READ_ONLY)])
    for goal in goals:
        await gate.start(goal)
    gate.store.close()


def _restore(server: Any, database: str, backup: str) -> None:
    """Put the database back as its backup (a copy made with `CREATE DATABASE … TEMPLATE`)."""
    server.admin(f"DROP DATABASE {database}")
    server.admin(f"CREATE DATABASE {database} TEMPLATE {backup}")


async def test_a_restored_older_backup_is_refused_by_a_host_that_wrote_after_it(
    postgres_server: Any,
) -> None:
    from agentrt.store import postgres_anchor_path

    url = str(postgres_server.database())
    database = url.rsplit("/", 1)[1]
    gate = Gate(open_store(url), [RecordingTool("read", SideEffect.READ_ONLY)])
    for number in range(3):
        await gate.start(f"before the backup {number}")
    gate.store.close()
    backup = "b_" + uuid.uuid4().hex[:16]
    postgres_server.admin(f"CREATE DATABASE {backup} TEMPLATE {database}")  # the backup
    gate = Gate(open_store(url), [RecordingTool("read", SideEffect.READ_ONLY)])
    after = await gate.start("after the backup")
    await gate.step(after, Decision.tool_call("read", '{"path": "a"}'))
    head_seq, head_hash = gate.store.head()
    gate.store.close()
    anchor = Path(postgres_anchor_path(open_store(url, read_only=True).path))
    assert anchor.exists() and f'"seq": {head_seq}' in anchor.read_text()
    # The database is restored from the backup: the run after it and its call are gone.
    _restore(postgres_server, database, backup)
    with pytest.raises(
        UnsafeDatabase,
        match=rf"^database postgresql://.*/{database} ends at event \d+ \(\w+\) but its anchor "
        rf"records event {head_seq} \({head_hash[:16]}\): committed events were lost \(an older "
        r"backup restored, or the database emptied or recreated; if it was reset on purpose, "
        r"remove .*\.anchor to start afresh\), and calls that ran could run again$",
    ):
        open_store(url)
    # Read-only, the loss is reported (as `agentrt verify` reports it), and nothing was written.
    reader = open_store(url, read_only=True)
    report = reader.check_anchor()
    assert not report.ok and report.anchor_seq == head_seq and report.head_seq < head_seq
    assert [run.goal for run in reader.list_runs()] == [
        f"before the backup {number}" for number in (2, 1, 0)
    ]
    reader.close()
    # Removing this host's anchor is how an operator who reset it on purpose starts afresh.
    anchor.unlink()
    fresh = open_store(url)
    assert fresh.check_anchor().ok
    fresh.close()


async def test_a_restored_backup_of_an_earlier_schema_is_refused_before_it_is_migrated(
    postgres_server: Any,
) -> None:
    import psycopg

    url = str(postgres_server.database())
    database = url.rsplit("/", 1)[1]
    await _start_runs(url, "before the backup")
    backup = "b_" + uuid.uuid4().hex[:16]
    postgres_server.admin(f"CREATE DATABASE {backup} TEMPLATE {database}")
    with psycopg.connect(postgres_server.url(backup), autocommit=True) as raw:
        # As the build before schema 3 left it.
        raw.execute("CREATE INDEX runs_by_status ON runs (status)")
        raw.execute("UPDATE agentrt_schema SET version = 2")
    await _start_runs(url, "after the backup")
    _restore(postgres_server, database, backup)
    with pytest.raises(UnsafeDatabase, match=r"committed events were lost \(an older backup"):
        open_store(url)
    # Refused as it stands: not migrated to this build's schema first.
    with psycopg.connect(url) as raw:
        assert raw.execute("SELECT version FROM agentrt_schema").fetchall() == [(2,)]
        assert raw.execute("SELECT 1 FROM pg_indexes WHERE indexname = 'runs_by_status'").fetchall()


async def test_a_database_emptied_and_recreated_under_the_same_url_is_refused(
    postgres_server: Any,
) -> None:
    url = str(postgres_server.database())
    database = url.rsplit("/", 1)[1]
    await _start_runs(url, "a run")
    postgres_server.admin(f"DROP DATABASE {database}")
    postgres_server.admin(f"CREATE DATABASE {database}")
    with pytest.raises(
        UnsafeDatabase,
        match=r"^database postgresql://.* holds no agentrt schema but its anchor \(.*\.anchor\) "
        r"records event 1: the database was emptied or recreated, and calls that ran could run "
        r"again; if it was reset on purpose, remove .*\.anchor to start afresh$",
    ):
        open_store(url)
    # Refused before anything was written into it: it still holds no table.
    assert _tables(url) == 0


def _tables(url: str) -> int:
    with _superuser(url) as admin:
        row = admin.execute("SELECT COUNT(*) FROM pg_tables WHERE schemaname = 'public'")
        return int(row.fetchone()[0])


def test_the_anchor_directory_and_those_made_on_the_way_are_private_under_umask_000(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "state" / "agentrt" / "anchors"
    monkeypatch.setenv("AGENTRT_ANCHOR_DIR", str(directory))
    previous = os.umask(0)
    try:
        open_store(url).close()
    finally:
        os.umask(previous)
    for made in (tmp_path / "state", tmp_path / "state" / "agentrt", directory):
        assert stat.S_IMODE(made.stat().st_mode) == 0o700, made
    (anchor,) = directory.iterdir()
    assert stat.S_IMODE(anchor.stat().st_mode) == 0o600


def test_a_host_whose_anchor_directory_cannot_be_made_is_told_how_to_set_one(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "a file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("AGENTRT_ANCHOR_DIR", str(blocker / "anchors"))
    with pytest.raises(
        StoreError,
        match=r"^database postgresql://.*: the head anchor directory .*anchors cannot be "
        r"created \(Not a directory\); set AGENTRT_ANCHOR_DIR to a directory of this user's$",
    ):
        open_store(url)
    assert _tables(url) == 0  # refused before the schema was written
    # A file where the directory itself should be is refused the same way.
    monkeypatch.setenv("AGENTRT_ANCHOR_DIR", str(blocker))
    with pytest.raises(StoreError, match=r"anchor directory .* cannot be created \(File exists\)"):
        open_store(url)
    assert _tables(url) == 0
