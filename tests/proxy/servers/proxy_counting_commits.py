"""`agentrt proxy` with every SQLite COMMIT its connections make counted.

    AGENTRT_TEST_COMMITS=FILE python proxy_counting_commits.py proxy --config FILE

After each COMMIT, FILE holds two totals so far: every COMMIT, and the COMMITs
of transactions that changed a row (only those write the WAL and wait for an
fsync).  Nothing else differs from the installed command.
"""

from __future__ import annotations

import os
import sqlite3
import sys
from pathlib import Path
from typing import Any

from agentrt.cli import cli

_TARGET = Path(os.environ["AGENTRT_TEST_COMMITS"])
_TOTALS = {"commits": 0, "writing": 0}
_connect = sqlite3.connect


def _counting_connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
    connection = _connect(*args, **kwargs)
    seen = [connection.total_changes]

    def trace(statement: str) -> None:
        word = statement.lstrip()[:6].upper()
        if word.startswith("COMMIT"):
            _TOTALS["commits"] += 1
            if connection.total_changes != seen[0]:
                _TOTALS["writing"] += 1
            seen[0] = connection.total_changes
            _TARGET.write_text(f"{_TOTALS['commits']} {_TOTALS['writing']}")
        elif word.startswith("BEGIN"):
            seen[0] = connection.total_changes

    connection.set_trace_callback(trace)
    return connection


sqlite3.connect = _counting_connect  # type: ignore[assignment]

if __name__ == "__main__":
    cli(sys.argv[1:], prog_name="agentrt")
