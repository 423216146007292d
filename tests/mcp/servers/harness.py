"""Helpers to start the hostile servers and watch processes from the tests."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from agentrt.mcp._server import Server

SERVERS = Path(__file__).parent
HOSTILE_STDIO = SERVERS / "hostile_stdio.py"
HOSTILE_HTTP = SERVERS / "hostile_http.py"
SDK_HTTP = SERVERS / "sdk_http.py"


def stdio_server(scenario: dict[str, Any] | None = None, **settings: Any) -> Server:
    """A `Server` running hostile_stdio.py with `scenario` (see that file's docstring)."""
    settings.setdefault("name", "hostile")
    command = [sys.executable, str(HOSTILE_STDIO), json.dumps(scenario or {})]
    return Server(command=command, **settings)


def process_gone(pid: int) -> bool:
    """True when `pid` no longer runs (absent, or a zombie nobody has reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            stat = handle.read()
    except FileNotFoundError:
        return True
    state = stat.rpartition(")")[2].split()[0]
    return state in ("Z", "X")


def wait_until(condition: Callable[[], bool], limit: float = 10.0) -> bool:
    """Poll `condition` until it holds or `limit` seconds pass; return whether it held."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def read_json(path: Path, limit: float = 10.0) -> Any:
    """The JSON a server writes to `path`, waiting for it to appear."""
    wait_until(lambda: path.exists() and path.stat().st_size > 0, limit)
    return json.loads(path.read_text(encoding="utf-8"))


def kill_quietly(pid: int) -> None:
    """Clean up a process a failed test may have left behind."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, 9)


@contextlib.contextmanager
def http_server(script: Path, *arguments: str) -> Iterator[str]:
    """Run an HTTP server script on 127.0.0.1; yield its MCP endpoint URL; kill it after."""
    process = subprocess.Popen([sys.executable, str(script), *arguments], stdout=subprocess.PIPE)
    try:
        assert process.stdout is not None
        port = int(process.stdout.readline())
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.kill()
        process.wait()


def hostile_http(scenario: dict[str, Any] | None = None) -> contextlib.AbstractContextManager[str]:
    """hostile_http.py with `scenario` (see that file's docstring)."""
    return http_server(HOSTILE_HTTP, json.dumps(scenario or {}))
