"""FastMCP's proxy over stdio in front of stdio upstream servers (runs in the fastmcp peer venv).

    python fastmcp_proxy.py CONFIG_JSON

CONFIG_JSON is an MCPConfig: {"mcpServers": {name: {"command": ..., "args": [...]}}}.
"""

from __future__ import annotations

import json
import sys

from fastmcp.server import create_proxy

if __name__ == "__main__":
    config = json.loads(sys.argv[1])
    proxy = create_proxy(config, name="fastmcp-proxy")
    proxy.run(transport="stdio", show_banner=False)
