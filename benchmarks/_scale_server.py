"""A minimal MCP server over stdio for the scaling benchmark: newline-delimited
JSON-RPC from the standard library, one tool `noop_0000` answering `ok <n>` at once.

Written without the SDK so that eight of them cost next to no CPU beside the
eight proxies they sit behind: the benchmark measures the proxies and the store.
"""

from __future__ import annotations

import json
import sys
from typing import Any

_TOOL = {
    "name": "noop_0000",
    "description": "Answer ok with the number given (scaling benchmark).",
    "inputSchema": {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 0}},
        "required": ["n"],
        "additionalProperties": False,
    },
    "annotations": {"readOnlyHint": True},
}


def _answer(request: dict[str, Any]) -> dict[str, Any] | None:
    method, ident = request.get("method"), request.get("id")
    if ident is None:
        return None  # a notification
    if method == "initialize":
        version = request.get("params", {}).get("protocolVersion", "2025-06-18")
        result: dict[str, Any] = {
            "protocolVersion": version,
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "agentrt-scale", "version": "1"},
        }
    elif method == "tools/list":
        result = {"tools": [_TOOL]}
    elif method == "tools/call":
        number = request.get("params", {}).get("arguments", {}).get("n", 0)
        result = {"content": [{"type": "text", "text": f"ok {number}"}]}
    elif method == "ping":
        result = {}
    else:
        return {"jsonrpc": "2.0", "id": ident, "error": {"code": -32601, "message": "no"}}
    return {"jsonrpc": "2.0", "id": ident, "result": result}


def main() -> None:
    for line in sys.stdin:
        if not line.strip():
            continue
        answer = _answer(json.loads(line))
        if answer is not None:
            sys.stdout.write(json.dumps(answer) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
