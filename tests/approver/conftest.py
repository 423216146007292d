"""Fixtures of the approver tests: the core tests' tools, the proxy's and the inbox's helpers."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).parent
# The core tests' small real tools and policies; the proxy's setups and a real MCP host.
for helpers in (HERE.parent, HERE.parent / "cli", HERE.parent / "proxy", HERE.parent / "inbox"):
    if str(helpers) not in sys.path:
        sys.path.append(str(helpers))
