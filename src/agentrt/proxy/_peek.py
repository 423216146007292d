"""The host's first message over stdio, seen while the servers load, without taking it.

A host sends its first request as soon as it has spawned the proxy, and it
waits in the pipe while the proxy loads its servers. A host of the
2026-07-28 era (Claude Code) is answered by `_modern`, a handshake-era host
by `_dispatch` alone. `_modern` needed the SDK's models (0.5 s of CPU) until
decision 0062; it is now plain JSON too and costs ~10-20 ms to import, which
is still better spent while the servers start. So while they do, a worker
thread looks at what is waiting on stdin — on a pipe with `tee(2)`, which
copies a pipe's bytes into another pipe and leaves them where they were; on
a socket with `MSG_PEEK` — and imports the 2026 front only for a host whose
first message carries that era's envelope. Nothing is read from stdin here:
the front reads every byte exactly as it would have.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import stat
import threading
from collections.abc import Callable
from typing import Final

from ._revision import PROTOCOL_VERSION_META_KEY

__all__ = ["first_bytes", "speaks_2026", "watch_stdin"]

_PEEKED_BYTES: Final = 65536
_SPLICE_F_NONBLOCK: Final = 2


def _tee(fd: int, limit: int) -> bytes | None:
    """Up to `limit` bytes waiting in the pipe `fd`, left in it (Linux `tee(2)`)."""
    import ctypes

    # The process's own symbols, libc's among them (`find_library` would run `ldconfig -p`
    # in a child process while the servers start).
    libc = ctypes.CDLL(None, use_errno=True)
    tee = getattr(libc, "tee", None)
    if tee is None:
        return None
    tee.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_size_t, ctypes.c_uint]
    tee.restype = ctypes.c_ssize_t
    copy_out, copy_in = os.pipe()
    try:
        copied = tee(fd, copy_in, limit, _SPLICE_F_NONBLOCK)
        if copied <= 0:
            return None
        return os.read(copy_out, copied)
    finally:
        os.close(copy_out)
        os.close(copy_in)


def first_bytes(fd: int, limit: int = _PEEKED_BYTES) -> bytes | None:
    """What is waiting on `fd` (a pipe or a socket), without taking it; None when nothing
    is, or when `fd` is neither (a terminal, a file) or cannot be looked at."""
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISFIFO(mode):
            return _tee(fd, limit)
        if stat.S_ISSOCK(mode):
            with socket.socket(fileno=os.dup(fd)) as peer:
                data = peer.recv(limit, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            return data or None
    except (OSError, AttributeError, ValueError):
        return None
    return None


_ENVELOPE_KEY: Final = PROTOCOL_VERSION_META_KEY.encode()


def speaks_2026(data: bytes) -> bool:
    """Whether the first line of `data` names the 2026-07-28 era's protocol version in its
    envelope (a guess that only decides what to import early: the front decides the era)."""
    return _ENVELOPE_KEY in data.split(b"\n", 1)[0]


def watch_stdin(stop: threading.Event, wake: int, on_2026: Callable[[], object]) -> None:
    """Until `stop` is set (and a byte written to `wake`), wait for the host's first bytes
    on stdin and, if they speak the 2026-07-28 era, call `on_2026` once.  Runs in a worker
    thread; returns as soon as it has looked once, or is stopped."""
    while not stop.is_set():
        try:
            readable, _, _ = select.select([0, wake], [], [])
        except (OSError, ValueError):
            return
        if 0 in readable:
            data = first_bytes(0)
            if data is not None and speaks_2026(data):
                with contextlib.suppress(Exception):
                    on_2026()
            return
