"""A small file server for the precondition tests: stdio JSON-RPC, standard library only.

`read_file` answers a file's text (a missing one is an error naming ENOENT, as the
stock filesystem server's is), after `seconds` when asked to hang; `write_file`
writes first and then, the first time for a given content, waits `seconds` before
answering, so a proxy whose timeout is shorter gives up on a write that did take
effect (an unknown outcome).  Every write
appends one line to $SLOW_FILES_LOG, so a test counts them from outside.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

LOG = os.environ["SLOW_FILES_LOG"]
_lock = threading.Lock()
_seen: set[str] = set()

TOOLS: list[dict[str, Any]] = [
    {
        "name": "read_file",
        "description": "Read a file's text.",
        "inputSchema": {"type": "object", "properties": {
            "path": {"type": "string"}, "seconds": {"type": "number"}},
            "required": ["path"], "additionalProperties": False},
        "annotations": {"readOnlyHint": True},
    },
    {
        "name": "write_file",
        "description": "Write a file's text (slowly the first time).",
        "inputSchema": {"type": "object", "properties": {
            "path": {"type": "string"}, "content": {"type": "string"},
            "seconds": {"type": "number"}},
            "required": ["path", "content"], "additionalProperties": False},
    },
]  # fmt: skip


def _send(message: dict[str, Any]) -> None:
    with _lock:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()


def _text(text: str, is_error: bool = False) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "isError": is_error}


def _call(request_id: Any, name: str, arguments: dict[str, Any]) -> None:
    path = Path(arguments["path"])
    if name == "read_file":
        time.sleep(float(arguments.get("seconds", 0)))  # a read that hangs, when asked to
        try:
            result = _text(path.read_text())
        except FileNotFoundError:
            result = _text(f"ENOENT: no such file or directory, open '{path}'", is_error=True)
    else:
        path.write_text(arguments["content"])
        with _lock, open(LOG, "a") as log:
            log.write(f"write_file {path.name}\n")
        if arguments["content"] not in _seen:
            _seen.add(arguments["content"])
            time.sleep(float(arguments.get("seconds", 0)))
        result = _text(f"wrote {path.name}")
    _send({"jsonrpc": "2.0", "id": request_id, "result": result})


def main() -> None:
    for line in sys.stdin:
        if not line.strip():
            continue
        message = json.loads(line)
        method, request_id = message.get("method"), message.get("id")
        if request_id is None:
            continue
        if method == "initialize":
            result: dict[str, Any] = {
                "protocolVersion": message["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "slow-files", "version": "1"},
            }
        elif method == "tools/list":
            result = {"tools": TOOLS}
        elif method == "tools/call":
            params = message["params"]
            threading.Thread(
                target=_call, args=(request_id, params["name"], params.get("arguments") or {}),
                daemon=True,
            ).start()  # fmt: skip
            continue
        elif method == "ping":
            result = {}
        else:
            _send({"jsonrpc": "2.0", "id": request_id,
                   "error": {"code": -32601, "message": f"no method {method}"}})  # fmt: skip
            continue
        _send({"jsonrpc": "2.0", "id": request_id, "result": result})


if __name__ == "__main__":
    main()
