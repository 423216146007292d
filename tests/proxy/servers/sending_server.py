"""A small sending MCP server for the flow tests (the official SDK's MCPServer, over stdio).

`send_message` stands for any tool that sends data away (a mail, a comment, an
HTTP request): it appends what it was asked to send to $SENDING_SERVER_OUTBOX,
so a test sees from outside whether anything left.
"""

from __future__ import annotations

import json
import os

from mcp.server import MCPServer

server = MCPServer("sender")


@server.tool()
def send_message(to: str, body: str) -> str:
    """Send a message to someone outside this machine."""
    with open(os.environ["SENDING_SERVER_OUTBOX"], "a", encoding="utf-8") as outbox:
        outbox.write(json.dumps({"to": to, "body": body}) + "\n")
    return f"sent {len(body)} characters to {to}"


if __name__ == "__main__":
    server.run()
