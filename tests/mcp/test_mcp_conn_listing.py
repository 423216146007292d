"""`tools/list` from raw bytes: exact keys, every element kept, bounds that fail the listing."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest
from servers.harness import stdio_server

from agentrt.mcp._connection import MAX_TOOL_PAGES, MAX_TOOLS, RawTool, connect
from agentrt.mcp._connection_errors import ProtocolViolation

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


def _tool(name: Any) -> dict[str, Any]:
    return {"name": name, "inputSchema": {"type": "object"}}


def _page(tools: list[Any], next_cursor: str | None = None) -> str:
    result: dict[str, Any] = {"tools": tools}
    if next_cursor is not None:
        result["nextCursor"] = next_cursor
    return json.dumps(result)


async def _list(pages: dict[str, str]) -> list[RawTool]:
    connection = await connect(stdio_server({"pages": pages}))
    try:
        return await connection.list_tools()
    finally:
        await connection.aclose()


async def _refusal(pages: dict[str, str]) -> str:
    with pytest.raises(ProtocolViolation) as caught:
        await _list(pages)
    return str(caught.value)


async def test_pages_are_followed_in_order_by_exact_cursor() -> None:
    tools = await _list(
        {
            "": _page([_tool("a")], "p1"),
            "p1": _page([_tool("b"), _tool("c")], "p2"),
            "p2": _page([_tool("d")]),
        }
    )
    assert [(tool.name, tool.page, tool.position) for tool in tools] == [
        ("a", 0, 0),
        ("b", 1, 0),
        ("c", 1, 1),
        ("d", 2, 0),
    ]


async def test_a_malformed_tool_is_returned_alone_and_the_rest_still_list() -> None:
    raw = (
        '{"tools":['
        '{"name":"good","inputSchema":{"type":"object","properties":{"n":{"maximum":1.50}}}},'
        '{"name":"no_object_schema","inputSchema":{"type":"string"}},'
        '{"name":7,"inputSchema":{"type":"object"}},'
        '"not an object",'
        '{"Name":"wrong_case","inputSchema":{"type":"object"}},'
        '{"name":"also_good","inputSchema":{"type":"object"},"x-extra":{"kept":true}}'
        "]}"
    )
    tools = await _list({"": raw})
    assert [tool.name for tool in tools] == [
        "good",
        "no_object_schema",
        None,
        None,
        None,
        "also_good",
    ]
    maximum = tools[0].raw["inputSchema"]["properties"]["n"]["maximum"]
    assert isinstance(maximum, Decimal) and str(maximum) == "1.50"
    assert tools[3].raw == "not an object"
    assert tools[5].raw["x-extra"] == {"kept": True}  # unknown keys are not dropped


async def test_a_page_with_tools_and_Tools_uses_only_tools() -> None:
    raw = '{"Tools":[{"name":"shadow","inputSchema":{"type":"object"}}],"tools":[]}'
    assert await _list({"": raw}) == []


async def test_a_page_with_only_Tools_is_refused() -> None:
    message = await _refusal({"": '{"Tools":[{"name":"shadow","inputSchema":{}}]}'})
    assert message == (
        'the tool listing of server "hostile" is refused: page 1 has no "tools" member'
    )


async def test_a_NextCursor_key_is_not_a_cursor() -> None:
    raw = '{"tools":[{"name":"a","inputSchema":{"type":"object"}}],"NextCursor":"p1"}'
    tools = await _list({"": raw, "p1": _page([_tool("hidden")])})
    assert [tool.name for tool in tools] == ["a"]


async def test_a_tool_listed_twice_refuses_the_whole_listing() -> None:
    message = await _refusal({"": _page([_tool("read"), _tool("read")])})
    assert 'lists the tool "read" twice' in message


async def test_a_tool_listed_again_on_a_later_page_refuses_the_whole_listing() -> None:
    message = await _refusal(
        {"": _page([_tool("read")], "p1"), "p1": _page([_tool("write"), _tool("read")])}
    )
    assert 'lists the tool "read" twice' in message


async def test_a_repeated_cursor_refuses_the_listing() -> None:
    message = await _refusal({"": _page([_tool("a")], "p1"), "p1": _page([_tool("b")], "p1")})
    assert 'page 2 repeats the cursor "p1"' in message


async def test_a_cursor_that_is_not_a_string_refuses_the_listing() -> None:
    message = await _refusal({"": '{"tools":[],"nextCursor":2}'})
    assert '"nextCursor" is not a string' in message


async def test_exactly_max_tools_are_accepted() -> None:
    tools = await _list({"": _page([_tool(f"t{index}") for index in range(MAX_TOOLS)])})
    assert len(tools) == MAX_TOOLS


async def test_more_than_max_tools_refuse_the_listing() -> None:
    half = MAX_TOOLS // 2
    pages = {
        "": _page([_tool(f"a{index}") for index in range(half)], "p1"),
        "p1": _page([_tool(f"b{index}") for index in range(MAX_TOOLS - half + 1)]),
    }
    message = await _refusal(pages)
    assert f"it offers more than {MAX_TOOLS} tools" in message


def _chain(count: int) -> dict[str, str]:
    pages = {"": _page([_tool("t0")], "p1")}
    for index in range(1, count):
        following = f"p{index + 1}" if index + 1 < count else None
        pages[f"p{index}"] = _page([_tool(f"t{index}")], following)
    return pages


async def test_exactly_max_tool_pages_are_followed() -> None:
    tools = await _list(_chain(MAX_TOOL_PAGES))
    assert len(tools) == MAX_TOOL_PAGES


async def test_more_than_max_tool_pages_refuse_the_listing() -> None:
    message = await _refusal(_chain(MAX_TOOL_PAGES + 1))
    assert f"it has more than {MAX_TOOL_PAGES} pages" in message


async def test_a_page_that_is_not_an_object_refuses_the_listing() -> None:
    message = await _refusal({"": "[]"})
    assert "page 1 is not an object" in message


async def test_a_listing_error_carries_the_stderr_tail() -> None:
    server = stdio_server({"pages": {"": '{"tools":{}}'}, "stderr": "listing is broken\n"})
    connection = await connect(server)
    try:
        with pytest.raises(ProtocolViolation) as caught:
            await connection.list_tools()
    finally:
        await connection.aclose()
    assert str(caught.value).endswith("the server's stderr ends with: listing is broken")
