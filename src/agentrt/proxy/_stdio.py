"""The host's stdio wire, read without a blocking thread so a signal can stop it.

The SDK's `stdio_server` reads stdin in a worker thread, which a signal
cannot interrupt: a proxy told to stop would wait for the host's next line.
This transport waits on the descriptor instead.  Like the SDK's, it moves
the wire off descriptors 0 and 1 while it serves, so nothing else in this
process can read the host's requests or write into the replies.

Both descriptors are non-blocking while it serves: a host that stops
reading must stall only its own replies, never the event loop that renews
holds and runs every other call.  The blocking flag belongs to the open
file description the host (or a shell's terminal) shares with us, so each
descriptor's original flag is put back on the way out.

Every line is screened (`_host_messages`) before the proxy reads it, so a
malformed message is answered, never dropped in silence; a line longer than
`MAX_LINE_BYTES` is answered once and discarded up to its newline, so no
byte after the cut is ever read as a message of its own.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import IO, Any, Final

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ._host_messages import Refusal, decode, refusal_of_oversized
from ._plain import Message, Notification, Request, RequestId

__all__ = ["MAX_LINE_BYTES", "StdioWire", "stdio_wire"]

MAX_LINE_BYTES: Final = 16 * 1024 * 1024
# How long answers already made may take to reach the host at shutdown.
_GRACE_SECONDS: Final = 2.0


def _take_descriptor(fd: int, replacement: int) -> int:
    wire = os.dup(fd)
    os.set_inheritable(wire, False)
    os.dup2(replacement, fd)
    return wire


async def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except BlockingIOError:
            await anyio.wait_writable(fd)
            continue
        view = view[written:]


class StdioWire:
    """The host's two streams, and what the proxy still owes the host on them.

    Every request read is owed an answer until one with its id is written (or
    the host cancels it).  `stop()` ends intake; `closed()` closes the stream
    the server reads once nothing is owed, so every call the proxy took is
    answered before the server loop ends.
    """

    def __init__(
        self,
        incoming: MemoryObjectReceiveStream[Message],
        # The SDK's server's messages (`mcp_types.JSONRPCMessage`), once a host needs it.
        outgoing: MemoryObjectSendStream[Any],
        write_line: Callable[[bytes], Awaitable[None]],
    ) -> None:
        self.incoming = incoming
        self.outgoing = outgoing
        self.owed: set[RequestId] = set()
        self.intake = anyio.CancelScope()
        self._write_line = write_line

    async def send(self, data: bytes, answers: RequestId | None = None) -> None:
        """Write one message already serialised; `answers` is the id of the request it
        answers, if it does (the stdio front's own answers, `_dispatch`)."""
        await self._write_line(data)
        if answers is not None:
            self.owed.discard(answers)

    def stop(self) -> None:
        """Read no more from the host; the calls already read are still answered."""
        self.intake.cancel()


@contextlib.asynccontextmanager
async def stdio_wire(
    on_intake_end: Callable[[], object],
    settled: Callable[[], bool],
    log: IO[str],
) -> AsyncIterator[StdioWire]:
    """Read and write JSON-RPC lines on the process's stdin and stdout.

    When the host closes stdin or `stop()` is called, `on_intake_end` runs
    (the proxy takes no more calls); the server's read stream ends only once
    every request read has been answered on stdout, or nothing can answer
    it any more (`settled()` true and a grace period gone).
    """
    null = os.open(os.devnull, os.O_RDONLY)
    wire_in = _take_descriptor(0, null)
    os.close(null)
    wire_out = _take_descriptor(1, 2)
    # Read both flags before changing either: a terminal may be one description.
    was_blocking = [(wire, os.get_blocking(wire)) for wire in (wire_in, wire_out)]
    os.set_blocking(wire_in, False)
    os.set_blocking(wire_out, False)
    incoming_send, incoming = anyio.create_memory_object_stream[Message](16)
    outgoing, outgoing_receive = anyio.create_memory_object_stream[Any](16)
    writing = anyio.Lock()

    async def write_line(data: bytes) -> None:
        async with writing:
            await _write_all(wire_out, data + b"\n")

    wire = StdioWire(incoming, outgoing, write_line)

    async def refuse(refusal: Refusal) -> None:
        log.write(refusal.log_line + "\n")
        log.flush()
        await write_line(refusal.body())

    async def take(line: bytes) -> None:
        decoded = decode(line)
        if isinstance(decoded, Refusal):
            await refuse(decoded)
            return
        message = decoded
        if isinstance(message, Request):
            wire.owed.add(message.id)
        elif isinstance(message, Notification) and message.method == ("notifications/cancelled"):
            # A cancelled request gets no answer (MCP), so nothing is owed for it.
            request_id = (message.params or {}).get("requestId")
            wire.owed.discard(request_id)
        await incoming_send.send(decoded)

    async def read() -> None:
        buffer = bytearray()
        discarding = False
        with wire.intake:
            while True:
                try:
                    chunk = os.read(wire_in, 65536)
                except BlockingIOError:
                    await anyio.wait_readable(wire_in)
                    continue
                if not chunk:
                    return
                if discarding:
                    # The rest of a line cut at the limit is never read as a message.
                    end = chunk.find(b"\n")
                    if end < 0:
                        continue
                    chunk = chunk[end + 1 :]
                    discarding = False
                buffer += chunk
                while (end := buffer.find(b"\n")) >= 0:
                    line = bytes(buffer[:end])
                    del buffer[: end + 1]
                    if len(line) > MAX_LINE_BYTES:
                        await refuse(refusal_of_oversized(MAX_LINE_BYTES))
                    elif line.strip():
                        await take(line)
                if len(buffer) > MAX_LINE_BYTES:
                    buffer.clear()
                    discarding = True
                    await refuse(refusal_of_oversized(MAX_LINE_BYTES))

    async def serve_intake() -> None:
        async with incoming_send:
            await read()
            on_intake_end()
            # Keep the server's read stream open until every call taken is answered.
            grace: float | None = None
            while wire.owed:
                if settled():
                    grace = grace if grace is not None else anyio.current_time() + _GRACE_SECONDS
                    if anyio.current_time() >= grace:
                        log.write(
                            f"agentrt proxy: {len(wire.owed)} request(s) of the host were "
                            "left unanswered at shutdown\n"
                        )
                        log.flush()
                        return
                await anyio.sleep(0.02)

    async def write() -> None:
        async with outgoing_receive:
            async for answered in outgoing_receive:
                text = answered.model_dump_json(by_alias=True, exclude_unset=True)
                await write_line(text.encode("utf-8"))
                if hasattr(answered, "result") or hasattr(answered, "error"):
                    wire.owed.discard(answered.id)

    try:
        async with anyio.create_task_group() as group:
            group.start_soon(serve_intake)
            group.start_soon(write)
            try:
                yield wire
            finally:
                # Answers the server queued are written before the wire goes,
                # unless the host stopped reading them.
                with anyio.move_on_after(_GRACE_SECONDS, shield=True):
                    # Polled: the memory stream has no "drained" event to wait on.
                    while outgoing_receive.statistics().current_buffer_used or writing.locked():  # noqa: ASYNC110
                        await anyio.sleep(0.01)
                group.cancel_scope.cancel()
    finally:
        for descriptor, blocking in was_blocking:
            with contextlib.suppress(OSError):
                os.set_blocking(descriptor, blocking)
        os.dup2(wire_out, 1)
        os.close(wire_out)
        os.close(wire_in)
