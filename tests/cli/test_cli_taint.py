"""`agentrt taint list` and `taint clear` without taint: one sentence, nothing recorded."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from agentrt.cli import cli
from agentrt.store import open_store


def _database(tmp_path: Path) -> Path:
    path = tmp_path / "runs.db"
    open_store(path).close()
    return path


def test_taint_list_of_a_database_without_taint_says_so_and_writes_nothing(tmp_path: Path) -> None:
    database = _database(tmp_path)
    before = database.read_bytes()
    result = CliRunner().invoke(cli, ["--db", str(database), "taint", "list"])
    assert result.exit_code == 0, result.output
    assert result.output == "no host session is tainted\n"
    assert database.read_bytes() == before


def test_clearing_a_session_without_taint_is_refused_and_records_nothing(tmp_path: Path) -> None:
    database = _database(tmp_path)
    result = CliRunner().invoke(
        cli, ["--db", str(database), "taint", "clear", "stdio-\x1b[31mnone"]
    )
    assert result.exit_code == 1
    assert "holds no taint" in result.output and "\x1b" not in result.output
    with open_store(database, read_only=True, create=False) as store:
        assert store.head_seq() == 0 and store.verify_chain().ok
