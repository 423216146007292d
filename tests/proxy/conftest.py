"""Fixtures for the proxy tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from proxy_helpers import ProxySetup, build_setup


@pytest.fixture
async def setup(tmp_path: Path) -> ProxySetup:
    return await build_setup(tmp_path)


@pytest.fixture
def on_backend(database: str | Path) -> dict[str, Any]:
    """`build_setup` overrides that put the proxy's store on each backend in turn:
    nothing for SQLite (the setup's own file), the database's URL for PostgreSQL."""
    return {"database": database} if isinstance(database, str) else {}
