"""What the retention tests share: real Ed25519 keys from `openssl`, a produced database
with its key and log, and a forger's raw access to either backend."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


def unchanged_check(world: World) -> Callable[[], None]:
    """A check that the database's events and the log are as they are now."""
    events = world.events()
    log = world.log.read_bytes() if world.log.exists() else None

    def check() -> None:
        assert world.events() == events
        assert (world.log.read_bytes() if world.log.exists() else None) == log

    return check
