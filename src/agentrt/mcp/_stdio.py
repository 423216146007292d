"""A stdio MCP server as a child process: exact environment, own process group, raw lines.

The server is started with `subprocess.Popen` (not `anyio.open_process`)
because only Popen takes a `preexec_fn`, which sets the Linux parent-death
signal so the kernel kills the server if this process dies first.  What differs
by platform (groups, signals, the parent-death signal, pipe byte counts, the
base environment) is in `_proc` and the modules it chooses from.  Its pipes
are read and written as non-blocking file descriptors through
`anyio.wait_readable`/`wait_writable`, so nothing here needs a background
task: whichever caller is waiting for an answer reads the next line and hands
it to its owner (see `StdioTransport.request`); while no request waits, the
proxy's idle reader takes that part (`StdioTransport.read_idle`), so a
notification sent between requests is handled at once.  Stderr, when kept, is drained
by a daemon thread into a 4 KiB ring, so a chatty server never blocks on a
full pipe.

`aclose` stops the server politely (close stdin, wait, SIGTERM the group,
wait, SIGKILL the group) and then always SIGKILLs the whole group before
reaping the server, so no descendant outlives the connection, even when the
server exited cleanly by itself.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Final

import anyio
import anyio.lowlevel
import anyio.to_thread

from ..sanitize import sanitize
from . import _proc
from ._connection_errors import (
    ConnectionClosed,
    MCPConnectionError,
    MessageTooLong,
    NotSent,
    ProtocolViolation,
)
from ._jsonrpc import (
    Incoming,
    IncomingKind,
    OverlongMessage,
    answer_server_request,
    read_message,
)
from ._server import Server
from ._spawn import (
    REAP_AFTER_SIGKILL,
    STDERR_TAIL_BYTES,
    StderrTail,
    discard_started_early,
    server_environment,
    spawn,
    start_early,
    taken_early,
)

__all__ = [
    "IDLE_MESSAGES_PER_SECOND",
    "IDLE_READ",
    "MAX_LINE_BYTES",
    "STDERR_TAIL_BYTES",
    "StdioTransport",
    "discard_started_early",
    "server_environment",
    "start_early",
    "start_stdio",
]

MAX_LINE_BYTES: Final = 16 * 1024 * 1024
"""One message line from a server; a longer one is discarded to its newline, unread."""


GRACE_AFTER_STDIN_CLOSED: Final = 2.0
GRACE_AFTER_SIGTERM: Final = 2.0
_EXIT_POLL_INTERVAL: Final = 0.01
_EXIT_STATUS_WAIT: Final = 0.5
_WRITE_POLL_INTERVAL: Final = 0.01
_READ_CHUNK: Final = 64 * 1024
_DRAIN_LIMIT: Final = 1024 * 1024

IDLE_READ: Final = 0
"""The request id an idle read names to the listener: no request's (ids start at 1)."""

IDLE_MESSAGES_PER_SECOND: Final = 1000
"""The most messages read in a second while no request waits; a server that floods
more meets a full pipe (it blocks), so the flood costs this process a bounded CPU."""


class IdleBudget:
    """`IDLE_MESSAGES_PER_SECOND`, spent one message at a time: past it, the reader
    sleeps out the second (and leaves the rest in the pipe)."""

    def __init__(self) -> None:
        self._since = anyio.current_time()
        self._spent = 0

    async def spend(self) -> None:
        self._spent += 1
        if self._spent < IDLE_MESSAGES_PER_SECOND:
            await anyio.lowlevel.checkpoint()
            return
        rest = self._since + 1.0 - anyio.current_time()
        if rest > 0:
            await anyio.sleep(rest)
        else:
            await anyio.lowlevel.checkpoint()
        self._since = anyio.current_time()
        self._spent = 0


@dataclass(slots=True)
class _Pending:
    method: str
    message: Incoming | None = None
    failure: MCPConnectionError | None = None


@dataclass(slots=True)
class StdioTransport:
    """Newline-delimited JSON-RPC over a child's stdin and stdout."""

    server: Server
    process: subprocess.Popen[bytes]
    stdin_fd: int
    stdout_fd: int
    stderr: StderrTail | None
    # The first request, already written when the server was started early (`_spawn`):
    # the connection's own first request, which must be exactly it, is then not sent again.
    presented: bytes | None = None
    # Complete lines not yet dispatched, the line still arriving, and, while
    # an over-long line is being discarded, what is kept of its top level.
    _lines: deque[bytes | OverlongMessage] = field(default_factory=deque)
    _queued_bytes: int = 0
    _partial: bytearray = field(default_factory=bytearray)
    _overlong: OverlongMessage | None = None
    _pending: dict[int, _Pending] = field(default_factory=dict)
    _reading: bool = False
    _progress: anyio.Event = field(default_factory=anyio.Event)
    _read_scope: anyio.CancelScope | None = None
    # The idle reader's wait for bytes, cancelled when a request comes to read its own.
    _idle_wait: anyio.CancelScope | None = None
    _write_lock: anyio.Lock = field(default_factory=anyio.Lock)
    _broken: MCPConnectionError | None = None
    _stdin_open: bool = True
    _stdout_open: bool = True
    # The connection's handler of the server's notifications and requests, told the id
    # of the request whose reader read each; None drops notifications.
    listener: Callable[[Incoming, int], Awaitable[None]] | None = None
    _stopping: bool = False
    # False once any caller wants the server gone without the graces.
    _polite: bool = True

    def stderr_tail(self) -> str:
        return self.stderr.text() if self.stderr is not None else ""

    def negotiated(self, protocol_version: str) -> None:
        """Nothing on stdio carries the version after the handshake."""

    def error_status(self, request_id: int) -> int | None:
        """Never: a pipe has no status besides the answer."""
        return None

    def _name(self) -> str:
        return sanitize(self.server.name)

    # -- sending ---------------------------------------------------------------

    async def send(self, message: bytes) -> None:
        """Write one message and its newline; a write cut short breaks the connection.

        Raises `NotSent` when not one byte reached the server: the connection
        was broken before, or the first write failed.
        """
        if self._broken is not None:
            raise self._not_sent(self._broken)
        data = memoryview(message + b"\n")
        written = 0
        async with self._write_lock:
            if self._broken is not None:
                raise self._not_sent(self._broken)
            try:
                while written < len(data):
                    if not self._stdin_open:
                        # Closed while this task waited: the number may name another file now.
                        raise anyio.ClosedResourceError
                    try:
                        written += os.write(self.stdin_fd, data[written:])
                    except BlockingIOError:
                        # A server that writes before it reads would deadlock with us:
                        # its stdout full, its stdin (our write) full.  Keep taking what
                        # it wrote while we wait for room.
                        self._take_available_stdout()
                        with anyio.move_on_after(_WRITE_POLL_INTERVAL):
                            await anyio.wait_writable(self.stdin_fd)
            except (anyio.ClosedResourceError, OSError):
                error = self._break(
                    ConnectionClosed(
                        self.server.name,
                        f'server "{self._name()}" stopped reading its stdin',
                    )
                )
                raise (self._not_sent(error) if written == 0 else error) from None
            except MCPConnectionError as exc:
                # Broken while this write waited (a server that floods without reading).
                if written == 0:
                    raise self._not_sent(exc) from None
                raise
            except BaseException:
                if 0 < written < len(data):
                    # The server now holds half a line; whatever follows would be garbage to it.
                    self._break(
                        ConnectionClosed(
                            self.server.name,
                            f'a message to server "{self._name()}" was cut off mid-write, '
                            "so the connection is closed",
                        )
                    )
                raise

    def _not_sent(self, cause: MCPConnectionError) -> NotSent:
        return NotSent(self.server.name, f"{cause}; the request was not sent")

    def _take_available_stdout(self) -> None:
        """Move whatever stdout holds now into the line buffer, without waiting."""
        took = False
        while self._stdout_open:
            try:
                chunk = os.read(self.stdout_fd, _READ_CHUNK)
            except OSError:  # BlockingIOError included: nothing more for now
                break
            if not chunk:
                break  # end of file: the reader will meet it again
            self._ingest(chunk)
            took = True
            if self._idle_wait is not None:
                self._idle_wait.cancel()  # the lines it waits for are in the buffer now
            if self._queued_bytes + len(self._partial) > 2 * MAX_LINE_BYTES:
                raise self._break(
                    ProtocolViolation(
                        self.server.name,
                        f'server "{self._name()}" wrote more than {2 * MAX_LINE_BYTES} bytes '
                        "without reading its stdin, so the connection is closed",
                    )
                )
        if took and self._read_scope is not None:
            # The reader waits for new bytes; the lines it needs may be in the buffer now.
            self._read_scope.cancel()

    # -- receiving -------------------------------------------------------------

    async def request(
        self,
        request_id: int,
        method: str,
        message: bytes,
        headers: Mapping[str, str] | None = None,
        listen: bool = False,
    ) -> Incoming:
        """Send a request and wait for the message that answers it (`headers` are HTTP's).

        There is no reader task: whichever waiting caller finds nobody reading
        becomes the reader, reads one line, dispatches it (to its own waiter,
        another caller's, or an answer to the server) and wakes everyone.  A
        cancelled reader steps down and another waiter takes over.  After each
        line that did not settle this request the reader yields, so a server
        that keeps the pipe full cannot hold the event loop or outlast a deadline.
        """
        pending = _Pending(method)
        self._pending[request_id] = pending
        if self._idle_wait is not None:
            # The idle reader steps down: this request's waiter reads, so the server's log
            # lines and questions meanwhile are handed to it (`read_by`).
            self._idle_wait.cancel()
        try:
            if not self._was_presented(message):
                await self.send(message)
            while pending.message is None and pending.failure is None:
                if self._broken is not None:
                    raise self._broken
                if self._reading:
                    await self._progress.wait()
                    continue
                self._reading = True
                try:
                    await self._read_and_dispatch_one(request_id)
                finally:
                    self._reading = False
                    self._wake_waiters()
                if pending.message is None and pending.failure is None:
                    # A line already in the buffer or the pipe is read without
                    # awaiting anything; a server flooding notifications would
                    # otherwise keep this loop busy and no deadline could fire.
                    await anyio.lowlevel.checkpoint()
            if pending.failure is not None:
                raise pending.failure
            assert pending.message is not None
            return pending.message
        finally:
            self._pending.pop(request_id, None)
            if not self._pending:
                self._wake_waiters()  # the idle reader, waiting for no request to be open

    def _was_presented(self, message: bytes) -> bool:
        """Whether `message` was written at the server's start (once: the first request)."""
        presented, self.presented = self.presented, None
        if presented is None:
            return False
        if message != presented:
            # Never by construction (`_handshake.initialize_request` writes both); a server
            # that got a request its connection did not make must not be spoken to.
            self._broken = ProtocolViolation(
                self.server.name,
                f'server "{self._name()}" was sent a first request at its start that is not '
                "its connection's first request",
            )
            raise self._broken
        return True

    async def read_idle(self, *, pushes: bool = True) -> str | None:
        """Read and dispatch what the server sends while no request waits, until the
        connection breaks or closes: one reader at a time, as `request` reads (a request
        that comes takes over at once, a line half-read is finished first).  Returns why,
        in one sentence, when this reader met the server's end (it exited, closed its
        stdout, flooded past the buffer), or None when the connection was closed here or
        broke in a request's read.  (`pushes`, what the server advertised, matters only
        over HTTP: a pipe is read whatever it said, so a death is noticed at once.)"""
        budget = IdleBudget()
        while self._broken is None:
            if self._pending or self._reading:
                await self._progress.wait()
                continue
            self._reading = True
            try:
                if not self._lines:
                    with anyio.CancelScope() as scope:
                        self._idle_wait = scope
                        with contextlib.suppress(anyio.ClosedResourceError):
                            await anyio.wait_readable(self.stdout_fd)
                    self._idle_wait = None
                    if scope.cancelled_caught:
                        continue
                if self._pending or self._broken is not None:
                    continue  # a request came while this waited: its own waiter reads
                await self._read_and_dispatch_one(IDLE_READ)
            except MCPConnectionError as exc:
                return None if self._stopping else str(exc)
            finally:
                self._idle_wait = None
                self._reading = False
                self._wake_waiters()
            await budget.spend()
        return None

    def _wake_waiters(self) -> None:
        progress, self._progress = self._progress, anyio.Event()
        progress.set()

    async def _read_and_dispatch_one(self, read_by: int) -> None:
        line = await self._read_line()
        if line is None:
            return
        if isinstance(line, OverlongMessage):
            self._fail_overlong(line)
            return
        message = read_message(line)
        if message.kind is IncomingKind.REQUEST:
            if self.listener is not None:
                await self.listener(message, read_by)  # the connection answers it
            else:
                await self.send(answer_server_request(message))
        elif message.kind in (IncomingKind.RESPONSE, IncomingKind.BAD_RESPONSE):
            assert message.request_id is not None
            pending = self._pending.get(message.request_id)
            if pending is None:
                return  # an answer to a request already given up on
            if message.kind is IncomingKind.BAD_RESPONSE:
                pending.failure = ProtocolViolation(
                    self.server.name,
                    f'server "{self._name()}" answered {pending.method} with a message this '
                    f"client refuses: {sanitize(message.problem)}",
                )
            else:
                pending.message = message
        elif message.kind is IncomingKind.NOTIFICATION and self.listener is not None:
            await self.listener(message, read_by)
        # Other notifications and lines that are not JSON-RPC are ignored: a reader
        # that crashed on them would hand the server a way to kill the session.

    def _fail_overlong(self, line: OverlongMessage) -> None:
        """Fail the request an over-long line answered; the connection itself stays usable.

        The server did answer, so the request ran; only its answer is lost.
        A line that names no pending request fails nothing: a request whose
        answer it was ends at its own timeout, as an unknown outcome.
        """
        request_id = line.request_id()
        pending = self._pending.get(request_id) if request_id is not None else None
        if pending is None or pending.message is not None or pending.failure is not None:
            return
        pending.failure = MessageTooLong(
            self.server.name,
            f'server "{self._name()}" answered {pending.method} with a message of '
            f"{line.size} bytes, longer than {MAX_LINE_BYTES}; it was discarded unread, "
            "so the request ran but its answer is unknown",
        )

    def _ingest(self, chunk: bytes) -> None:
        """Split bytes from stdout into lines; a line past `MAX_LINE_BYTES` is scanned, not kept."""
        start = 0
        while True:
            newline = chunk.find(b"\n", start)
            piece = chunk[start:] if newline < 0 else chunk[start:newline]
            if self._overlong is not None:
                self._overlong.feed(piece)
            else:
                self._partial += piece
                if len(self._partial) > MAX_LINE_BYTES:
                    # Discarded up to its newline, never parsed: the bytes after a
                    # cut are the rest of this message, not a message of their own.
                    self._overlong = OverlongMessage()
                    self._overlong.feed(bytes(self._partial))
                    self._partial = bytearray()
            if newline < 0:
                return
            if self._overlong is not None:
                self._lines.append(self._overlong)
                self._overlong = None
            else:
                self._lines.append(bytes(self._partial))
                self._queued_bytes += len(self._partial)
                self._partial = bytearray()
            start = newline + 1

    async def _read_line(self) -> bytes | OverlongMessage | None:
        """The next line from stdout, or None when a read was interrupted by `aclose`."""
        while True:
            if self._lines:
                line = self._lines.popleft()
                if isinstance(line, bytes):
                    self._queued_bytes -= len(line)
                return line
            if self._broken is not None:
                raise self._broken
            if not self._stdout_open:
                raise self._break(self._closed_error())
            try:
                chunk = os.read(self.stdout_fd, _READ_CHUNK)
            except BlockingIOError:
                with anyio.CancelScope() as scope:
                    self._read_scope = scope
                    try:
                        await anyio.wait_readable(self.stdout_fd)
                    except anyio.ClosedResourceError:
                        pass
                    finally:
                        self._read_scope = None
                continue
            except OSError:
                chunk = b""
            if not chunk:
                detail = f'server "{self._name()}" closed its stdout'
                # End of file usually means the server is exiting; give it a moment to finish.
                await self._wait_for_exit(_EXIT_STATUS_WAIT)
                status = self._exit_status()
                if status is not None:
                    detail = f'server "{self._name()}" exited ({status})'
                raise self._break(ConnectionClosed(self.server.name, detail))
            self._ingest(chunk)
            if self._overlong is not None:
                # Scanning a long line costs CPU: let the rest of the loop run between chunks.
                await anyio.lowlevel.checkpoint()

    def _break(self, error: MCPConnectionError) -> MCPConnectionError:
        """Mark the connection unusable: every waiting and later request fails with `error`."""
        if self._broken is None:
            self._broken = error
        for pending in self._pending.values():
            if pending.message is None and pending.failure is None:
                pending.failure = self._broken
        if self._read_scope is not None:
            self._read_scope.cancel()
        if self._idle_wait is not None:
            self._idle_wait.cancel()
        self._wake_waiters()
        return self._broken

    def dead(self) -> str | None:
        """Why this session can no longer serve a request (the server exited, the
        connection broke), or None while it can."""
        status = self._exit_status()
        if status is not None:
            return f'server "{self._name()}" exited ({status})'
        if self._broken is not None:
            return str(self._broken)
        return None

    # -- shutting down ---------------------------------------------------------

    async def aclose(self, *, polite: bool = True) -> None:
        """Stop the server and its whole process group; a second call does nothing.

        `polite=False` skips the graces (end of stdin, SIGTERM): for a session
        that is already broken, before the server is started again, or for a
        process whose host is about to kill it.  Called so while a polite stop is
        under way, it cuts what is left of that stop's graces short.
        """
        self._break(self._closed_error())
        if self._stopping:
            self._polite = self._polite and polite
            return
        self._stopping = True
        self._polite = polite
        await self._stop_process()

    async def _stop_process(self) -> None:
        self._close_stdin()
        exited = await self._wait_for_exit(GRACE_AFTER_STDIN_CLOSED, grace=True)
        if not exited and self._polite:
            _proc.stop_tree(self.process)
            exited = await self._wait_for_exit(GRACE_AFTER_SIGTERM, grace=True)
        # Always, even after a clean exit: the server is not reaped yet, so its
        # id still names this group and cannot have been reused; whatever it
        # left behind (a launcher's node process, a daemon) dies with it.
        _proc.kill_tree(self.process)
        if not exited:
            await self._wait_for_exit(REAP_AFTER_SIGKILL)
        self._reap()
        self._close_stdout()
        if self.stderr is not None:
            await self.stderr.finish(limit=1.0)

    def _close_stdin(self) -> None:
        if self._stdin_open:
            self._stdin_open = False
            anyio.notify_closing(self.stdin_fd)
            os.close(self.stdin_fd)

    def _close_stdout(self) -> None:
        if self._stdout_open:
            self._stdout_open = False
            anyio.notify_closing(self.stdout_fd)
            os.close(self.stdout_fd)

    def _drain_stdout(self) -> None:
        # A server flushing output on its way out must not block on a full pipe.
        # Bounded per call: a server that writes forever would keep an unbounded
        # drain from ever returning to `_wait_for_exit`, which polls again soon.
        if not self._stdout_open or self._reading:
            return
        drained = 0
        try:
            while drained < _DRAIN_LIMIT:
                chunk = os.read(self.stdout_fd, _READ_CHUNK)
                if not chunk:
                    return
                drained += len(chunk)
        except OSError:
            pass

    def _closed_error(self) -> ConnectionClosed:
        return ConnectionClosed(
            self.server.name, f'the connection to server "{self._name()}" is closed'
        )

    def _exit_status(self) -> str | None:
        """How the server ended ("status 3", "signal 9"), or None while it runs.

        Never reaps it: until `aclose` has killed the group, the server's pid
        must stay reserved so the group id cannot name anyone else's processes.
        """
        if self.process.returncode is not None:
            code = self.process.returncode
            return f"status {code}" if code >= 0 else f"signal {-code}"
        if not hasattr(os, "waitid"):  # macOS: poll() reaps; the pid-reuse window is accepted
            return None if self.process.poll() is None else self._exit_status()
        try:
            state = os.waitid(os.P_PID, self.process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return "status unknown"
        if state is None:
            return None
        if state.si_code == os.CLD_EXITED:
            return f"status {state.si_status}"
        return f"signal {state.si_status}"

    def _exited(self) -> bool:
        """True once the server has exited, without reaping it."""
        return self._exit_status() is not None

    async def _wait_for_exit(self, limit: float, *, grace: bool = False) -> bool:
        """Whether the server exited within `limit`; a `grace` ends as soon as the stop
        is no longer polite."""
        with anyio.move_on_after(limit):
            while not self._exited():
                if grace and not self._polite:
                    return False  # not exited: checked just above
                self._drain_stdout()
                await anyio.sleep(_EXIT_POLL_INTERVAL)
            return True
        return self._exited()

    def _reap(self) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=0.5)


def start_stdio(server: Server) -> StdioTransport:
    """Start a stdio server; raise `MCPConnectionError` naming the command if it cannot start.

    Popen runs synchronously: fork and exec take milliseconds, and the
    `preexec_fn` must run in the thread that owns the connection, because the
    parent-death signal fires when *that thread* ends.  A server `start_early`
    started for this `server` is taken instead (the same thread: the event loop
    runs in the one that started it).
    """
    spawned = taken_early(server) or spawn(server)
    return StdioTransport(
        server=server,
        process=spawned.process,
        stdin_fd=spawned.stdin_fd,
        stdout_fd=spawned.stdout_fd,
        stderr=spawned.stderr,
        presented=spawned.presented,
    )
