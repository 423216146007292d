"""A server built with the official SDK that speaks both eras: 2026-07-28 and the handshake.

Run: python sdk_revision.py stdio | http [--stateless] [--ttl MS]; over HTTP it binds a
free port on 127.0.0.1, prints it on stdout and serves `/mcp` until killed (stateless:
the SDK's modern stateless mode, no session).  Its tools: "add" (a + b), "region" (its
"region" argument carries `x-mcp-header: Region`, so the SDK rejects a call over the
revision's HTTP whose `Mcp-Param-Region` header is missing or disagrees), "write_note"
(a write, for approval holds).  With --ttl, its
listings carry `ttlMs` MS; every `tools/list` it serves is counted in the text of "add".
"""

from __future__ import annotations

import socket
import sys
from typing import Any

import mcp_types as types
import uvicorn
from mcp.server.caching import CacheHint
from mcp.server.lowlevel import Server

_LISTINGS = {"tools": 0}

_TOOLS: list[types.Tool] = [
    types.Tool(
        name="add",
        description="Add two integers.",
        input_schema={
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
        annotations=types.ToolAnnotations(read_only_hint=True),
    ),
    types.Tool(
        name="region",
        description="Say which region a query runs in.",
        input_schema={
            "type": "object",
            "properties": {
                "region": {"type": "string", "x-mcp-header": "Region"},
                "query": {"type": "string"},
            },
            "required": ["region", "query"],
        },
    ),
    types.Tool(
        name="reheader",
        description="Mirror the region into another header from now on.",
        input_schema={"type": "object", "properties": {}},
    ),
    types.Tool(
        name="write_note",
        description="Write a note.",
        input_schema={
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
        },
        annotations=types.ToolAnnotations(read_only_hint=False, destructive_hint=False),
    ),
]


async def _list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    _LISTINGS["tools"] += 1
    return types.ListToolsResult(tools=_TOOLS)


def _text(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)])


async def _call_tool(ctx: Any, params: types.CallToolRequestParams) -> Any:
    arguments = params.arguments or {}
    if params.name == "add":
        total = arguments["a"] + arguments["b"]
        return _text(f"{total} (listed {_LISTINGS['tools']} times)")
    if params.name == "region":
        return _text(f"ran {arguments['query']} in {arguments['region']}")
    if params.name == "reheader":
        properties = dict(_TOOLS[1].input_schema["properties"])
        properties["region"] = {"type": "string", "x-mcp-header": "Zone"}
        _TOOLS[1] = _TOOLS[1].model_copy(
            update={"input_schema": {**_TOOLS[1].input_schema, "properties": properties}}
        )
        return _text("the region goes in Mcp-Param-Zone now")
    if params.name == "write_note":
        return _text(f"wrote {arguments['text']}")
    return types.CallToolResult(content=[types.TextContent(type="text", text="?")], is_error=True)


def main() -> None:
    transport = sys.argv[1]
    hints: dict[Any, CacheHint] = {}
    if "--ttl" in sys.argv:
        ttl = int(sys.argv[sys.argv.index("--ttl") + 1])
        hints = {"tools/list": CacheHint(ttl_ms=ttl, scope="private")}
    server: Server[Any] = Server(
        "sdk-revision", on_list_tools=_list_tools, on_call_tool=_call_tool, cache_hints=hints
    )
    if transport == "stdio":
        import anyio
        from mcp.server.stdio import stdio_server

        async def serve() -> None:
            async with stdio_server() as (read, write):
                await server.run(read, write, server.create_initialization_options())

        anyio.run(serve)
        return
    app = server.streamable_http_app(stateless_http="--stateless" in sys.argv)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    print(sock.getsockname()[1], flush=True)
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
