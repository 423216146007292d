"""A stdio MCP server that tries to reach what it should not (stdlib only).

Every tool attempts one thing and reports what happened, never raising:
`{"ok": true, "value": ...}` or `{"ok": false, "error": "..."}`.

- read {path}: the file's text.
- write {path, content}: write (create) the file.
- list {path}: the names in a directory.
- connect {host, port}: open a TCP connection and send one line.
- whoami: pid, ppid, uid, HOME, TMPDIR, cwd and the pids /proc shows.
- spawn: start a sleeping child (stdio on /dev/null) and return its pid.

An optional first argument is a marker file written at start, so a test can
tell whether the server ran at all where it can see the marker's directory.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from typing import Any

_TOOLS = [
    {"name": "read", "description": "Read a file.", "inputSchema": {"type": "object"}},
    {"name": "write", "description": "Write a file.", "inputSchema": {"type": "object"}},
    {"name": "list", "description": "List a directory.", "inputSchema": {"type": "object"}},
    {"name": "connect", "description": "Open a TCP connection.", "inputSchema": {"type": "object"}},
    {"name": "whoami", "description": "Say where it runs.", "inputSchema": {"type": "object"}},
    {"name": "spawn", "description": "Start a sleeping child.", "inputSchema": {"type": "object"}},
]


def _attempt(name: str, arguments: dict[str, Any]) -> Any:
    if name == "read":
        with open(arguments["path"], encoding="utf-8", errors="replace") as handle:
            return handle.read()
    if name == "write":
        with open(arguments["path"], "w", encoding="utf-8") as handle:
            handle.write(arguments["content"])
        return len(arguments["content"])
    if name == "list":
        return sorted(os.listdir(arguments["path"]))
    if name == "connect":
        with socket.create_connection((arguments["host"], arguments["port"]), timeout=3) as conn:
            conn.sendall(b"escaped\n")
        return "connected"
    if name == "whoami":
        return {
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "uid": os.getuid(),
            "home": os.environ.get("HOME"),
            "tmpdir": os.environ.get("TMPDIR"),
            "cwd": os.getcwd(),
            "proc": sorted(int(entry) for entry in os.listdir("/proc") if entry.isdigit()),
        }
    if name == "spawn":
        child = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(300)"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        return child.pid
    raise ValueError(f"no tool {name}")


def _result(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    try:
        outcome: dict[str, Any] = {"ok": True, "value": _attempt(name, arguments)}
    except Exception as exc:  # every failure is the answer, not a crash
        outcome = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    return {
        "content": [{"type": "text", "text": json.dumps(outcome)}],
        "structuredContent": outcome,
    }


def main() -> None:
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w", encoding="utf-8") as marker:
            marker.write(str(os.getpid()))
    for line in sys.stdin:
        message = json.loads(line)
        method, request_id = message.get("method"), message.get("id")
        if request_id is None:
            continue
        params = message.get("params") or {}
        if method == "initialize":
            result: Any = {
                "protocolVersion": params.get("protocolVersion"),
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "escaper", "version": "1"},
            }
        elif method == "tools/list":
            result = {"tools": _TOOLS}
        elif method == "tools/call":
            result = _result(params["name"], params.get("arguments") or {})
        else:
            result = {}
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
