"""Signed checkpoints: `agentrt checkpoint --key --log` and `agentrt verify --key
--checkpoints`, with real Ed25519 keys made by `openssl genpkey`, on databases the real
Gate wrote; every refusal leaves the database, the log and the chain as they were."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest
from cli_support import produce
from click.testing import CliRunner
from retention_support import World, make_key, unchanged_check

from agentrt.cli import cli
from agentrt.store import GENESIS_HASH, event_hash
from agentrt.store._anchor import _write_anchor


@pytest.fixture
def world(database: str | Path, tmp_path: Path) -> World:
    return World(produce(database, tmp_path / "sandbox"), tmp_path)


@pytest.fixture
def sqlite_world(tmp_path: Path) -> World:
    return World(produce(tmp_path / "runs.db", tmp_path / "sandbox"), tmp_path)


# -- what holds -----------------------------------------------------------------


def test_checkpoints_sign_the_head_and_verify_checks_the_chain_against_them(
    world: World,
) -> None:
    head = len(world.events())
    first = world.checkpoint()
    assert first.exit_code == 0, first.output
    assert first.output.startswith(f"checkpoint 1: event {head}:")
    second = world.checkpoint()
    assert second.exit_code == 0, second.output
    assert second.output.startswith(f"checkpoint 2: event {head + 1}:")
    # Each checkpoint is an event of its own, right after the head it signed.
    events = world.events()
    assert [row[2] for row in events[head:]] == ["checkpoint", "checkpoint"]
    assert [row[1] for row in events[head:]] == ["", ""]
    assert (os.stat(world.log).st_mode & 0o777) == 0o600
    lines = world.log.read_text().splitlines()
    assert [json.loads(line) for line in lines] == [json.loads(row[3]) for row in events[head:]]
    report = world.verify_json()
    assert report["ok"] and report["checkpoints"] == 2 and report["checkpoint_seq"] == head + 1
    assert report["checked"] == head + 2 and report["from_seq"] == 1
    text = world.verify().output
    assert "2 signed checkpoints hold, the last at event" in text
    assert "every row matches its events" in text


def test_a_consistent_rewrite_before_a_checkpoint_is_named_at_that_checkpoint(
    world: World,
) -> None:
    assert world.checkpoint().exit_code == 0
    world.rewrite(3)
    # Without the key's evidence the rewritten chain looks whole (hashes and anchor agree).
    plain = world.run("verify")
    assert plain.exit_code == 0, plain.output
    result = world.verify()
    assert result.exit_code == 1
    signed = len(world.events()) - 1
    assert f"the database contradicts signed checkpoint 1 (event {signed}," in result.output
    assert "rewritten after it was signed" in result.output


def test_the_first_contradicted_checkpoint_is_named(sqlite_world: World) -> None:
    world = sqlite_world
    assert world.checkpoint().exit_code == 0
    first_signed = len(world.events()) - 1
    world.start_a_run()
    assert world.checkpoint().exit_code == 0
    second_signed = len(world.events()) - 1
    world.rewrite(first_signed + 3)  # after checkpoint 1, before checkpoint 2
    result = world.verify()
    assert result.exit_code == 1
    assert f"signed checkpoint 2 (event {second_signed}," in result.output
    assert world.verify_json()["reason"].startswith("the database contradicts signed checkpoint 2")


def test_since_checkpoint_reads_only_the_events_after_the_last_checkpoint(world: World) -> None:
    assert world.checkpoint().exit_code == 0
    world.start_a_run()
    assert world.checkpoint().exit_code == 0
    signed = len(world.events()) - 1
    world.start_a_run()
    head = len(world.events())
    report = world.verify_json("--since-checkpoint")
    assert report["ok"], report
    assert report["from_seq"] == signed + 1 and report["checked"] == head - signed
    text = world.verify("--since-checkpoint").output
    assert f"(from event {signed + 1}, after the last signed checkpoint)" in text
    assert "the tables were not checked (--since-checkpoint)" in text
    # A rewrite before the checkpoint is still named: its signed event no longer matches.
    world.rewrite(2)
    result = world.verify("--since-checkpoint")
    assert result.exit_code == 1 and "contradicts signed checkpoint 1" in result.output


def test_since_checkpoint_finds_a_break_after_the_checkpoint(sqlite_world: World) -> None:
    world = sqlite_world
    assert world.checkpoint().exit_code == 0
    world.start_a_run()
    target = len(world.events())
    with sqlite3.connect(world.database) as connection:
        connection.execute(
            "UPDATE events SET payload = '{\"forged\":true}' WHERE seq = ?", (target,)
        )
    result = world.verify("--since-checkpoint")
    assert result.exit_code == 1
    assert f"the chain is broken at event {target}" in result.output


def test_key_rotation_verifies_with_the_old_and_the_new_public_key(
    sqlite_world: World, tmp_path: Path
) -> None:
    world = sqlite_world
    assert world.checkpoint().exit_code == 0
    new_key = make_key(tmp_path, "next-year")
    assert world.checkpoint(new_key).exit_code == 0
    both = world.verify(keys=(world.public, tmp_path / "next-year.pub"))
    assert both.exit_code == 0, both.output
    only_new = world.verify(keys=(tmp_path / "next-year.pub",))
    assert only_new.exit_code == 1
    assert "line 1 is signed by key" in only_new.output
    assert "which is not one of the public keys given" in only_new.output


def test_a_checkpoint_lost_to_a_crash_after_its_commit_is_written_again(
    sqlite_world: World,
) -> None:
    world = sqlite_world
    assert world.checkpoint().exit_code == 0
    assert world.checkpoint().exit_code == 0
    lines = world.log.read_text().splitlines(keepends=True)
    world.log.write_text(lines[0])  # the second entry never reached the log
    cut = world.verify()
    assert cut.exit_code == 1
    assert "checkpoint event" in cut.output and "has no entry in checkpoint log" in cut.output
    assert world.checkpoint().exit_code == 0
    assert world.log.read_text().splitlines(keepends=True)[:2] == lines
    assert world.verify().exit_code == 0


# -- refusals, each with nothing changed --------------------------------------------


def test_a_private_key_others_can_read_is_refused(sqlite_world: World) -> None:
    world = sqlite_world
    unchanged = unchanged_check(world)
    world.key.chmod(0o640)
    result = world.checkpoint()
    assert result.exit_code == 1
    assert "private key" in result.output and "is not owner-only (mode 0640" in result.output
    unchanged()
    assert not world.log.exists()


def test_a_key_that_is_not_ed25519_is_refused(sqlite_world: World, tmp_path: Path) -> None:
    world = sqlite_world
    unchanged = unchanged_check(world)
    rsa = make_key(tmp_path, "rsa", algorithm="rsa")
    result = world.checkpoint(rsa)
    assert result.exit_code == 1 and "is not an Ed25519 key" in result.output
    unchanged()


def test_a_public_key_others_can_write_is_refused(sqlite_world: World) -> None:
    world = sqlite_world
    assert world.checkpoint().exit_code == 0
    world.public.chmod(0o666)
    result = world.verify()
    assert result.exit_code == 1 and "can be written by others" in result.output


@pytest.mark.parametrize(
    ("forgery", "expected"),
    [
        ("signature", "its signature does not verify"),
        ("statement", "its signature does not verify"),
        ("reorder", "does not follow the line before it"),
        ("remove", "does not follow the line before it"),
        ("cut", "has no entry in checkpoint log"),
        ("torn", "ends in an incomplete line"),
        ("garbage", "is not JSON"),
    ],
)
def test_a_forged_reordered_or_truncated_log_is_refused(
    sqlite_world: World, forgery: str, expected: str
) -> None:
    world = sqlite_world
    for _ in range(3):
        assert world.checkpoint().exit_code == 0
    lines = world.log.read_text().splitlines(keepends=True)
    entries = [json.loads(line) for line in lines]
    if forgery == "signature":
        other = entries[0]["signature"]
        entries[1]["signature"] = other
    elif forgery == "statement":
        entries[1]["statement"]["hash"] = "0" * 64
    if forgery in ("signature", "statement"):
        lines[1] = json.dumps(entries[1], sort_keys=True, separators=(",", ":")) + "\n"
    elif forgery == "reorder":
        lines[1], lines[2] = lines[2], lines[1]
    elif forgery == "remove":
        del lines[1]
    elif forgery == "cut":
        del lines[2]
    elif forgery == "torn":
        lines[2] = lines[2][:40]
    elif forgery == "garbage":
        lines[1] = "not a checkpoint\n"
    world.log.write_text("".join(lines))
    unchanged = unchanged_check(world)
    result = world.verify()
    assert result.exit_code == 1, result.output
    assert expected in result.output
    unchanged()
    if forgery == "cut":
        return  # the chain still holds the entry: the next checkpoint writes it again
    # Nor does the next checkpoint build on a log that does not match its database.
    again = world.checkpoint()
    assert again.exit_code == 1, again.output
    unchanged()
    assert world.run("verify").exit_code == 0


def test_another_databases_log_is_refused_by_checkpoint(
    sqlite_world: World, tmp_path: Path
) -> None:
    world = sqlite_world
    (tmp_path / "other").mkdir()
    other = World(produce(tmp_path / "other.db", tmp_path / "other-sandbox"), tmp_path / "other")
    assert world.checkpoint().exit_code == 0
    before = other.events()
    result = CliRunner().invoke(
        cli,
        ["--db", other.database, "checkpoint", "--key", str(world.key), "--log", str(world.log)],
    )
    assert result.exit_code == 1
    assert "is not database" in result.output and "another database's log" in result.output
    assert other.events() == before


def test_checkpoint_refuses_to_sign_a_broken_tail(sqlite_world: World) -> None:
    world = sqlite_world
    assert world.checkpoint().exit_code == 0
    world.start_a_run()
    target = len(world.events()) - 1
    with sqlite3.connect(world.database) as connection:
        connection.execute(
            "UPDATE events SET payload = '{\"forged\":true}' WHERE seq = ?", (target,)
        )
    unchanged = unchanged_check(world)
    result = world.checkpoint()
    assert result.exit_code == 1
    assert f"the chain is broken at event {target}" in result.output
    assert "so its head is not signed" in result.output
    unchanged()


def test_a_history_rebuilt_without_its_checkpoint_events_is_named(sqlite_world: World) -> None:
    """A forger with the database drops the checkpoint events and renumbers and re-hashes
    everything: the chain and the anchor agree, the log does not."""
    world = sqlite_world
    assert world.checkpoint().exit_code == 0
    world.start_a_run()
    kept = [row for row in world.events() if row[2] != "checkpoint"]
    with sqlite3.connect(world.database) as connection:
        connection.execute("DELETE FROM events")
        prev_hash = GENESIS_HASH
        for seq, (_, run_id, type_, payload, created_at, _, _) in enumerate(kept, start=1):
            digest = event_hash(prev_hash, seq, run_id, type_, payload, created_at)
            connection.execute(
                "INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?)",
                (seq, run_id, type_, payload, created_at, prev_hash, digest),
            )
            prev_hash = digest
    _write_anchor(f"{world.database}.anchor", len(kept), prev_hash)
    assert world.run("verify").exit_code == 0
    result = world.verify()
    assert result.exit_code == 1
    assert "the database contradicts signed checkpoint 1" in result.output
    assert "is missing or differs from the entry in the log" in result.output
