"""Archives: `agentrt archive --before --to` moves settled history into signed segments, and
`agentrt verify --archive` reads the segments and the database as one chain — with real
keys, real files and both backends; every refusal leaves the database as it was."""

from __future__ import annotations

import gzip
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from cli_support import Produced, produce
from retention_support import World, unchanged_check

from agentrt.retention import load_private_key, logged_checkpoints
from agentrt.retention._archive import _write_segment
from agentrt.store import archive, open_store


class Archiving(World):
    """A world with an archive directory of this user's."""

    def __init__(self, produced: Produced, directory: Path) -> None:
        super().__init__(produced, directory)
        self.archive = directory / "archive"
        self.archive.mkdir(mode=0o700)

    def archive_now(self, *extra: str) -> Any:
        return self.run(
            "archive", "--before", "0s", "--index-window", "0s", "--to", str(self.archive),
            "--key", str(self.key), "--log", str(self.log), *extra,
        )  # fmt: skip

    def verify_archive(self, *extra: str) -> Any:
        return self.verify("--archive", str(self.archive), *extra)

    def settle(self, produced: Produced) -> None:
        """Cancel the produced waiting run, so nothing holds the archive back."""
        result = self.run("cancel", produced.waiting_run)
        assert result.exit_code == 0, result.output

    def runs(self) -> list[str]:
        with _raw(self.database) as connection:
            return sorted(row[0] for row in connection.execute("SELECT run_id FROM runs"))

    def segments(self) -> list[str]:
        return sorted(os.listdir(self.archive))


class _raw:
    def __init__(self, database: str) -> None:
        self.database = database

    def __enter__(self) -> Any:
        if self.database.startswith("postgresql://"):
            import psycopg

            self.connection: Any = psycopg.connect(self.database, autocommit=True)
        else:
            self.connection = sqlite3.connect(self.database)
        return self.connection

    def __exit__(self, *exc_info: object) -> None:
        self.connection.close()


@pytest.fixture
def world(database: str | Path, tmp_path: Path) -> Archiving:
    return Archiving(produce(database, tmp_path / "sandbox"), tmp_path)


@pytest.fixture
def sqlite_world(tmp_path: Path) -> Archiving:
    return Archiving(produce(tmp_path / "runs.db", tmp_path / "sandbox"), tmp_path)


def _history(world: Archiving) -> Produced:
    """Two rounds of runs, each settled and checkpointed, then a third with a run waiting:
    the archive can take the first two rounds and the first checkpoint with them."""
    world.settle(world.produced)
    assert world.checkpoint().exit_code == 0
    second = produce(world.produced.database, world.produced.sandbox)
    world.settle(second)
    assert world.checkpoint().exit_code == 0
    return produce(world.produced.database, world.produced.sandbox)


# -- what holds -----------------------------------------------------------------


def test_archive_moves_settled_history_into_a_signed_segment_both_verify_as_one_chain(
    world: Archiving,
) -> None:
    third = _history(world)
    before = world.events()
    head = before[-1][0]
    result = world.archive_now()
    assert result.exit_code == 0, result.output
    manifest_name = next(name for name in world.segments() if name.endswith(".manifest"))
    manifest = json.loads((world.archive / manifest_name).read_text())["statement"]
    last = manifest["last_seq"]
    assert manifest["first_seq"] == 1 and manifest["count"] == last
    assert f"archived events 1..{last} ({last} events)" in result.output
    # The segment holds the events exactly as the database held them.
    with gzip.open(world.archive / manifest["file"], "rt") as segment:
        lines = [json.loads(line) for line in segment]
    fields = ("seq", "run_id", "type", "payload", "created_at", "prev_hash", "hash")
    assert [tuple(line[name] for name in fields) for line in lines] == before[:last]
    # The database keeps the rest and an `archived` event carrying the manifest.
    after = world.events()
    assert after[0][0] == last + 1 and after[:-1] == before[last:]
    assert after[-1][2] == "archived" and json.loads(after[-1][3])["statement"] == manifest
    assert third.waiting_run in world.runs() and world.produced.completed_run not in world.runs()
    for name in world.segments():
        assert (os.stat(world.archive / name).st_mode & 0o777) == 0o600
    # The checkpoint of the first round went into the segment: the archive checks it.
    plain = world.run("verify")
    assert plain.exit_code == 0, plain.output
    assert f"(from event {last + 1}: the events before it are archived)" in plain.output
    whole = world.verify_archive()
    assert whole.exit_code == 0, whole.output
    assert f"{last} archived events in 1 signed segment" in whole.output
    assert "2 signed checkpoints hold" in whole.output
    since = world.verify("--since-checkpoint")
    assert since.exit_code == 0, since.output
    without = world.verify()
    assert without.exit_code == 1 and "give --archive DIR" in without.output
    # Life goes on: the waiting run is approved and a new checkpoint is signed.
    approved = world.run("approve", third.waiting_run, "--approval", third.approval_id, "--yes")
    assert approved.exit_code == 0, approved.output
    signed = world.checkpoint()
    assert signed.exit_code == 0, signed.output
    assert world.verify_archive().exit_code == 0
    assert len(world.events()) > len(after) and head < world.events()[-1][0]


def test_a_second_archive_continues_the_first(sqlite_world: Archiving) -> None:
    world = sqlite_world
    third = _history(world)
    assert world.archive_now().exit_code == 0
    world.settle(third)
    assert world.checkpoint().exit_code == 0
    second = world.archive_now()
    assert second.exit_code == 0, second.output
    assert len([name for name in world.segments() if name.endswith(".manifest")]) == 2
    verified = world.verify_archive()
    assert verified.exit_code == 0, verified.output
    assert "in 2 signed segments" in verified.output


def test_the_sqlite_file_shrinks_after_an_archive(sqlite_world: Archiving) -> None:
    world = sqlite_world
    world.settle(world.produced)
    for _ in range(15):
        produced = produce(
            world.produced.database, world.produced.sandbox, long_content="x" * 20_000
        )
        world.settle(produced)
    assert world.checkpoint().exit_code == 0
    size = os.path.getsize(world.database)
    result = world.archive_now()
    assert result.exit_code == 0, result.output
    with sqlite3.connect(world.database) as connection:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    assert os.path.getsize(world.database) < size / 2
    assert world.verify_archive().exit_code == 0


# -- refusals, each with nothing changed --------------------------------------------


def test_the_cut_never_goes_through_a_waiting_run(world: Archiving) -> None:
    # The produced waiting run is the third of three: only the two before it can go.
    assert world.checkpoint().exit_code == 0
    result = world.archive_now()
    assert result.exit_code == 0, result.output
    assert "the cut is a run that is not settled (its first event is 9)" in result.output
    assert world.produced.waiting_run in world.runs()
    unchanged = unchanged_check(world)
    again = world.archive_now()
    assert again.exit_code == 1
    assert "nothing archived: nothing before a run that is not settled" in again.output
    unchanged()
    assert world.verify_archive().exit_code == 0


def test_nothing_after_the_last_checkpoint_is_archived(sqlite_world: Archiving) -> None:
    world = sqlite_world
    unchanged = unchanged_check(world)
    none = world.archive_now()
    assert none.exit_code == 1 and "has no signed checkpoint" in none.output
    unchanged()
    assert world.segments() == []
    world.settle(world.produced)
    assert world.checkpoint().exit_code == 0
    signed = world.events()[-1][0] - 1
    produce(world.produced.database, world.produced.sandbox)  # the unsigned tail
    result = world.archive_now()
    assert result.exit_code == 0, result.output
    assert f"archived events 1..{signed} " in result.output
    assert f"the last signed checkpoint (event {signed})" in result.output


def test_an_archive_directory_others_can_write_is_refused(sqlite_world: Archiving) -> None:
    world = sqlite_world
    assert world.checkpoint().exit_code == 0
    world.archive.chmod(0o777)
    unchanged = unchanged_check(world)
    result = world.archive_now()
    assert result.exit_code == 1
    assert "is owned or writable by someone else (mode 0777)" in result.output
    unchanged()
    assert world.segments() == []


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        ("segment", "does not match its manifest's SHA-256"),
        ("manifest", "its signature does not verify"),
        ("missing", "are in neither the database nor archive"),
        ("renamed", "does not name its own segment"),
    ],
)
def test_a_damaged_or_missing_segment_is_named(
    sqlite_world: Archiving, damage: str, expected: str
) -> None:
    world = sqlite_world
    _history(world)
    assert world.archive_now().exit_code == 0
    (manifest_name,) = [name for name in world.segments() if name.endswith(".manifest")]
    segment_name = manifest_name.replace(".manifest", ".jsonl.gz")
    manifest_path, segment_path = world.archive / manifest_name, world.archive / segment_name
    if damage == "segment":
        data = bytearray(segment_path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        segment_path.write_bytes(bytes(data))
    elif damage == "manifest":
        document = json.loads(manifest_path.read_text())
        document["statement"]["count"] += 1
        manifest_path.write_text(json.dumps(document))
    elif damage == "missing":
        manifest_path.unlink()
        segment_path.unlink()
    elif damage == "renamed":
        manifest_path.rename(world.archive / "segment-000000000001-000000000099.manifest")
    unchanged = unchanged_check(world)
    result = world.verify_archive()
    assert result.exit_code == 1, result.output
    assert expected in result.output
    unchanged()


def test_a_segment_rewritten_and_resigned_without_the_key_is_refused(
    sqlite_world: Archiving, tmp_path: Path
) -> None:
    world = sqlite_world
    _history(world)
    assert world.archive_now().exit_code == 0
    (manifest_name,) = [name for name in world.segments() if name.endswith(".manifest")]
    document = json.loads((world.archive / manifest_name).read_text())
    from retention_support import make_key

    forger = load_private_key(str(make_key(tmp_path, "forger")))
    statement = dict(document["statement"], key=forger.public.id)
    from agentrt.retention._checkpoints import statement_bytes

    document = {"signature": forger.sign(statement_bytes(statement)), "statement": statement}
    (world.archive / manifest_name).write_text(json.dumps(document))
    result = world.verify_archive()
    assert result.exit_code == 1 and "its signature does not verify" in result.output


# -- an archive killed at any point -------------------------------------------------


def test_an_archive_killed_after_writing_its_segment_is_finished_by_the_next_run(
    sqlite_world: Archiving,
) -> None:
    world = sqlite_world
    _history(world)
    store = open_store(world.database)
    try:
        checkpoints = logged_checkpoints(store, str(world.log))
        planned = archive.plan_cut(store, "9999", checkpoints[-1].seq, 1e12)
        assert isinstance(planned, archive.ArchiveCut)
        # As if killed after the segment and its manifest were written, before the commit.
        _write_segment(
            store, load_private_key(str(world.key)), str(world.archive), planned,
            str(checkpoints[-1].statement["database"]),
        )  # fmt: skip
    finally:
        store.close()
    before = world.events()
    assert before[0][0] == 1
    result = world.archive_now()
    assert result.exit_code == 0, result.output
    assert "(an interrupted archive, finished)" in result.output
    after = world.events()
    assert [row[2] for row in after].count("archived") == 1
    assert after[0][0] == planned.last_seq + 1
    assert world.verify_archive().exit_code == 0
    # Nothing twice: a third run finds nothing more to do.
    assert world.archive_now().exit_code == 1
    assert [row[2] for row in world.events()].count("archived") == 1


def test_an_archive_killed_before_its_manifest_is_written_again(sqlite_world: Archiving) -> None:
    world = sqlite_world
    _history(world)
    # A segment with no manifest (killed between the two): not referenced, replaced.
    stale = world.archive / "segment-000000000001-000000000003.jsonl.gz"
    stale.write_bytes(b"partial")
    result = world.archive_now()
    assert result.exit_code == 0, result.output
    assert not stale.exists()
    assert world.verify_archive().exit_code == 0


@pytest.mark.slow
def test_kill_9_in_the_middle_of_an_archive_loses_nothing_and_repeats_nothing(
    sqlite_world: Archiving,
) -> None:
    world = sqlite_world
    world.settle(world.produced)
    for _ in range(40):
        world.settle(produce(world.produced.database, world.produced.sandbox))
    assert world.checkpoint().exit_code == 0
    events_before = world.events()
    command = [
        str(Path(sys.executable).parent / "agentrt"), "--db", world.database, "archive", "--before",
        "0s", "--index-window", "0s", "--to", str(world.archive), "--key", str(world.key),
        "--log", str(world.log),
    ]  # fmt: skip
    killed = 0
    for delay in (0.05, 0.15, 0.3, 0.5, 0.8):
        if world.events()[0][0] != 1:
            break
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        time.sleep(delay)
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
            killed += 1
        process.wait()
    finished = world.archive_now()
    assert finished.exit_code in (0, 1), finished.output
    after = world.events()
    assert [row[2] for row in after].count("archived") == 1
    archived_upto = after[0][0] - 1
    assert after[:-1] == events_before[archived_upto:]
    verified = world.verify_archive()
    assert verified.exit_code == 0, verified.output
    assert killed >= 1


def test_the_inbox_chain_check_starts_where_the_archive_left_the_chain(
    sqlite_world: Archiving,
) -> None:
    from agentrt.inbox._chain import ChainCheck

    world = sqlite_world
    _history(world)
    assert world.archive_now().exit_code == 0
    remaining = world.events()
    with open_store(world.database, read_only=True, create=False) as store:
        report = ChainCheck(store, chunk=7).report()
        assert report.ok, report.reason
        assert (report.head_seq, report.checked) == (remaining[-1][0], len(remaining))
    # The database's first event no longer chaining to the archive is a break, named.
    with sqlite3.connect(world.database) as connection:
        connection.execute(
            "UPDATE events SET prev_hash = ? WHERE seq = ?", ("0" * 64, remaining[0][0])
        )
    with open_store(world.database, read_only=True, create=False) as store:
        broken = ChainCheck(store).report()
        assert not broken.ok and "no archived event accounts for them" in broken.reason


def test_the_archive_keeps_what_the_proxys_index_may_still_read(sqlite_world: Archiving) -> None:
    """A proxied call's index row goes with its archived run; a call not settled, or one
    younger than --index-window, holds the cut back."""
    from agentrt.proxy._index import CallIndex

    world = sqlite_world
    world.settle(world.produced)
    second = produce(world.produced.database, world.produced.sandbox)
    world.settle(second)
    assert world.checkpoint().exit_code == 0
    with open_store(world.database) as store:
        CallIndex(store, "s", "proxy:test", 30.0)  # the proxy's tables, as the proxy makes them
    now = time.time()
    rows = [
        (world.produced.completed_run, 1, now - 7200),  # settled, two hours old
        (second.completed_run, 0, now - 7200),  # not settled: holds the cut back
    ]
    with sqlite3.connect(world.database) as connection:
        for run_id, settled, created in rows:
            connection.execute(
                "INSERT INTO proxy_calls (run_id, session, call_key, tool, mutating, created_at,"
                " settled) VALUES (?, 's', 'k', 'write_note', 1, ?, ?)",
                (run_id, created, settled),
            )
    first_event = {row[1]: row[0] for row in reversed(world.events()) if row[2] == "run_started"}
    # Inside the default window (a day) even the settled call stays.
    held = world.run(
        "archive", "--before", "0s", "--to", str(world.archive),
        "--key", str(world.key), "--log", str(world.log),
    )  # fmt: skip
    assert held.exit_code == 1, held.output
    assert "a proxied call the proxy's index may still read" in held.output
    assert "(its first event is 1)" in held.output
    result = world.run(
        "archive", "--before", "0s", "--index-window", "1h", "--to", str(world.archive),
        "--key", str(world.key), "--log", str(world.log),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert f"(its first event is {first_event[second.completed_run]})" in result.output
    with sqlite3.connect(world.database) as connection:
        indexed = sorted(row[0] for row in connection.execute("SELECT run_id FROM proxy_calls"))
    assert indexed == [second.completed_run]
    assert world.verify_archive().exit_code == 0
