"""`agentrt proxy` whose store gives up on a locked database after 3 s instead of 30 s,
so a test that holds the database waits seconds, not half a minute.  Nothing else
differs from the installed command.

    python proxy_with_short_busy_deadline.py proxy --config FILE
"""

from __future__ import annotations

import sys

import agentrt.store._store
from agentrt.cli import cli

agentrt.store._store._BUSY_DEADLINE_S = 3.0  # type: ignore[misc]  # read by each Store it opens, and opening

if __name__ == "__main__":
    cli(sys.argv[1:], prog_name="agentrt")
