"""Neither Linux nor Unix (Windows): no process group, no parent-death signal.

As the reference runtime states it: on Windows no group is made and closing a
connection ends only the server itself; a server outlives a crash of this
process until it reads the end of its stdin.  Reading a server's pipes with
`anyio.wait_readable` needs a selector that takes pipes, which Windows does
not have: the stdio transport starts there, and `docs/mcp.md` says what each
platform gets.
"""

from __future__ import annotations

import contextlib
import subprocess
from typing import Final

__all__ = ["NEW_SESSION", "kill_tree", "stop_tree", "unread_bytes"]

NEW_SESSION: Final = False


def unread_bytes(fd: int) -> int:
    """Unknown here: the stderr tail then waits only for what its reader already has."""
    del fd
    return 0


def stop_tree(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
        process.terminate()


def kill_tree(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
        process.kill()
