"""The host's first message seen while the servers load, never taken (`_peek`, issue 36).

A worker thread looks at what waits on the proxy's stdin to import the 2026-07-28
front early for a host of that era; the front must then read every byte exactly as
the host wrote it, on a pipe and on a socket alike."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path

from agentrt.proxy._peek import first_bytes, speaks_2026, watch_stdin

_MODERN = (
    json.dumps(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "server/discover",
            "params": {"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}},
        }
    ).encode()
    + b"\n"
)
_HANDSHAKE = b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}\n'


def test_a_pipes_bytes_are_seen_and_left_for_the_reader() -> None:
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, _MODERN + _HANDSHAKE)
        assert first_bytes(read_end) == _MODERN + _HANDSHAKE
        assert first_bytes(read_end) == _MODERN + _HANDSHAKE  # still there
        assert os.read(read_end, 65536) == _MODERN + _HANDSHAKE
        assert first_bytes(read_end) is None  # nothing waiting: nothing seen, nothing blocks
    finally:
        os.close(read_end)
        os.close(write_end)


def test_a_sockets_bytes_are_seen_and_left_for_the_reader() -> None:
    host, proxy = socket.socketpair()
    with host, proxy:
        host.sendall(_HANDSHAKE)
        assert first_bytes(proxy.fileno()) == _HANDSHAKE
        assert proxy.recv(65536) == _HANDSHAKE
        assert first_bytes(proxy.fileno()) is None


def test_a_file_or_a_closed_descriptor_is_not_looked_at(tmp_path: Path) -> None:
    path = tmp_path / "stdin"
    path.write_bytes(_MODERN)
    with path.open("rb") as handle:
        assert first_bytes(handle.fileno()) is None
        assert handle.read() == _MODERN  # untouched
    read_end, write_end = os.pipe()
    os.close(read_end)
    os.close(write_end)
    assert first_bytes(read_end) is None


def test_only_a_first_line_with_the_2026_envelope_speaks_2026() -> None:
    assert speaks_2026(_MODERN)
    assert speaks_2026(_MODERN + _HANDSHAKE)
    assert not speaks_2026(_HANDSHAKE)
    # The key on a later line is a later message: the era is the first one's.
    assert not speaks_2026(_HANDSHAKE + _MODERN)
    assert not speaks_2026(b"")


def test_the_watch_calls_once_for_a_2026_host_and_stops_when_told() -> None:
    calls: list[str] = []
    for first, expected in ((_MODERN, ["2026"]), (_HANDSHAKE, []), (None, [])):
        calls.clear()
        stdin_read, stdin_write = os.pipe()
        wake_read, wake_write = os.pipe()
        saved = os.dup(0)
        os.dup2(stdin_read, 0)
        stop = threading.Event()
        try:
            watcher = threading.Thread(
                target=watch_stdin, args=(stop, wake_read, lambda: calls.append("2026"))
            )
            watcher.start()
            time.sleep(0.05)
            if first is not None:
                os.write(stdin_write, first)
            else:
                stop.set()
                os.write(wake_write, b"x")  # the servers loaded before the host wrote
            watcher.join(timeout=5)
            assert not watcher.is_alive()
            assert calls == expected
            if first is not None:
                assert os.read(0, 65536) == first  # the front reads it all
        finally:
            os.dup2(saved, 0)
            for descriptor in (saved, stdin_read, stdin_write, wake_read, wake_write):
                os.close(descriptor)
