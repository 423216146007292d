"""`agentrt proxy`, killed at one exact moment: after a call's index row is
committed and before its run is started (the window a crash, a kill -9 or a
full disk can land in).  The process dies as `kill -9` would: no cleanup, no
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


Gate.start = _die_before_the_run_starts  # type: ignore[method-assign]

if __name__ == "__main__":
    cli(sys.argv[1:], prog_name="agentrt")
