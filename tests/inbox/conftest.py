"""Fixtures for the inbox tests: a database the real Gate wrote, the inbox, and a browser."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).parent
# The command's and the proxy's test helpers: the same real databases and proxy setups.
for helpers in (HERE.parent / "cli", HERE.parent / "proxy"):
    if str(helpers) not in sys.path:
        sys.path.append(str(helpers))

from cli_support import Produced, produce  # noqa: E402
from inbox_support import (  # noqa: E402
    CHROMEDRIVER,
    CHROMIUM,
    FORTY_LINES,
    Browser,
    Inbox,
    start_inbox,
)


@pytest.fixture
def produced(tmp_path: Path) -> Produced:
    return produce(tmp_path / "runs.db", tmp_path / "sandbox", long_content=FORTY_LINES)


@pytest.fixture
def inbox(produced: Produced) -> Iterator[Inbox]:
    running = start_inbox(produced.database)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def browser() -> Iterator[Browser]:
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        pytest.skip(
            "headless Chromium is not installed (/usr/bin/chromium and /usr/bin/chromedriver); "
            "`make test` installs Debian's chromium and chromium-driver"
        )
    opened = Browser()
    try:
        yield opened
    finally:
        opened.close()
