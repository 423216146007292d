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
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from typing import Final

import anyio
import mcp_types as types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.shared.message import SessionMessage

__all__ = ["MAX_LINE_BYTES", "stdio_wire"]

MAX_LINE_BYTES: Final = 16 * 1024 * 1024


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


@contextlib.asynccontextmanager
async def stdio_wire() -> AsyncIterator[
    tuple[
        MemoryObjectReceiveStream[SessionMessage | Exception],
        MemoryObjectSendStream[SessionMessage],
    ]
]:
    """Read and write JSON-RPC lines on the process's stdin and stdout until EOF or cancellation."""
    null = os.open(os.devnull, os.O_RDONLY)
    wire_in = _take_descriptor(0, null)
    os.close(null)
    wire_out = _take_descriptor(1, 2)
    # Read both flags before changing either: a terminal may be one description.
    was_blocking = [(wire, os.get_blocking(wire)) for wire in (wire_in, wire_out)]
    os.set_blocking(wire_in, False)
    os.set_blocking(wire_out, False)
    incoming_send, incoming = anyio.create_memory_object_stream[SessionMessage | Exception](16)
    outgoing, outgoing_receive = anyio.create_memory_object_stream[SessionMessage](16)

    async def read() -> None:
        buffer = bytearray()
        async with incoming_send:
            while True:
                try:
                    chunk = os.read(wire_in, 65536)
                except BlockingIOError:
                    await anyio.wait_readable(wire_in)
                    continue
                if not chunk:
                    return
                buffer += chunk
                while (end := buffer.find(b"\n")) >= 0:
                    line = bytes(buffer[:end])
                    del buffer[: end + 1]
                    if line.strip():
                        await incoming_send.send(_parse(line))
                if len(buffer) > MAX_LINE_BYTES:
                    buffer.clear()
                    await incoming_send.send(ValueError("a message longer than 16 MiB was dropped"))

    async def write() -> None:
        async with outgoing_receive:
            async for message in outgoing_receive:
                text = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                await _write_all(wire_out, text.encode("utf-8") + b"\n")

    try:
        async with anyio.create_task_group() as group:
            group.start_soon(read)
            group.start_soon(write)
            try:
                yield incoming, outgoing
            finally:
                group.cancel_scope.cancel()
    finally:
        for wire, blocking in was_blocking:
            with contextlib.suppress(OSError):
                os.set_blocking(wire, blocking)
        os.dup2(wire_out, 1)
        os.close(wire_out)
        os.close(wire_in)


def _parse(line: bytes) -> SessionMessage | Exception:
    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except Exception as exc:
        return exc
