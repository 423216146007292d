"""The benchmarks' MCP server (stdio): N no-op tools, listed in pages.

    python bench_server.py [--tools N] [--page-size P] [--prefix NAME]

Every tool takes `{"n": integer, "text"?: string}` and answers `ok <n>` at
once, so a measurement is the cost of the path, not of the tool.
"""

from __future__ import annotations

import argparse
from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server


def input_schema(index: int) -> dict[str, Any]:
    """A schema per tool (its descriptions differ), so nothing can share work between tools
    by caching on the schema's text."""
    return {
        "type": "object",
        "properties": {
            "n": {"type": "integer", "minimum": 0, "description": f"any number ({index})"},
            "text": {"type": "string", "maxLength": 4096, "description": f"text ({index})"},
        },
        "required": ["n"],
        "additionalProperties": False,
    }


def tool_names(count: int, prefix: str) -> list[str]:
    return [f"{prefix}_{index:04d}" for index in range(count)]


def build_tools(count: int, prefix: str) -> list[types.Tool]:
    return [
        types.Tool(
            name=name,
            description=f"Answer ok with the number given (benchmark tool {name}).",
            input_schema=input_schema(index),
            annotations=types.ToolAnnotations(read_only_hint=True),
        )
        for index, name in enumerate(tool_names(count, prefix))
    ]


def make_server(count: int, page_size: int, prefix: str) -> Server[Any]:
    tools = build_tools(count, prefix)

    async def list_tools(
        ctx: Any, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        start = int(params.cursor) if params is not None and params.cursor else 0
        end = start + page_size
        next_cursor = str(end) if end < len(tools) else None
        return types.ListToolsResult(tools=tools[start:end], next_cursor=next_cursor)

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        arguments = params.arguments or {}
        text = f"ok {arguments.get('n', 0)}"
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)])

    return Server("agentrt-bench", on_list_tools=list_tools, on_call_tool=call_tool)


async def main(count: int, page_size: int, prefix: str) -> None:
    server = make_server(count, page_size, prefix)
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tools", type=int, default=1)
    parser.add_argument("--page-size", type=int, default=100)
    parser.add_argument("--prefix", default="noop")
    options = parser.parse_args()
    anyio.run(main, options.tools, options.page_size, options.prefix)
