"""FastMCP's proxy in front of stdio upstream servers (runs in the fastmcp peer venv): over
stdio, or over streamable HTTP on /mcp with `--http HOST:PORT`.

    python fastmcp_proxy.py CONFIG_JSON [--http HOST:PORT]

CONFIG_JSON is an MCPConfig: {"mcpServers": {name: {"command": ..., "args": [...]}}}.
"""

from __future__ import annotations

import json
import sys

from fastmcp.server import create_proxy

if __name__ == "__main__":
    config = json.loads(sys.argv[1])
    proxy = create_proxy(config, name="fastmcp-proxy")
    if sys.argv[2:3] == ["--http"]:
        host, _, port = sys.argv[3].rpartition(":")
        proxy.run(transport="http", host=host, port=int(port), show_banner=False)
    else:
        proxy.run(transport="stdio", show_banner=False)
