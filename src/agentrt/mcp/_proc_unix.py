"""Unix: a server in a process group of its own, signalled as a group; pipe byte counts."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import termios
from typing import Final

__all__ = ["NEW_SESSION", "kill_tree", "stop_tree", "unread_bytes"]

NEW_SESSION: Final = True
"""Start each server in a session (and process group) of its own."""


def unread_bytes(fd: int) -> int:
    """Bytes waiting in a pipe (0 once it is gone)."""
    try:
        return int.from_bytes(fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"), "little")
    except OSError:
        return 0


def _signal_group(process: subprocess.Popen[bytes], signal_number: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal_number)


def stop_tree(process: subprocess.Popen[bytes]) -> None:
    """Ask the server's whole group to stop (SIGTERM)."""
    _signal_group(process, signal.SIGTERM)


def kill_tree(process: subprocess.Popen[bytes]) -> None:
    """Kill the server's whole group (SIGKILL): nothing it started outlives it."""
    _signal_group(process, signal.SIGKILL)
