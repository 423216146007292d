"""Fixtures of the passkey tests: the command's real databases and the inbox's browser."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).parent
for helpers in (HERE, HERE.parent / "cli", HERE.parent / "proxy", HERE.parent / "inbox"):
    if str(helpers) not in sys.path:
        sys.path.append(str(helpers))
