"""`agentrt proxy` with every SQLite COMMIT counted (for the proxy's floor only, never timed).

    python _traced_proxy.py COUNT_FILE --config FILE

Each COMMIT on any connection the proxy opens rewrites COUNT_FILE with the total so far.
"""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path
from typing import Any

_COUNT_FILE = Path(sys.argv.pop(1))
_commits = 0
_connect = sqlite3.connect


def _trace(statement: str) -> None:
    global _commits
    if statement.lstrip().upper().startswith("COMMIT"):
        _commits += 1
        _COUNT_FILE.write_text(str(_commits))


def _counting_connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
    connection = _connect(*args, **kwargs)
    connection.set_trace_callback(_trace)
    return connection


sqlite3.connect = _counting_connect  # type: ignore[assignment]

from agentrt.proxy.__main__ import main  # noqa: E402 - after the patch, on purpose

if __name__ == "__main__":
    sys.exit(main())
