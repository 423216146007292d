"""The suite's temporary directory (tests/_temporary_root.py): a session whose tests leave
anything in it fails, and nothing it made outlives the session."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).parent

_LEAKING = """
import tempfile

def test_makes_a_directory_and_forgets_it():
    tempfile.mkdtemp(prefix="forgotten-")

def test_makes_a_directory_and_removes_it():
    with tempfile.TemporaryDirectory(prefix="removed-"):
        pass
"""

_TIDY = """
import subprocess, sys, tempfile

def test_a_child_process_removes_what_it_makes():
    subprocess.run([sys.executable, "-c", "import tempfile; tempfile.TemporaryDirectory()"],
                   check=True)
    with tempfile.NamedTemporaryFile():
        pass
"""


def _session(tmp_path: Path, tests: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Run `tests` in a pytest session of their own with the suite's temporary root, the
    system's temporary directory being a fresh one in `tmp_path`."""
    (tmp_path / "test_inner.py").write_text(tests)
    system = tmp_path / "system"
    system.mkdir()
    environment = {
        key: value
        for key, value in os.environ.items()
        if key not in ("AGENTRT_TEST_SYSTEM_TMP", "PYTEST_DEBUG_TEMPROOT", "PYTEST_XDIST_WORKER")
    }
    # Only pytest and the plugin under test: the installed plugins would only cost time.
    environment |= {
        "TMPDIR": str(system), "PYTHONPATH": str(TESTS), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
    }  # fmt: skip
    finished = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "_temporary_root",
         "--basetemp", str(tmp_path / "basetemp"), "--rootdir", str(tmp_path),
         "-c", os.devnull, str(tmp_path / "test_inner.py")],
        capture_output=True, text=True, timeout=60, cwd=tmp_path, env=environment,
    )  # fmt: skip
    return finished, system


@pytest.mark.timeout(120)
def test_a_session_whose_tests_leave_a_temporary_directory_fails_naming_it(
    tmp_path: Path,
) -> None:
    finished, system = _session(tmp_path, _LEAKING)
    output = finished.stdout + finished.stderr
    assert finished.returncode == 1, output
    assert "2 passed, 1 error" in output, output
    assert "left 1 entries in their temporary directory" in output
    assert "forgotten-" in output and "removed-" not in output
    # What the tests left is removed, and so is the session's own directory.
    assert list(system.iterdir()) == []


@pytest.mark.timeout(120)
def test_a_session_whose_tests_remove_what_they_make_passes_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    finished, system = _session(tmp_path, _TIDY)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert list(system.iterdir()) == []
