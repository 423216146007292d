"""Linux only: the parent-death signal, so the kernel kills a server if this process dies.

Split from `_stdio` with the rest of the platform-specific process code
(`_proc_unix`, `_proc_other`), so that `agentrt.mcp` imports where none of it
exists.
"""

from __future__ import annotations

import ctypes
import os
import signal
from collections.abc import Callable
from typing import Final

__all__ = ["parent_death_hook"]

_PR_SET_PDEATHSIG: Final = 1


def _load_prctl() -> Callable[..., int] | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl: Callable[..., int] = libc.prctl
    except (OSError, AttributeError):
        return None
    return prctl


# Resolved once here, never inside the forked child: the child must not load
# a library or allocate while another thread may hold an allocator lock.
_prctl: Final = _load_prctl()


def parent_death_hook(parent_pid: int) -> Callable[[], None] | None:
    """A `preexec_fn` that sets SIGKILL as the child's parent-death signal (None without prctl)."""
    if _prctl is None:
        return None
    prctl = _prctl

    def set_parent_death_signal() -> None:
        # Runs in the child between fork and exec.  The signal is tied to the
        # thread that forked; it survives exec.  If the parent already died
        # before prctl took effect, no signal will ever come: leave now.
        if prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            os._exit(126)
        if os.getppid() != parent_pid:
            os._exit(1)

    return set_parent_death_signal
