"""The temporary directory a test process owns, and the check that the tests leave nothing in it.

Imported by tests/conftest.py before anything else: every pytest process (the xdist
controller and each worker, side by side in the system's temporary directory) makes a directory
of its own, points `TMPDIR` and `tempfile` at it, so everything the tests and the
processes they start create through the usual temporary-file calls lands there, and
removes it when the process exits.  The autouse session fixture `no_temporary_leftovers`
fails the session's last test (an error at its teardown) when the tests left anything
in it, and removes what they left: a leak shows in the run that made it instead of
piling up in /tmp.  pytest's own `tmp_path` directories stay where pytest keeps them
(three sessions' worth, pruned by pytest).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# The system's temporary directory, kept for the xdist workers (they inherit TMPDIR).
_SYSTEM_VARIABLE = "AGENTRT_TEST_SYSTEM_TMP"


def _own_root() -> Path:
    # The system's temporary directory, as this process was given it (an xdist worker is
    # given its controller's: it makes its own beside it, not inside, so that a Unix
    # socket in here, Chromium's or PostgreSQL's, keeps a short path).
    system = os.environ.get(_SYSTEM_VARIABLE) or tempfile.gettempdir()
    os.environ[_SYSTEM_VARIABLE] = system
    # Where pytest keeps tmp_path, as before.
    os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", system)
    root = Path(tempfile.mkdtemp(prefix="agentrt-tests-", dir=system))
    # Tests run as root start PostgreSQL as `nobody`, which must reach its directory in here.
    root.chmod(0o711)
    os.environ["TMPDIR"] = str(root)
    tempfile.tempdir = str(root)
    atexit.register(shutil.rmtree, root, True)
    return root


ROOT = _own_root()


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


@pytest.fixture(scope="session", autouse=True)
def no_temporary_leftovers() -> Iterator[None]:
    """Fails the session when its tests left files or directories in the temporary root."""
    before = set(ROOT.iterdir())
    yield
    left = sorted(set(ROOT.iterdir()) - before)
    for path in left:
        _remove(path)
    assert not left, (
        f"the tests left {len(left)} entries in their temporary directory {ROOT} "
        f"(a test must remove what it creates): {', '.join(path.name for path in left)}"
    )
