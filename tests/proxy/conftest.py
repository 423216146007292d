"""Fixtures for the proxy tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from proxy_helpers import ProxySetup, build_setup

if TYPE_CHECKING:
    from jwt_issuer import Issuer


@pytest.fixture
async def setup(tmp_path: Path) -> ProxySetup:
    return await build_setup(tmp_path)


@pytest.fixture
def on_backend(database: str | Path) -> dict[str, Any]:
    """`build_setup` overrides that put the proxy's store on each backend in turn:
    nothing for SQLite (the setup's own file), the database's URL for PostgreSQL."""
    return {"database": database} if isinstance(database, str) else {}


@pytest.fixture
def issuer() -> Iterator[Issuer]:
    """The principals tests' authorization server, with alice's and bob's clients."""
    from jwt_issuer import Client, running_issuer

    with running_issuer() as running:
        running.clients["alice-laptop"] = Client("alice-secret", "alice", ("release",))
        running.clients["bob-laptop"] = Client("bob-secret", "bob", ())
        yield running
