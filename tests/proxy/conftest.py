"""Fixtures for the proxy tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from proxy_helpers import ProxySetup, build_setup


@pytest.fixture
async def setup(tmp_path: Path) -> ProxySetup:
    return await build_setup(tmp_path)
