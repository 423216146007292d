"""The temporary directory a test process owns, and the check that the tests leave nothing in it.

Imported by tests/conftest.py before anything else: every pytest process (the xdist
controller and each worker, a worker's nested under its controller's) makes a directory
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

# The controller's directory, inherited by its xdist workers (theirs nest in it).
_PARENT_VARIABLE = "AGENTRT_TEST_TMP"


def _own_root() -> Path:
    parent = os.environ.get(_PARENT_VARIABLE)
    # Where pytest keeps tmp_path, as before (a Unix socket in a tmp_path must stay short).
    os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", tempfile.gettempdir())
    root = Path(
        tempfile.mkdtemp(
            prefix="agentrt-tests-", dir=parent if parent and Path(parent).is_dir() else None
        )
    )
    # Tests run as root start PostgreSQL as `nobody`, which must reach its directory in here.
    root.chmod(0o711)
    os.environ[_PARENT_VARIABLE] = str(root)
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
