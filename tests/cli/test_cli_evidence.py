"""Evidence: `agentrt evidence RUN -o FILE` (or `--approval ID`) writes one file that
`agentrt verify-evidence FILE` checks with nothing else — the database gone; forged
files (an event skipped, altered, the path cut, the statement or its signature changed,
another key) are refused, each with a sentence."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from cli_support import produce
from click.testing import CliRunner
from retention_support import World, make_key

from agentrt.cli import cli


@pytest.fixture
def world(database: str | Path, tmp_path: Path) -> World:
    return World(produce(database, tmp_path / "sandbox"), tmp_path)


@pytest.fixture
def sqlite_world(tmp_path: Path) -> World:
    return World(produce(tmp_path / "runs.db", tmp_path / "sandbox"), tmp_path)


def _evidence(world: World, path: Path, *selector: str) -> Any:
    return world.run(
        "evidence", *selector, "-o", str(path), "--key", str(world.public), "--log", str(world.log)
    )


def _verify(path: Path, *extra: str) -> Any:
    return CliRunner().invoke(cli, ["verify-evidence", str(path), *extra])


def test_evidence_of_a_run_verifies_offline_with_nothing_else(world: World, tmp_path: Path) -> None:
    assert world.checkpoint().exit_code == 0
    path = tmp_path / "evidence.json"
    written = _evidence(world, path, world.produced.completed_run)
    assert written.exit_code == 0, written.output
    assert (os.stat(path).st_mode & 0o777) == 0o600
    # The auditor has the file and the operator's public key, not the database.
    if isinstance(world.produced.database, Path):
        world.produced.database.unlink()
    auditor = tmp_path / "auditor"
    auditor.mkdir()
    shutil.copy(path, auditor / "evidence.json")
    result = _verify(auditor / "evidence.json", "--key", str(world.public))
    assert result.exit_code == 0, result.output
    assert f"holds: run {world.produced.completed_run}, 6 events (run_started," in result.output
    assert "run_completed), sealed by a checkpoint of event" in result.output


def test_evidence_of_an_approval_names_its_events(world: World, tmp_path: Path) -> None:
    assert world.checkpoint().exit_code == 0
    path = tmp_path / "approval.json"
    written = _evidence(world, path, "--approval", world.produced.approval_id)
    assert written.exit_code == 0, written.output
    report = json.loads(
        CliRunner().invoke(cli, ["--json", "verify-evidence", str(path)]).output.splitlines()[0]
    )
    assert report["ok"] and report["run_id"] == world.produced.waiting_run
    assert report["approval_id"] == world.produced.approval_id
    assert report["run_events"][-1] == "approval_requested"


def test_evidence_of_an_archived_run_is_sealed_by_its_segment(
    sqlite_world: World, tmp_path: Path
) -> None:
    world = sqlite_world
    assert world.checkpoint().exit_code == 0
    archive = tmp_path / "archive"
    archive.mkdir(mode=0o700)
    archived = world.run(
        "archive", "--before", "0s", "--index-window", "0s", "--to", str(archive),
        "--key", str(world.key), "--log", str(world.log),
    )  # fmt: skip
    assert archived.exit_code == 0, archived.output
    path = tmp_path / "archived.json"
    missing = _evidence(world, path, world.produced.completed_run)
    assert missing.exit_code == 1 and "give --archive DIR" in missing.output
    written = _evidence(world, path, world.produced.completed_run, "--archive", str(archive))
    assert written.exit_code == 0, written.output
    result = _verify(path)
    assert result.exit_code == 0, result.output
    assert "sealed by a segment of event" in result.output


def test_a_run_after_the_last_checkpoint_has_no_evidence_yet(
    sqlite_world: World, tmp_path: Path
) -> None:
    world = sqlite_world
    assert world.checkpoint().exit_code == 0
    later = produce(world.produced.database, world.produced.sandbox)
    path = tmp_path / "later.json"
    result = _evidence(world, path, later.completed_run)
    assert result.exit_code == 1
    assert "comes after the last signed checkpoint: run agentrt checkpoint first" in result.output
    assert not path.exists()


@pytest.mark.parametrize(
    ("forgery", "expected"),
    [
        ("skip", "hash path skips from event"),
        ("alter", "does not match its hash: it was altered"),
        ("cut", "ends at event"),
        ("statement", "does not verify with its key"),
        ("signature", "does not verify with its key"),
        ("other_run", "does not begin with run"),
        ("not_json", "is not JSON"),
    ],
)
def test_forged_evidence_is_refused(
    sqlite_world: World, tmp_path: Path, forgery: str, expected: str
) -> None:
    world = sqlite_world
    assert world.checkpoint().exit_code == 0
    path = tmp_path / "evidence.json"
    assert _evidence(world, path, world.produced.completed_run).exit_code == 0
    document = json.loads(path.read_text())
    events = document["events"]
    if forgery == "skip":
        del events[2]
    elif forgery == "alter":
        payload = json.loads(events[1]["payload"])
        payload["tool"] = "delete_everything"
        events[1]["payload"] = json.dumps(payload)
    elif forgery == "cut":
        del events[-1]
    elif forgery == "statement":
        document["anchor"]["statement"]["time"] = "2001-01-01T00:00:00.000000Z"
    elif forgery == "signature":
        document["anchor"]["signature"] = document["anchor"]["signature"][::-1]
    elif forgery == "other_run":
        document["run_id"] = world.produced.hostile_run
    path.write_text("{" if forgery == "not_json" else json.dumps(document))
    result = _verify(path)
    assert result.exit_code == 1, result.output
    assert expected in result.output


def test_evidence_signed_by_another_key_is_refused_against_the_operators(
    sqlite_world: World, tmp_path: Path
) -> None:
    world = sqlite_world
    assert world.checkpoint().exit_code == 0
    path = tmp_path / "evidence.json"
    assert _evidence(world, path, world.produced.completed_run).exit_code == 0
    make_key(tmp_path, "someone-else")
    result = _verify(path, "--key", str(tmp_path / "someone-else.pub"))
    assert result.exit_code == 1
    assert "not the operator's key" in result.output
