"""Databases the command must refuse (exit 2, one sentence), and bad usage (exit 2)."""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path

import pytest
from cli_support import Produced
from click.testing import CliRunner

from agentrt.cli import cli
from agentrt.store import SCHEMA_VERSION

_EVERY_DATABASE_COMMAND = (
    ("runs",),
    ("show", "RUN"),
    ("events", "RUN"),
    ("verify",),
    ("approve", "RUN", "--yes"),
    ("reject", "RUN", "--yes"),
    ("cancel", "RUN"),
)


def _commands(produced: Produced) -> list[tuple[str, ...]]:
    return [
        tuple(produced.waiting_run if part == "RUN" else part for part in command)
        for command in _EVERY_DATABASE_COMMAND
    ]


def _one_error_line(output: str) -> str:
    errors = [line for line in output.splitlines() if line.startswith("agentrt: ")]
    assert len(errors) == 1, output
    return errors[0]


def test_a_missing_database_is_refused_and_never_created(
    tmp_path: Path, produced: Produced, run_cli
) -> None:
    missing = tmp_path / "missing.db"
    for command in _commands(produced):
        result = run_cli(*command, database=missing)
        assert result.exit_code == 2, command
        assert _one_error_line(result.output) == f"agentrt: database {missing} does not exist"
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "runs.db",
        "runs.db.anchor",
        "sandbox",
    ]


def test_a_database_others_can_write_is_refused_and_left_alone(
    tmp_path: Path, produced: Produced, run_cli
) -> None:
    shared = tmp_path / "shared.db"
    shutil.copyfile(produced.database, shared)
    os.chmod(shared, 0o666)
    before = shared.read_bytes()
    for command in _commands(produced):
        result = run_cli(*command, database=shared)
        assert result.exit_code == 2, command
        assert "is writable by group or others (mode 0666)" in _one_error_line(result.output)
    assert shared.read_bytes() == before
    assert os.stat(shared).st_mode & 0o777 == 0o666
    assert not Path(f"{shared}-wal").exists()


def test_a_symbolic_link_to_the_database_is_refused(
    tmp_path: Path, produced: Produced, run_cli
) -> None:
    link = tmp_path / "link.db"
    link.symlink_to(produced.database)
    before = produced.database.read_bytes()
    for command in _commands(produced):
        result = run_cli(*command, database=link)
        assert result.exit_code == 2, command
        assert "is a symbolic link" in _one_error_line(result.output)
    assert produced.database.read_bytes() == before
    assert link.is_symlink()


def test_a_database_from_a_newer_build_is_refused(
    tmp_path: Path, produced: Produced, run_cli
) -> None:
    newer = tmp_path / "newer.db"
    shutil.copyfile(produced.database, newer)
    os.chmod(newer, 0o600)
    with sqlite3.connect(newer) as connection:
        connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    before = newer.read_bytes()
    for command in _commands(produced):
        result = run_cli(*command, database=newer)
        assert result.exit_code == 2, command
        assert "is from a newer build of agentrt" in _one_error_line(result.output)
    assert newer.read_bytes() == before


def test_a_file_that_is_not_a_database_is_refused(tmp_path: Path, run_cli) -> None:
    junk = tmp_path / "notes.txt"
    junk.write_text("this is not SQLite\n" * 100)
    os.chmod(junk, 0o600)
    for command in (("runs",), ("verify",), ("cancel", "x")):
        result = run_cli(*command, database=junk)
        assert result.exit_code == 2, command
        assert "not" in _one_error_line(result.output)
    assert junk.read_text() == "this is not SQLite\n" * 100


def test_no_database_given_is_bad_usage(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENTRT_DB", raising=False)
    result = CliRunner().invoke(cli, ["runs"])
    assert result.exit_code == 2
    assert _one_error_line(result.output) == (
        "agentrt: no database given: pass --db PATH, set AGENTRT_DB, or run agentrt init"
    )


def test_agentrt_db_names_the_database(produced: Produced) -> None:
    result = CliRunner().invoke(cli, ["runs"], env={"AGENTRT_DB": str(produced.database)})
    assert result.exit_code == 0, result.output
    assert produced.waiting_run in result.output


def test_bad_usage_exits_2(run_cli) -> None:
    assert run_cli("no-such-command").exit_code == 2
    assert run_cli("runs", "--limit", "0").exit_code == 2
    assert run_cli("runs", "--offset", "-1").exit_code == 2
    assert run_cli("show").exit_code == 2


def test_a_directory_in_place_of_the_database_is_refused(tmp_path: Path, run_cli) -> None:
    directory = tmp_path / "a-directory.db"
    directory.mkdir()
    result = run_cli("runs", database=directory)
    assert result.exit_code == 2
    assert "is not a regular file" in _one_error_line(result.output)
