"""Helpers for the sandbox tests: the escaping server, a loopback listener, process trees."""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from agentrt.mcp import Sandbox
from agentrt.mcp._connection import connect
from agentrt.mcp._server import Server

SERVERS = Path(__file__).parent / "servers"
ESCAPER = SERVERS / "escaper.py"
REPO = Path(__file__).resolve().parents[2]
FILESYSTEM_SERVER = (
    REPO / "tests/npm/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js"
)
NODE_MODULES = REPO / "tests/npm/node_modules"

Call = Callable[..., Awaitable[dict[str, Any]]]


def escaper(sandbox: Sandbox | None, *extra: str, **settings: Any) -> Server:
    """The escaping server, started as `python escaper.py` (the script is bound on its own)."""
    settings.setdefault("name", "escaper")
    return Server(command=[sys.executable, str(ESCAPER), *extra], sandbox=sandbox, **settings)


@asynccontextmanager
async def session(server: Server) -> AsyncIterator[Call]:
    """A real connection to `server`; yields `call(tool, **arguments) -> {"ok", ...}`."""
    connection = await connect(server)

    async def call(tool: str, **arguments: Any) -> dict[str, Any]:
        result = await connection.call_tool(tool, json.dumps(arguments), timeout=20)
        outcome: dict[str, Any] = result["structuredContent"]
        return outcome

    try:
        yield call
    finally:
        await connection.aclose()


class Listener:
    """A loopback TCP listener that records whether anyone connected to it."""

    def __init__(self) -> None:
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen(8)
        self.port: int = self.socket.getsockname()[1]

    def saw_anyone(self) -> bool:
        self.socket.settimeout(0.5)
        try:
            accepted, _ = self.socket.accept()
        except TimeoutError:
            return False
        accepted.close()
        return True

    def close(self) -> None:
        self.socket.close()


def children_of(pid: int) -> list[int]:
    """Every live descendant of `pid`, read from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as handle:
                fields = handle.read().rpartition(")")[2].split()
        except OSError:
            continue
        if fields[0] not in ("Z", "X"):
            parents.setdefault(int(fields[1]), []).append(int(entry))
    found: list[int] = []
    pending = [pid]
    while pending:
        for child in parents.get(pending.pop(), []):
            found.append(child)
            pending.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            return handle.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except OSError:
        return False
