"""A small real MCP server over stdio whose tools are what a JSON file says at each listing.

A test edits the file between two pins to change a description, a schema,
a hint, or the set of tools, exactly as an updated (or compromised) server
would.  Every `tools/call` is appended to `<tools file>.calls`.

Usage: python described_mcp_server.py TOOLS_JSON_FILE
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> None:
    tools_file = Path(sys.argv[1])
    out = sys.stdout
    for line in sys.stdin:
        if not line.strip():
            continue
        message = json.loads(line)
        if "id" not in message:
            continue
        method = message.get("method")
        if method == "initialize":
            result: object = {
                "protocolVersion": message["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "described-test-server", "version": "1.0.0"},
            }
        elif method == "tools/list":
            result = {"tools": json.loads(tools_file.read_text())}
        elif method == "tools/call":
            with tools_file.with_suffix(".calls").open("a") as calls:
                calls.write(json.dumps(message["params"]) + "\n")
            result = {"content": [{"type": "text", "text": "done"}]}
        else:
            result = {}
        out.write(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
