"""Opening a database another process is writing (issue 38, item 4).

A store waits out a busy database until one deadline (30 s, then
`StoreBusy`); opening it — reading the header, the checks, switching to WAL,
migrating, checking the anchor — waits until the same deadline.  Before, the
open path waited one 100 ms attempt, and proxies starting while others wrote
exited "database is locked".  Every test here uses real processes on a real
file: one holding SQLite's write lock, or several opening and writing at once.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import agentrt.store._store
from agentrt import open_store
from agentrt.errors import StoreBusy

pytestmark = pytest.mark.timeout(90)

# Another process holding a lock for argv[2] seconds: the write lock (`BEGIN
# IMMEDIATE`), or an exclusive one (`locking_mode = EXCLUSIVE`) that stops even reads.
_HOLDER = """
import sqlite3, sys, time
connection = sqlite3.connect(sys.argv[1], isolation_level=None)
if sys.argv[3] == "exclusive":
    connection.execute("PRAGMA locking_mode = EXCLUSIVE")
    connection.execute("BEGIN EXCLUSIVE")
else:
    connection.execute("BEGIN IMMEDIATE")
print("held", flush=True)
time.sleep(float(sys.argv[2]))
connection.execute("COMMIT")
"""
LOCKS = ["write", "exclusive"]

# One process opening the database at a wall-clock moment shared with the others,
# then writing: three transactions, each holding the write lock for 0.2 s.
_OPENER = """
import sys, time
from agentrt.store import open_store
database, start_at, name = sys.argv[1], float(sys.argv[2]), sys.argv[3]
time.sleep(max(0.0, start_at - time.time()))
began = time.monotonic()
with open_store(database) as store:
    opened = time.monotonic() - began
    for number in range(3):
        with store.transaction() as connection:
            store.append_event(connection, name, "held", {"number": number})
            time.sleep(0.2)
print(f"opened in {opened:.2f}s", flush=True)
"""


@contextmanager
def _lock_held(database: Path, seconds: float, lock: str) -> Iterator[subprocess.Popen[str]]:
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(database), str(seconds), lock],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        yield holder
    finally:
        holder.kill()
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()


def _database_with_one_event(path: Path) -> None:
    with open_store(path) as store, store.transaction() as connection:
        store.append_event(connection, "r", "first", {})


@pytest.mark.parametrize("lock", LOCKS)
def test_opening_waits_out_another_process_holding_a_lock(tmp_path: Path, lock: str) -> None:
    database = tmp_path / "runs.db"
    _database_with_one_event(database)
    with _lock_held(database, 2.0, lock):
        began = time.monotonic()
        store = open_store(database)
        waited = time.monotonic() - began
    with store:
        with store.transaction() as connection:
            store.append_event(connection, "r", "after the wait", {})
        assert store.head()[0] == 2
        assert store.verify_chain().ok and store.check_anchor().ok
    assert 1.5 < waited < 10.0, f"opened after {waited:.2f}s"


@pytest.mark.parametrize("lock", LOCKS)
def test_opening_gives_up_at_the_busy_deadline_in_one_sentence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lock: str
) -> None:
    # Before, a lock held past one attempt was "database is locked" when writing, and
    # an exclusive one held past 5 s made the file "not a SQLite database".
    database = tmp_path / "runs.db"
    _database_with_one_event(database)
    monkeypatch.setattr(agentrt.store._store, "_BUSY_DEADLINE_S", 0.5)
    with _lock_held(database, 20.0, lock):
        began = time.monotonic()
        with pytest.raises(StoreBusy) as refused:
            open_store(database)
        waited = time.monotonic() - began
    assert str(refused.value) == (
        f"database {database} stayed locked by another process for 0.5s while it was "
        "being opened; nothing was written"
    )
    assert 0.4 < waited < 3.0, f"gave up after {waited:.2f}s"
    # The holder gone, the database opens as it was.
    with open_store(database) as store:
        assert store.head()[0] == 1 and store.check_anchor().ok


@pytest.mark.timeout(120)
def test_processes_opening_one_fresh_file_together_while_others_write_all_succeed(
    tmp_path: Path,
) -> None:
    database = tmp_path / "runs.db"
    # Python and agentrt take a moment to import: all start opening at the same instant,
    # and whoever opens first writes while the others are still opening.
    start_at = time.time() + 3.0
    openers = [
        subprocess.Popen(
            [sys.executable, "-c", _OPENER, str(database), str(start_at), f"opener-{number}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for number in range(6)
    ]
    answers = [opener.communicate(timeout=100) for opener in openers]
    failures = [
        f"opener {number} exited {opener.returncode}: {answer[1].strip().splitlines()[-1:]}"
        for number, (opener, answer) in enumerate(zip(openers, answers, strict=True))
        if opener.returncode != 0
    ]
    assert failures == []
    with open_store(database, read_only=True) as store:
        assert store.head()[0] == 18
        assert store.verify_chain().ok and store.check_anchor().ok
