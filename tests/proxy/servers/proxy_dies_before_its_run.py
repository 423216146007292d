"""`agentrt proxy`, killed at one exact moment: after a call's index row is
committed and before its run is started.  This build writes a new call's row
and run in one commit, so the window exists only in a database an earlier
build wrote (row first, run in a commit of its own) — which is how this
helper writes it.  The process dies as `kill -9` would: no cleanup, no
release of the row's hold.

    python proxy_dies_before_its_run.py proxy --config FILE
"""

from __future__ import annotations

import os
import sys
from typing import Any

from agentrt.cli import cli
from agentrt.gate import Gate


async def _die_before_the_run_starts(self: Gate, *args: Any, **kwargs: Any) -> str:
    sys.stderr.write("proxy_dies_before_its_run: dying between the index row and the run\n")
    sys.stderr.flush()
    os._exit(9)


async def _row_then_run(
    self: Gate,
    goal: str,
    decision: Any,
    *,
    run_id: str,
    metadata: Any = None,
    admit: Any,
    on_end: Any = None,
    context: Any = None,
    principal: Any = None,
    scope: Any = None,
) -> Any:
    """The order of a build before group commit: the index row in a commit of its own."""
    admitted, value = await self.store.write(admit)
    if not admitted:
        return value, None
    await self.start(goal, run_id=run_id, metadata=metadata)
    raise AssertionError("unreachable: start dies")


Gate.start = _die_before_the_run_starts  # type: ignore[method-assign]
Gate.start_and_step = _row_then_run  # type: ignore[method-assign]

if __name__ == "__main__":
    cli(sys.argv[1:], prog_name="agentrt")
