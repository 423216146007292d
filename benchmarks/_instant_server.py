"""A stdio MCP server that is ready at once: newline-delimited JSON-RPC in plain Python,
no SDK, one read-only tool.  Behind `agentrt proxy` it shows the proxy's own start-up,
which a server that boots slower (the filesystem server, on Node) partly hides."""

import json
import sys
from typing import Any

TOOLS = [
    {
        "name": "echo",
        "description": "Echo the text.",
        "inputSchema": {
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
        },
        "annotations": {"readOnlyHint": True},
    }
]


def answer(message: dict[str, Any]) -> dict[str, Any]:
    method = message["method"]
    if method == "initialize":
        return {
            "protocolVersion": message["params"]["protocolVersion"],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "instant", "version": "1"},
        }
    if method == "tools/list":
        return {"tools": TOOLS}
    if method == "tools/call":
        text = message["params"].get("arguments", {}).get("text", "")
        return {"content": [{"type": "text", "text": text}]}
    if method == "ping":
        return {}
    raise LookupError(method)


for line in sys.stdin:
    message = json.loads(line)
    if "id" not in message:
        continue
    try:
        reply = {"jsonrpc": "2.0", "id": message["id"], "result": answer(message)}
    except LookupError:
        reply = {"jsonrpc": "2.0", "id": message["id"],
                 "error": {"code": -32601, "message": "method not found"}}  # fmt: skip
    sys.stdout.write(json.dumps(reply) + "\n")
    sys.stdout.flush()
