"""Signed checkpoints: `agentrt checkpoint --key --log` and `agentrt verify --key
--checkpoints`, with real Ed25519 keys made by `openssl genpkey`, on databases the real
Gate wrote; every refusal leaves the database, the log and the chain as they were."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cli_support import Produced, produce
from click.testing import CliRunner, Result

from agentrt import open_store
from agentrt.cli import cli
from agentrt.store import GENESIS_HASH, event_hash
from agentrt.store._anchor import _write_anchor


def make_key(directory: Path, name: str = "operator", algorithm: str = "ed25519") -> Path:
    """A real key pair as an operator makes one: `openssl genpkey`, then `openssl pkey -pubout`;
    the private key owner-only.  Returns the private key's path (`<name>.pub` is the public)."""
    private = directory / f"{name}.key"
    subprocess.run(
        ["openssl", "genpkey", "-algorithm", algorithm, "-out", str(private)],
        check=True,
        capture_output=True,
    )
    private.chmod(0o600)
    subprocess.run(
        ["openssl", "pkey", "-in", str(private), "-pubout", "-out", str(directory / f"{name}.pub")],
        check=True,
        capture_output=True,
    )
    return private


class World:
    """A produced database, a key pair, a log path, and the command run against them."""

    def __init__(self, produced: Produced, directory: Path) -> None:
        self.produced = produced
        self.database = str(produced.database)
        self.key = make_key(directory)
        self.public = directory / "operator.pub"
        self.log = directory / "checkpoints.log"

    def run(self, *args: str) -> Result:
        return CliRunner().invoke(cli, ["--db", self.database, *args])

    def checkpoint(self, key: Path | None = None) -> Result:
        return self.run("checkpoint", "--key", str(key or self.key), "--log", str(self.log))

    def verify(self, *extra: str, keys: tuple[Path, ...] = ()) -> Result:
        arguments = [part for key in (keys or (self.public,)) for part in ("--key", str(key))]
        return self.run("verify", *arguments, "--checkpoints", str(self.log), *extra)

    def verify_json(self, *extra: str) -> dict[str, Any]:
        result = self.run(
            "--json", "verify", "--key", str(self.public), "--checkpoints", str(self.log), *extra
        )
        return dict(json.loads(result.output.splitlines()[0]))

    def events(self) -> list[tuple[Any, ...]]:
        with _connect(self.database) as connection:
            return [tuple(row) for row in connection.execute(_ALL_EVENTS).fetchall()]

    def start_a_run(self) -> None:
        """A run through the real Gate after the checkpoints (more events for the tail)."""
        produce(self.produced.database, self.produced.sandbox)

    def rewrite(self, seq: int) -> None:
        """What a forger holding the database but not the key does: change event `seq`,
        recompute every hash after it and move the head anchor along."""
        rewrite_consistently(self.database, seq)


_ALL_EVENTS = (
    "SELECT seq, run_id, type, payload, created_at, prev_hash, hash FROM events ORDER BY seq"
)


class _connect:
    """A raw connection to either backend, as a forger with the database would use."""

    def __init__(self, database: str) -> None:
        self.database = database
        self.postgres = database.startswith("postgresql://")

    def __enter__(self) -> Any:
        if self.postgres:
            import psycopg

            self.connection: Any = psycopg.connect(self.database, autocommit=True)
            # The owner of the database can switch off its append-only trigger.
            self.connection.execute("SET session_replication_role = replica")
        else:
            self.connection = sqlite3.connect(self.database, isolation_level=None)
        return self

    def execute(self, sql: str, parameters: tuple[Any, ...] = ()) -> Any:
        if self.postgres:
            sql = sql.replace("?", "%s")
        return self.connection.execute(sql, parameters)

    def __exit__(self, *exc_info: object) -> None:
        self.connection.close()


def rewrite_consistently(database: str, seq: int) -> None:
    with _connect(database) as connection:
        rows = connection.execute(_ALL_EVENTS).fetchall()
        prev_hash = GENESIS_HASH
        for row_seq, run_id, type_, payload, created_at, _, _ in rows:
            if row_seq == seq:
                document = json.loads(payload)
                document["forged"] = True
                payload = json.dumps(document, sort_keys=True, separators=(",", ":"))
                connection.execute("UPDATE events SET payload = ? WHERE seq = ?", (payload, seq))
            digest = event_hash(prev_hash, row_seq, run_id, type_, payload, created_at)
            if row_seq >= seq:
                connection.execute(
                    "UPDATE events SET prev_hash = ?, hash = ? WHERE seq = ?",
                    (prev_hash, digest, row_seq),
                )
            prev_hash = digest
        last = rows[-1][0]
    store = open_store(database, read_only=True, create=False)
    try:
        assert store.anchor_path is not None
        _write_anchor(store.anchor_path, last, prev_hash)
    finally:
        store.close()


@pytest.fixture
def world(database: str | Path, tmp_path: Path) -> World:
    return World(produce(database, tmp_path / "sandbox"), tmp_path)


@pytest.fixture
def sqlite_world(tmp_path: Path) -> World:
    return World(produce(tmp_path / "runs.db", tmp_path / "sandbox"), tmp_path)


def _unchanged(world: World) -> Callable[[], None]:
    """A check that the database's events and the log are as they are now."""
    events = world.events()
    log = world.log.read_bytes() if world.log.exists() else None

    def check() -> None:
        assert world.events() == events
        assert (world.log.read_bytes() if world.log.exists() else None) == log

    return check


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
    unchanged = _unchanged(world)
    world.key.chmod(0o640)
    result = world.checkpoint()
    assert result.exit_code == 1
    assert "private key" in result.output and "is not owner-only (mode 0640" in result.output
    unchanged()
    assert not world.log.exists()


def test_a_key_that_is_not_ed25519_is_refused(sqlite_world: World, tmp_path: Path) -> None:
    world = sqlite_world
    unchanged = _unchanged(world)
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
    unchanged = _unchanged(world)
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
    unchanged = _unchanged(world)
    result = world.checkpoint()
    assert result.exit_code == 1
    assert f"the chain is broken at event {target}" in result.output
    assert "so its head is not signed" in result.output
    unchanged()
