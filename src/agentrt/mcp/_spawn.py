"""Starting a stdio server's process, apart from talking to it (issue 36).

A proxy over stdio starts its servers as soon as its configuration is read,
before it imports the rest of what it serves with (decision 0053), so that
a server boots while the proxy loads.  This module is all that start needs
(`subprocess`, the platform's process helpers, the sandbox's command): the
connection's reading and writing (`_stdio`, with anyio and the JSON-RPC
reader) is imported after it.
"""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import threading
from dataclasses import dataclass
from typing import Any, Final

from ..sanitize import sanitize
from . import _proc
from ._connection_errors import MCPConnectionError
from ._handshake import initialize_request, opens_with_initialize
from ._sandbox import sandboxed_command
from ._server import Server

__all__ = [
    "REAP_AFTER_SIGKILL",
    "STDERR_TAIL_BYTES",
    "Spawned",
    "StderrTail",
    "discard_started_early",
    "server_environment",
    "spawn",
    "start_early",
    "taken_early",
]

STDERR_TAIL_BYTES: Final = 4 * 1024
_STDERR_CATCH_UP: Final = 0.5  # seconds an error waits for stderr already written
REAP_AFTER_SIGKILL: Final = 2.0


def server_environment(server: Server) -> dict[str, str]:
    """The exact environment a stdio server gets; nothing else of this process's leaks.

    PATH, HOME and TMPDIR when set here (on Windows the reference runtime's list:
    PATH, PATHEXT, SystemRoot, SystemDrive, ComSpec, TEMP, TMP, USERPROFILE,
    APPDATA, LOCALAPPDATA and HOME), then each `inherit_env` name set
    here, then `env` as written, a later entry replacing an earlier one.
    Proxy variables (HTTP_PROXY and friends) reach the server only when named.
    """
    environment: dict[str, str] = {}
    for name in (*_proc.BASE_VARIABLES, *server.inherit_env):
        value = os.environ.get(name)
        if value is not None:
            environment[name] = value
    for entry in server.env:
        name, _, value = entry.partition("=")
        environment[name] = value
    return environment


class StderrTail:
    """The last `STDERR_TAIL_BYTES` of a server's stderr, drained by a daemon thread."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._buffer = bytearray()
        self._drained = 0
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._drain, name="agentrt-mcp-stderr", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        try:
            while True:
                chunk = os.read(self._fd, 4096)
                if not chunk:
                    return
                with self._changed:
                    self._buffer += chunk
                    self._drained += len(chunk)
                    if len(self._buffer) > STDERR_TAIL_BYTES:
                        del self._buffer[: len(self._buffer) - STDERR_TAIL_BYTES]
                    self._changed.notify_all()
        except OSError:
            return

    def _unread(self) -> int:
        """Bytes the server wrote that the drain has not read yet (0 once the pipe is gone)."""
        return _proc.unread_bytes(self._fd)

    def text(self) -> str:
        """The tail, including what the server wrote before this moment.

        An error is often read before the drain thread has caught up with the
        line the server wrote just before it (a loaded machine): what is
        already in the pipe is waited for, briefly and bounded.
        """
        with self._changed:
            wanted = self._drained + self._unread()
            self._changed.wait_for(
                lambda: self._drained >= wanted or not self._thread.is_alive(),
                _STDERR_CATCH_UP,
            )
            data = bytes(self._buffer)
        return sanitize(data.decode("utf-8", errors="replace").strip())

    async def finish(self, limit: float) -> None:
        """Wait (bounded) for the drain to reach end of file, then release the descriptor."""
        import anyio.to_thread

        await anyio.to_thread.run_sync(self.release, limit)

    def release(self, limit: float) -> None:
        """`finish`, blocking the calling thread."""
        self._thread.join(limit)
        if not self._thread.is_alive():
            os.close(self._fd)
        # Otherwise a process outside the group still holds the pipe; the
        # daemon thread keeps the descriptor until it reads end of file.


@dataclass(slots=True)
class Spawned:
    """A started server's process and the descriptors this side keeps of it."""

    process: subprocess.Popen[bytes]
    stdin_fd: int
    stdout_fd: int
    stderr: StderrTail | None
    # The connection's first request, written at the start (`start_early`), if it was.
    presented: bytes | None = None

    def discard(self) -> None:
        """Kill the server's group and release what this side holds of it (no event loop)."""
        _proc.kill_tree(self.process)
        for fd in (self.stdin_fd, self.stdout_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=REAP_AFTER_SIGKILL)
        if self.stderr is not None:
            self.stderr.release(limit=1.0)


# Servers started before their connection, by `start_early`: keyed by the `Server`'s
# identity, each taken by the first `start_stdio` of that very object.
_STARTED_EARLY: dict[int, tuple[Server, Spawned]] = {}


def start_early(server: Server) -> None:
    """Start a stdio server now, before its connection and before an event loop runs, so
    that it boots while this process imports the rest of what it needs (issue 36); the
    first `start_stdio(server)` of this very object takes it.  One that cannot start is
    not started here: its connection's own start then reports why."""
    if server.command is None or id(server) in _STARTED_EARLY:
        return
    with contextlib.suppress(MCPConnectionError, OSError, ValueError):
        spawned = spawn(server)
        _STARTED_EARLY[id(server)] = (server, spawned)
        spawned.presented = _present(spawned, server)


def _present(spawned: Spawned, server: Server) -> bytes | None:
    """Write the connection's first request (the handshake's `initialize`) the moment the
    server is started, so that it boots and answers while this process loads (issue 36,
    decision 0062); the request, if written whole, else None (the connection sends it)."""
    if not opens_with_initialize(server):
        return None  # "auto" probes first, and waits for the answer to choose
    request = initialize_request(server)
    line = request + b"\n"
    if len(line) > select.PIPE_BUF:
        return None  # a longer write could be cut short
    try:
        written = os.write(spawned.stdin_fd, line)
    except OSError:
        return None  # a full pipe or a server gone: the connection meets it
    # At most PIPE_BUF bytes to a pipe are written whole or not at all.
    return request if written == len(line) else None


def taken_early(server: Server) -> Spawned | None:
    """The server `start_early` started for this very object, now taken; None if none."""
    early = _STARTED_EARLY.pop(id(server), None)
    return early[1] if early is not None and early[0] is server else None


def discard_started_early() -> None:
    """Kill every server `start_early` started that no connection took."""
    while _STARTED_EARLY:
        _, (_, spawned) = _STARTED_EARLY.popitem()
        spawned.discard()


def spawn(server: Server) -> Spawned:
    """Start a stdio server: its own group, the exact environment, the parent-death signal
    set, its pipes non-blocking and owned by this side."""
    assert server.command is not None
    keep_stderr = server.stderr is None
    stderr_target: Any = subprocess.PIPE if keep_stderr else server.stderr
    environment = server_environment(server)
    argv = server.command
    if server.sandbox is not None:
        # Fails closed: no bwrap, no namespaces, no start (see _sandbox).
        argv = sandboxed_command(server.name, server.sandbox, server.command, environment)
    try:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr_target,
            env=environment,
            start_new_session=_proc.NEW_SESSION,
            preexec_fn=_proc.parent_death_hook(os.getpid()),  # why a preexec_fn: ADR 0003
            close_fds=True,
        )
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise MCPConnectionError(
            server.name,
            f'server "{sanitize(server.name)}" could not be started: '
            f"{sanitize(server.command[0])}: {sanitize(reason)}",
        ) from None
    assert process.stdin is not None and process.stdout is not None
    # Own the descriptors; the file objects would otherwise close them on collection.
    stdin_fd = os.dup(process.stdin.fileno())
    stdout_fd = os.dup(process.stdout.fileno())
    process.stdin.close()
    process.stdout.close()
    os.set_blocking(stdin_fd, False)
    os.set_blocking(stdout_fd, False)
    tail = None
    if keep_stderr:
        assert process.stderr is not None
        stderr_fd = os.dup(process.stderr.fileno())
        process.stderr.close()
        tail = StderrTail(stderr_fd)
    return Spawned(process, stdin_fd, stdout_fd, tail)
