"""A real streamable HTTP MCP server (the SDK's low-level Server under uvicorn) on 127.0.0.1.

Run: python sdk_http.py [--json]; it binds a free port on 127.0.0.1, prints
that port on stdout, and serves `/mcp` until killed.  With --json it answers
with JSON bodies instead of SSE streams.  Tools: "add" (a + b, also as
structured content), "ask" (asks the client for input mid-call through
elicitation, then reports what came back), "slow" (sleeps "seconds").
"""

from __future__ import annotations

import socket
import sys
from typing import Any

import anyio
import mcp_types as types
import uvicorn
from mcp.server.lowlevel import Server

_SCHEMA: dict[str, Any] = {"type": "object", "additionalProperties": True}


async def _list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(
        tools=[
            types.Tool(name=name, description=f"{name} tool", input_schema=_SCHEMA)
            for name in ("add", "ask", "slow")
        ]
    )


async def _call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    arguments = params.arguments or {}
    if params.name == "add":
        total = arguments["a"] + arguments["b"]
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=str(total))],
            structured_content={"sum": total},
        )
    if params.name == "ask":
        try:
            # Related to this request, so it travels on this call's own stream.
            answer = await ctx.session.elicit(
                "Your password?",
                {"type": "object", "properties": {}},
                related_request_id=ctx.request_id,
            )
            text = f"elicitation answered: {answer.action}"
        except Exception as exc:  # the client refused: that is the point of the test
            text = f"elicitation refused: {exc}"
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)])
    if params.name == "slow":
        await anyio.sleep(float(arguments.get("seconds", 1)))
        return types.CallToolResult(content=[types.TextContent(type="text", text="slept")])
    return types.CallToolResult(
        content=[types.TextContent(type="text", text="unknown tool")], is_error=True
    )


def main() -> None:
    json_response = "--json" in sys.argv
    server: Server[Any] = Server("sdk-http", on_list_tools=_list_tools, on_call_tool=_call_tool)
    app = server.streamable_http_app(json_response=json_response)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)  # connections queue from now on, before uvicorn is up
    print(sock.getsockname()[1], flush=True)
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
