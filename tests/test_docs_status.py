"""docs/status.md is a claim: every test it names must exist in the suite."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEST_NAME = re.compile(r"`(test_[A-Za-z0-9_]+)`")
DEFINITION = re.compile(r"^\s*(?:async\s+)?def\s+(test_[A-Za-z0-9_]+)\s*\(", re.MULTILINE)


def _defined_tests() -> set[str]:
    names: set[str] = set()
    for path in (ROOT / "tests").rglob("test_*.py"):
        names.update(DEFINITION.findall(path.read_text(encoding="utf-8")))
    return names


def test_every_test_named_in_the_status_table_exists() -> None:
    status = (ROOT / "docs" / "status.md").read_text(encoding="utf-8")
    named = set(TEST_NAME.findall(status))
    assert named, "docs/status.md names no test"
    missing = sorted(named - _defined_tests())
    assert missing == [], f"docs/status.md names tests that do not exist: {missing}"
