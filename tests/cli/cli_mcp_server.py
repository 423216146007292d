"""A small real MCP server over stdio (newline-delimited JSON-RPC) for `pin` and `check`.

It offers three tools: one claims to be read-only, one claims to be
destructive, and one has a description carrying a terminal escape and a bidi
override.  Every `tools/call` it receives is appended to `<marks>/calls`, and
`<marks>/closed` is written when its standard input closes, so a test can
prove that nothing was called and that the connection was closed.

Usage: python cli_mcp_server.py MARKS_DIRECTORY
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

TOOLS = [
    {
        "name": "read_thing",
        "description": "Read a thing.",
        "inputSchema": {"type": "object", "properties": {"id": {"type": "string"}}},
        "annotations": {"readOnlyHint": True},
    },
    {
        "name": "write_thing",
        "description": "Write a thing.",
        "inputSchema": {
            "type": "object",
            "properties": {"id": {"type": "string"}, "text": {"type": "string"}},
        },
        "annotations": {"readOnlyHint": False, "destructiveHint": True},
    },
    {
        "name": "shout",
        "description": "Loud \x1b[31mred\x1b[0m text \u202etxt.exe",
        "inputSchema": {"type": "object", "properties": {}},
    },
]


def main() -> None:
    marks = Path(sys.argv[1])
    out = sys.stdout
    for line in sys.stdin:
        if not line.strip():
            continue
        message = json.loads(line)
        method = message.get("method")
        if "id" not in message:
            continue
        if method == "initialize":
            result: object = {
                "protocolVersion": message["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "cli-test-server", "version": "1.0.0"},
            }
        elif method == "tools/list":
            result = {"tools": TOOLS}
        elif method == "tools/call":
            with (marks / "calls").open("a") as calls:
                calls.write(json.dumps(message["params"]) + "\n")
            result = {"content": [{"type": "text", "text": "done"}]}
        elif method == "ping":
            result = {}
        else:
            out.write(
                json.dumps(
                    {
                        "jsonrpc": "2.0",
                        "id": message["id"],
                        "error": {"code": -32601, "message": f"no method {method}"},
                    }
                )
                + "\n"
            )
            out.flush()
            continue
        out.write(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}) + "\n")
        out.flush()
    (marks / "closed").write_text("closed\n")


if __name__ == "__main__":
    main()
