"""Fixtures of the OAuth tests: a private token directory, and the test authorization server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from oauth_support import OAuthServer, oauth_server


@pytest.fixture(autouse=True)
def state_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test's tokens in its own XDG state directory."""
    home = tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(home))
    return home


@pytest.fixture
def authorization_server() -> Iterator[OAuthServer]:
    with oauth_server() as server:
        yield server
