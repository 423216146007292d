"""The platform's process code, chosen once: Linux, other Unix, or neither (Windows).

The reference runtime splits it the same way (`proc_linux`, `proc_unix`,
`proc_other`).  `fcntl` and `termios` are imported by `_proc_unix` alone; where
they do not exist, `_proc_other` is used and `agentrt.mcp` still imports.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Final

__all__ = [
    "BASE_VARIABLES",
    "NEW_SESSION",
    "base_variables",
    "kill_tree",
    "parent_death_hook",
    "stop_tree",
    "unread_bytes",
]

_POSIX_VARIABLES: Final = ("PATH", "HOME", "TMPDIR")
# What a program needs on Windows to find its interpreter and a place to write
# (the reference runtime's list).
_WINDOWS_VARIABLES: Final = (
    "PATH", "PATHEXT", "SystemRoot", "SystemDrive", "ComSpec", "TEMP", "TMP",
    "USERPROFILE", "APPDATA", "LOCALAPPDATA", "HOME",
)  # fmt: skip


def base_variables(platform: str) -> tuple[str, ...]:
    """The variables every stdio server gets when they are set here, on `platform`."""
    return _WINDOWS_VARIABLES if platform == "win32" else _POSIX_VARIABLES


BASE_VARIABLES: Final = base_variables(sys.platform)

try:
    from ._proc_unix import NEW_SESSION, kill_tree, stop_tree, unread_bytes
except ImportError:  # no fcntl or termios (Windows): the import test hides them to prove it
    from ._proc_other import NEW_SESSION, kill_tree, stop_tree, unread_bytes

if sys.platform.startswith("linux"):
    from ._proc_linux import parent_death_hook
else:  # pragma: no cover

    def parent_death_hook(parent_pid: int) -> Callable[[], None] | None:
        """No parent-death signal here: a server outlives a crash until its stdin ends."""
        del parent_pid
        return None
