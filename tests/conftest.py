"""Shared test configuration: anyio runs async tests on asyncio (a test may ask for trio
by parametrizing `anyio_backend`)."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# tests/_postgres.py, the PostgreSQL server the store-facing tests run on.
sys.path.insert(0, str(Path(__file__).parent))

# This process's own temporary directory, first: what the tests create lands there, and
# a session that leaves anything in it fails (tests/_temporary_root.py).
from _temporary_root import no_temporary_leftovers

# Where stores on PostgreSQL keep this host's head anchors: a directory of the test
# session's (made in its temporary directory, removed with it), inherited by the
# processes the tests start and by the xdist workers.
if "AGENTRT_ANCHOR_DIR" not in os.environ:
    os.environ["AGENTRT_ANCHOR_DIR"] = tempfile.mkdtemp(prefix="agentrt-anchors-")

__all__ = ["no_temporary_leftovers"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[Any]:
    """The session's PostgreSQL server (initdb in a temporary directory, a Unix socket
    only), started on first use and stopped after the session (per xdist worker)."""
    from _postgres import server

    running = server()
    if running is None:
        pytest.skip("PostgreSQL is not installed (make test installs Debian's postgresql)")
    yield running
    running.stop()


@pytest.fixture
def private_postgres() -> Iterator[Any]:
    """A PostgreSQL server of the test's own, which it may stop and start (`halt`, `start`);
    stopped and removed after the test."""
    from _postgres import PostgresServer, find_binaries

    binaries = find_binaries()
    if binaries is None:
        pytest.skip("PostgreSQL is not installed (make test installs Debian's postgresql)")
    server = PostgresServer(binaries)
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> str | Path:
    """Where a store-facing test keeps its store, once per backend: a new SQLite file, or
    a new database of its own on the session's PostgreSQL server."""
    if request.param == "sqlite":
        return tmp_path / "runs.db"
    return str(request.getfixturevalue("postgres_server").database())


# -- the order the files run in ----------------------------------------------------------
#
# `make test` runs the files on two xdist workers (`--dist loadfile`: a file stays on one
# worker).  xdist hands the files out most tests first by default, so the files of one or
# a few slow tests (the conformance suites, a minute and more each) came last and kept one
# worker busy long after the other had finished.  Here the files are handed out in the
# order collected, and collected heaviest first (longest processing time first): a test
# weighs 1, a `slow` one SLOW_WEIGHT, or more in proportion when it is allowed more than
# the usual 120 s (`pytest.mark.timeout`).  Inside a file the order is unchanged; no test,
# fixture or assertion changes.
SLOW_WEIGHT = 40
_USUAL_TIMEOUT = 120.0


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def _weight(item: pytest.Item) -> float:
    if item.get_closest_marker("slow") is None:
        return 1.0
    timeout = item.get_closest_marker("timeout")
    allowed = float(timeout.args[0]) if timeout is not None and timeout.args else _USUAL_TIMEOUT
    return SLOW_WEIGHT * max(1.0, allowed / _USUAL_TIMEOUT)


def _file(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    weights: dict[str, float] = {}
    for item in items:
        weights[_file(item)] = weights.get(_file(item), 0.0) + _weight(item)
    collected = {file: index for index, file in enumerate(weights)}
    items.sort(key=lambda item: (-weights[_file(item)], collected[_file(item)]))
