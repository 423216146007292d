"""A real streamable HTTP MCP server (the SDK's, under uvicorn) that answers only with a token.

Run: python token_http_server.py TOKEN; it binds a free port on 127.0.0.1,
prints the port, and answers 401 to any request without
`Authorization: Bearer TOKEN`.  One tool: "whoami".
"""

from __future__ import annotations

import socket
import sys
from typing import Any

import mcp_types as types
import uvicorn
from mcp.server.lowlevel import Server


async def _list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    schema = {"type": "object", "properties": {}}
    return types.ListToolsResult(
        tools=[types.Tool(name="whoami", description="Say who the caller is.", input_schema=schema)]
    )


async def _call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text="you")])


def _requiring(app: Any, token: str) -> Any:
    expected = f"Bearer {token}".encode()

    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and dict(scope["headers"]).get(b"authorization") != expected:
            await send({"type": "http.response.start", "status": 401, "headers": []})
            await send({"type": "http.response.body", "body": b"no token"})
            return
        await app(scope, receive, send)

    return guarded


def main() -> None:
    server: Server[Any] = Server("token-http", on_list_tools=_list_tools, on_call_tool=_call_tool)
    app = _requiring(server.streamable_http_app(json_response=True), sys.argv[1])
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    print(sock.getsockname()[1], flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on")).run(sockets=[sock])


if __name__ == "__main__":
    main()
