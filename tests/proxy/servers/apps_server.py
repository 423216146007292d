"""A small MCP Apps server (the `io.modelcontextprotocol/ui` extension), built with the
official Python SDK's `MCPServer`, for the proxy's tests.

`show_board` names the app `ui://board/app.html`; `pin_card`, a write the app
calls (visible to the app only), names it too.  The app's HTML is read from
$APPS_HTML at every read, so a test changes the app while the server runs; each
`pin_card` appends one line to $APPS_LOG.
"""

from __future__ import annotations

import os
from pathlib import Path

from mcp.server.mcpserver import MCPServer

APP_URI = "ui://board/app.html"
APP_MIME = "text/html;profile=mcp-app"
HTML = Path(os.environ["APPS_HTML"])
LOG = Path(os.environ["APPS_LOG"])

server = MCPServer("apps-board")


@server.tool(
    description="Show the board in the host's app view.",
    meta={"ui": {"resourceUri": APP_URI}},
)
def show_board() -> str:
    return "the board has 2 cards"


@server.tool(
    description="Pin a card to the board (the app calls this).",
    meta={"ui": {"resourceUri": APP_URI, "visibility": ["app"]}},
)
def pin_card(text: str) -> str:
    with LOG.open("a") as log:
        log.write(f"pin_card {text}\n")
    return f"pinned {text}"


@server.tool(description="Count the cards (no app).")
def count_cards() -> str:
    return "2"


@server.resource(
    APP_URI,
    name="board-app",
    description="The board's app.",
    mime_type=APP_MIME,
    meta={"ui": {"csp": {"connectDomains": []}, "prefersBorder": True}},
)
def board_app() -> str:
    return HTML.read_text()


if __name__ == "__main__":
    server.run("stdio")
