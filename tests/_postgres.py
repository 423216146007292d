"""A real PostgreSQL server for the tests: `initdb` in a temporary directory, a Unix
socket only (no TCP), one server per test session (per xdist worker), stopped after it.

`make test` installs Debian's `postgresql` where it is missing; Debian keeps the
server's programs in /usr/lib/postgresql/<version>/bin, off PATH, so they are
looked for there too.  initdb refuses to run as root, so as root the server runs
as the unprivileged `nobody` (through `runuser`), owning only its directory.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import shutil
import sqlite3
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

SUPERUSER = "agentrt"
_RUN_AS = "nobody"


def find_binaries() -> Path | None:
    """The directory holding initdb and pg_ctl, or None when PostgreSQL is not installed."""
    on_path = shutil.which("initdb")
    if on_path is not None and shutil.which("pg_ctl") is not None:
        return Path(on_path).resolve().parent
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda path: int(Path(path).parts[-3]) if Path(path).parts[-3].isdigit() else 0,
    )
    return Path(candidates[-1]).parent if candidates else None


class PostgresServer:
    """One running server in a private directory; `database()` makes a fresh database."""

    def __init__(self, binaries: Path, *, fsync: bool = True) -> None:
        self.binaries = binaries
        self.fsync = fsync
        self.directory = Path(tempfile.mkdtemp(prefix="agentrt-pg-"))
        self.data = self.directory / "data"
        self._as_root = os.geteuid() == 0
        if self._as_root:
            shutil.chown(self.directory, _RUN_AS)
        self._run(
            "initdb", "-D", str(self.data), "-U", SUPERUSER, "--auth=trust", "-E", "UTF8",
            "--no-sync", "--no-instructions",
        )  # fmt: skip
        self.start()
        atexit.register(self.stop)
        self._admin: object | None = None

    def start(self) -> None:
        """Start the server (again, after `halt`)."""
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.directory / "server.log"), "-w",
            "-o", f"-c listen_addresses='' -k {self.directory} -c max_connections=200 "
                  f"-c fsync={'on' if self.fsync else 'off'}",
            "start",
        )  # fmt: skip

    def halt(self) -> None:
        """Stop the server at once, as a crash or a restart would, keeping its data."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def _run(self, program: str, *args: str) -> None:
        command = [str(self.binaries / program), *args]
        if self._as_root:
            command = ["runuser", "-u", _RUN_AS, "--", *command]
        completed = subprocess.run(command, capture_output=True, text=True, check=False)
        if completed.returncode != 0:
            raise RuntimeError(
                f"{program} failed ({completed.returncode}): {completed.stderr or completed.stdout}"
            )

    def url(self, database: str, user: str = SUPERUSER) -> str:
        return f"postgresql://{user}@{quote(str(self.directory), safe='')}/{database}"

    def admin(self, sql: str) -> None:
        """Run one statement as the superuser on the maintenance database."""
        import psycopg

        with psycopg.connect(self.url("postgres"), autocommit=True) as connection:
            connection.execute(sql)

    def database(self) -> str:
        """A new empty database of its own: its URL."""
        name = "t_" + uuid.uuid4().hex[:16]
        self.admin(f"CREATE DATABASE {name}")
        return self.url(name)

    def stop(self) -> None:
        if not self.data.exists():
            return
        with contextlib.suppress(RuntimeError):
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.directory, ignore_errors=True)


_server: PostgresServer | None = None


def server() -> PostgresServer | None:
    """The session's server, started on first use; None when PostgreSQL is not installed.

    Without fsync: it is thrown away after the session, and no test stops it.  With fsync,
    each DROP DATABASE's checkpoint flushed every database the session had made by then
    (seconds, late in a run).  A server a test stops and starts (`private_postgres`) and
    the benchmarks' keep it.
    """
    global _server
    if _server is None:
        binaries = find_binaries()
        if binaries is None:
            return None
        _server = PostgresServer(binaries, fsync=False)
    return _server


class _RawPostgres:
    """A connection around the store (as a tamperer has one): `?` placeholders, autocommit."""

    def __init__(self, url: str) -> None:
        import psycopg

        self._connection = psycopg.connect(url, autocommit=True)

    def execute(self, sql: str, parameters: tuple[object, ...] = ()) -> object:
        return self._connection.execute(sql.replace("?", "%s"), parameters)

    def commit(self) -> None:
        """Autocommit: every statement is already committed."""

    def close(self) -> None:
        self._connection.close()


def raw_connect(database: str | Path) -> Any:
    """A plain connection to a test's database outside the store (autocommit), on either backend."""
    if str(database).startswith("postgresql://"):
        return _RawPostgres(str(database))
    return sqlite3.connect(database, isolation_level=None)
