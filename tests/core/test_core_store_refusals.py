"""A database that is not ours, or lost what it held, is refused (issue 10, item 5).

Each test builds the bad file for real (an empty file, a foreign SQLite file,
a trigger, a damaged page, a WAL deleted after a `kill -9`, an old copy put
back) and checks that `open_store` refuses it with one sentence and leaves
the file as it found it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import sqlite3
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import anyio
import pytest

from agentrt import Gate, SideEffect, StoreError, UnsafeDatabase, open_store
from agentrt.store import GENESIS_HASH

from .helpers import RecordingTool

REPO = Path(__file__).resolve().parents[2]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _database_with_runs(path: Path, runs: int) -> None:
    """An agentrt database holding `runs` started runs, closed (its WAL checkpointed)."""
    store = open_store(path)
    gate = Gate(store, [RecordingTool("read", SideEffect.READ_ONLY)])
    for number in range(runs):
        anyio.run(gate.start, f"goal {number}")
    store.close()


def _anchor(path: Path) -> dict[str, object]:
    anchored: dict[str, object] = json.loads(Path(f"{path}.anchor").read_text())
    return anchored


def test_an_empty_file_is_refused_not_initialised(tmp_path: Path) -> None:
    database = tmp_path / "runs.db"
    database.touch(mode=0o600)
    with pytest.raises(StoreError, match="is an empty file, not an agentrt database"):
        open_store(database)
    assert database.stat().st_size == 0
    assert sorted(path.name for path in tmp_path.iterdir()) == ["runs.db"]


def test_a_foreign_sqlite_database_is_refused_and_left_alone(tmp_path: Path) -> None:
    database = tmp_path / "notes.db"
    foreign = sqlite3.connect(database)
    foreign.execute("CREATE TABLE notes (text TEXT)")
    foreign.execute("INSERT INTO notes VALUES ('keep me')")
    foreign.commit()
    foreign.close()
    os.chmod(database, 0o600)
    before = _digest(database)
    for read_only in (False, True):
        with pytest.raises(StoreError, match="is a SQLite database but not an agentrt one"):
            open_store(database, read_only=read_only)
    assert _digest(database) == before
    check = sqlite3.connect(database)
    assert check.execute("SELECT name FROM sqlite_master").fetchall() == [("notes",)]
    check.close()


def test_a_file_that_is_not_sqlite_is_refused_and_left_alone(tmp_path: Path) -> None:
    database = tmp_path / "runs.db"
    database.write_text("these are my notes, not a database\n")
    os.chmod(database, 0o600)
    with pytest.raises(StoreError, match="is not a SQLite database"):
        open_store(database)
    assert database.read_text() == "these are my notes, not a database\n"


@pytest.mark.parametrize(
    ("statement", "kind"),
    [
        (
            "CREATE TRIGGER approve_all AFTER INSERT ON approvals BEGIN"
            " UPDATE approvals SET status = 'approved'; END",
            "trigger",
        ),
        ("CREATE VIEW pending AS SELECT * FROM approvals WHERE status = 'pending'", "view"),
    ],
)
def test_a_database_holding_a_trigger_or_a_view_is_refused(
    tmp_path: Path, statement: str, kind: str
) -> None:
    database = tmp_path / "runs.db"
    _database_with_runs(database, 1)
    raw = sqlite3.connect(database)
    raw.execute(statement)
    raw.commit()
    raw.close()
    for read_only in (False, True):
        with pytest.raises(UnsafeDatabase, match=f"holds a {kind} '(approve_all|pending)'"):
            open_store(database, read_only=read_only)


def test_a_damaged_database_is_refused_with_one_sentence(tmp_path: Path) -> None:
    database = tmp_path / "runs.db"
    _database_with_runs(database, 200)
    raw = sqlite3.connect(database)
    page_size = raw.execute("PRAGMA page_size").fetchone()[0]
    pages = raw.execute("PRAGMA page_count").fetchone()[0]
    raw.close()
    assert pages > 4
    with open(database, "r+b") as file:
        # A page in the middle (past the schema on page 1) overwritten with noise.
        file.seek(page_size * (pages // 2))
        file.write(b"\xa5" * page_size)
    with pytest.raises(UnsafeDatabase) as refused:
        open_store(database)
    message = str(refused.value)
    assert "damaged" in message and "restore it from a copy" in message
    assert "\n" not in message


def test_a_new_database_is_created_whole_with_an_owner_only_anchor(tmp_path: Path) -> None:
    database = tmp_path / "runs.db"
    store = open_store(database)
    anchor = Path(f"{database}.anchor")
    assert stat.S_IMODE(anchor.stat().st_mode) == 0o600
    assert _anchor(database) == {"seq": 0, "hash": GENESIS_HASH}
    gate = Gate(store, [RecordingTool("read", SideEffect.READ_ONLY)])
    anyio.run(gate.start, "first")
    anyio.run(gate.start, "second")
    head_seq, head_hash = store.head()
    assert _anchor(database) == {"seq": head_seq, "hash": head_hash} and head_seq == 2
    store.close()
    # No half-made file, no temporary file left beside it.
    assert sorted(path.name for path in tmp_path.iterdir()) == ["runs.db", "runs.db.anchor"]


_CRASH_AFTER_COMMITS = textwrap.dedent(
    """
    import sys, time, anyio
    from agentrt import Gate, SideEffect, ToolSpec, open_store

    class Read:
        spec = ToolSpec("read", "reads", {"type": "object"}, SideEffect.READ_ONLY, 5.0)
        async def call(self, call):
            raise AssertionError("never called")

    store = open_store(sys.argv[1])
    gate = Gate(store, [Read()])
    for number in range(5):
        anyio.run(gate.start, f"goal {number}")
    print("committed", flush=True)
    time.sleep(60)
    """
)


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_wal_deleted_after_a_crash_is_refused_naming_both_heads(tmp_path: Path) -> None:
    database = tmp_path / "runs.db"
    _database_with_runs(database, 2)  # two runs checkpointed into the main file
    environment = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    child = subprocess.Popen(
        [sys.executable, "-c", _CRASH_AFTER_COMMITS, str(database)],
        stdout=subprocess.PIPE,
        env=environment,
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == b"committed"
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=10)
    wal = Path(f"{database}-wal")
    assert wal.stat().st_size > 0  # the five commits are only in the WAL
    wal.unlink()
    Path(f"{database}-shm").unlink(missing_ok=True)
    with pytest.raises(UnsafeDatabase) as refused:
        open_store(database)
    message = str(refused.value)
    assert "ends at event 2" in message and "anchor records event 7" in message
    assert "committed events were lost" in message
    # The refusal wrote nothing: the anchor still names the lost head.
    assert _anchor(database)["seq"] == 7
    with open_store(database, read_only=True) as store:
        report = store.check_anchor()
    assert not report.ok and (report.head_seq, report.anchor_seq) == (2, 7)


def test_an_older_copy_restored_is_refused(tmp_path: Path) -> None:
    database = tmp_path / "runs.db"
    _database_with_runs(database, 1)
    backup = tmp_path / "backup.db"
    shutil.copy2(database, backup)
    _database_with_runs(database, 3)
    shutil.copy2(backup, database)
    with pytest.raises(UnsafeDatabase, match=r"ends at event 1 .* anchor records event 4"):
        open_store(database)


def test_an_older_copy_of_an_earlier_schema_is_refused_as_it_stands(tmp_path: Path) -> None:
    # A backup an earlier build made is refused before this build migrates it: the
    # copy stays exactly as it was restored, for whoever looks into what was lost.
    database = tmp_path / "runs.db"
    _database_with_runs(database, 1)
    backup = tmp_path / "backup.db"
    shutil.copy2(database, backup)
    raw = sqlite3.connect(backup)  # as the build before schema 3 left it
    raw.execute("CREATE INDEX runs_by_status ON runs (status)")
    raw.execute("PRAGMA user_version = 2")
    raw.commit()
    raw.close()
    _database_with_runs(database, 3)
    shutil.copy2(backup, database)
    restored = database.read_bytes()
    with pytest.raises(UnsafeDatabase, match=r"ends at event 1 .* anchor records event 4"):
        open_store(database)
    assert database.read_bytes() == restored
    wal = Path(f"{database}-wal")
    assert not wal.exists() or wal.stat().st_size == 0  # nothing written beside it either
    raw = sqlite3.connect(f"file:{database}?mode=ro", uri=True)
    assert raw.execute("PRAGMA user_version").fetchone()[0] == 2
    assert raw.execute("SELECT 1 FROM sqlite_master WHERE name = 'runs_by_status'").fetchall()
    raw.close()


def test_a_chain_replaced_under_its_anchor_is_refused(tmp_path: Path) -> None:
    database = tmp_path / "runs.db"
    _database_with_runs(database, 2)
    other = tmp_path / "other.db"
    _database_with_runs(other, 3)
    shutil.copy2(other, database)
    with pytest.raises(UnsafeDatabase, match="the chain was replaced"):
        open_store(database)


def test_a_lost_database_is_not_recreated_while_its_anchor_remembers_it(tmp_path: Path) -> None:
    database = tmp_path / "runs.db"
    _database_with_runs(database, 2)
    database.unlink()
    with pytest.raises(
        UnsafeDatabase,
        match=r"does not exist but its anchor \(.*\.anchor\) records event 2: the database was lost"
        r", and calls that ran could run again; if it was reset on purpose, remove .*",
    ):
        open_store(database)
    assert not database.exists()
    Path(f"{database}.anchor").unlink()
    open_store(database).close()  # removing the anchor too is how to start afresh


def test_a_database_whose_anchor_is_missing_gets_one_on_the_next_write_open(
    tmp_path: Path,
) -> None:
    database = tmp_path / "runs.db"
    _database_with_runs(database, 2)
    Path(f"{database}.anchor").unlink()
    with open_store(database, read_only=True) as store:
        report = store.check_anchor()
    assert not report.ok and "has no head anchor" in report.reason
    with open_store(database) as store:
        assert store.check_anchor().ok
    assert _anchor(database)["seq"] == 2


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o722])
def test_a_database_in_a_directory_others_can_write_is_refused(tmp_path: Path, mode: int) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    database = shared / "runs.db"
    _database_with_runs(database, 1)
    os.chmod(shared, mode)
    try:
        with pytest.raises(UnsafeDatabase, match=r"writable by group or others .* sticky bit"):
            open_store(database)
        with pytest.raises(UnsafeDatabase, match="writable by group or others"):
            open_store(shared / "new.db")
        assert not (shared / "new.db").exists()
        # Reading it is still allowed: only a writer's calls could run again.
        open_store(database, read_only=True).close()
        # With the sticky bit (as /tmp has) others cannot delete or rename our file.
        os.chmod(shared, mode | stat.S_ISVTX)
        open_store(database).close()
    finally:
        os.chmod(shared, 0o700)


def test_the_store_connection_does_not_trust_the_schema(tmp_path: Path) -> None:
    with open_store(tmp_path / "runs.db") as store:
        assert store._query("PRAGMA trusted_schema")[0][0] == 0


def test_an_anchor_left_empty_by_a_power_cut_is_rewritten_not_refused(tmp_path: Path) -> None:
    database = tmp_path / "runs.db"
    _database_with_runs(database, 2)
    Path(f"{database}.anchor").write_bytes(b"")
    with open_store(database) as store:
        assert store.check_anchor().ok
    assert _anchor(database)["seq"] == 2
    Path(f"{database}.anchor").write_text("not an anchor")
    with pytest.raises(UnsafeDatabase, match="is not an agentrt anchor"):
        open_store(database)


def test_a_second_store_in_one_process_keeps_the_first_ones_writes_visible(
    tmp_path: Path,
) -> None:
    """The proxy opens a second store on its database (the inbox). Opening it must
    not strip the first connection of its POSIX locks (a plain open()/close() of the
    file does), or another process deletes the WAL under it and never sees its
    later commits: a decision reported as made would not be in the database."""
    import subprocess
    import sys

    path = tmp_path / "runs.db"
    first = open_store(path)
    with first.transaction() as connection:
        first.append_event(connection, "r.1", "test_event", {"n": 1})
    second = open_store(path)
    count_events = (
        "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]);"
        " print(c.execute('SELECT count(*) FROM events').fetchone()[0]); c.close()"
    )

    def seen_elsewhere() -> int:
        done = subprocess.run(
            [sys.executable, "-c", count_events, str(path)],
            capture_output=True, text=True, check=True, timeout=30,
        )  # fmt: skip
        return int(done.stdout)

    assert seen_elsewhere() == 1  # another process opens and closes the database
    with first.transaction() as connection:
        first.append_event(connection, "r.1", "test_event", {"n": 2})
    assert seen_elsewhere() == 2
    assert (tmp_path / "runs.db-wal").exists()
    second.close()
    first.close()


def test_an_existing_database_opens_by_a_relative_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    open_store("runs.db").close()
    with open_store("runs.db", create=False) as store:
        assert store.head_seq() == 0
