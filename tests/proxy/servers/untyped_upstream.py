"""An upstream MCP server whose one tool pins no argument type: stdio JSON-RPC, standard
library only.

`run` takes any JSON object, as a server with a loose schema does, so the model
may send `true` where a condition expects a number or a string where it expects
a list.  Every call appends `run <arguments>` to $PROXY_UPSTREAM_LOG, so a test
sees from outside whether the upstream ran.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

LOG = os.environ["PROXY_UPSTREAM_LOG"]

TOOL: dict[str, Any] = {
    "name": "run",
    "description": "Run something; the arguments are not typed.",
    "inputSchema": {"type": "object"},
}


def _send(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def _result(method: str, params: dict[str, Any]) -> dict[str, Any] | None:
    if method == "initialize":
        return {
            "protocolVersion": params["protocolVersion"],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "untyped-upstream", "version": "1"},
        }
    if method == "tools/list":
        return {"tools": [TOOL]}
    if method == "tools/call":
        arguments = params.get("arguments") or {}
        with open(LOG, "a") as log:
            log.write(f"run {json.dumps(arguments, sort_keys=True)}\n")
        return {"content": [{"type": "text", "text": "ran"}], "isError": False}
    if method == "ping":
        return {}
    return None


def main() -> None:
    for line in sys.stdin:
        if not line.strip():
            continue
        message = json.loads(line)
        if "id" not in message:
            continue  # notifications need no answer
        result = _result(message.get("method", ""), message.get("params") or {})
        if result is None:
            error = {"code": -32601, "message": f"no method {message.get('method')}"}
            _send({"jsonrpc": "2.0", "id": message["id"], "error": error})
        else:
            _send({"jsonrpc": "2.0", "id": message["id"], "result": result})


if __name__ == "__main__":
    main()
