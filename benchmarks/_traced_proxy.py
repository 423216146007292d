"""`agentrt proxy`, optionally with its SQLite COMMITs counted.

    python _traced_proxy.py --config FILE

- `BENCH_COMMIT_COUNT=FILE`: each COMMIT on any connection the proxy opens rewrites
  FILE with two totals so far: every COMMIT, and the COMMITs of transactions that
  changed a row (only those write the WAL and wait for fsync).  For counting only;
  never used in a timed pass.
"""

from __future__ import annotations

import os
import sqlite3
import sys
from pathlib import Path
from typing import Any

from agentrt.proxy.__main__ import main

_count_file = os.environ.get("BENCH_COMMIT_COUNT")
_totals = {"commits": 0, "writing": 0}
_connect = sqlite3.connect


def _counting_connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
    connection = _connect(*args, **kwargs)
    seen = [connection.total_changes]
    assert _count_file is not None
    target = Path(_count_file)

    def trace(statement: str) -> None:
        word = statement.lstrip()[:6].upper()
        if word.startswith("COMMIT"):
            _totals["commits"] += 1
            if connection.total_changes != seen[0]:
                _totals["writing"] += 1
            seen[0] = connection.total_changes
            target.write_text(f"{_totals['commits']} {_totals['writing']}")
        elif word.startswith("BEGIN"):
            seen[0] = connection.total_changes

    connection.set_trace_callback(trace)
    return connection


if _count_file:
    sqlite3.connect = _counting_connect  # type: ignore[assignment]

if __name__ == "__main__":
    sys.exit(main())
