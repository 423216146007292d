"""How a server's tools/call result becomes a ToolResult: structured, text, capped, or an error."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrt.canonical import parse_json
from agentrt.mcp import ServerToolError
from agentrt.mcp._tool import TRUNCATION_MARKER, cap_text, map_result


def _result(raw: bytes) -> object:
    return parse_json(raw)


def test_structured_content_keeps_big_integers_and_decimal_literals() -> None:
    result = _result(
        b'{"content":[{"type":"text","text":"ignored"}],'
        b'"structuredContent":{"id":9007199254740993,"price":1.50,"name":"x"}}'
    )
    mapped = map_result("shop", "order", result, 1024)
    assert mapped.content == '{"id":9007199254740993,"name":"x","price":1.50}'
    assert mapped.summary == f"shop/order: {len(mapped.content)} bytes"


def test_text_blocks_are_joined_and_other_blocks_become_placeholders() -> None:
    result = _result(
        b'{"content":['
        b'{"type":"text","text":"first"},'
        b'{"type":"image","data":"AAAA","mimeType":"image/png"},'
        b'{"type":"audio","data":"AAAA","mimeType":"audio/wav"},'
        b'{"type":"resource_link","uri":"file:///x","name":"x"},'
        b'{"type":"resource","resource":{"uri":"file:///y","text":"secret"}},'
        b'{"type":"hologram"},'
        b'{"type":"text","text":"last"}]}'
    )
    mapped = map_result("srv", "t", result, 4096)
    assert json.loads(mapped.content) == (
        "first\n[image omitted]\n[audio omitted]\n[resource link omitted]\n"
        "[embedded resource omitted]\n[content omitted]\nlast"
    )
    assert "AAAA" not in mapped.content and "secret" not in mapped.content


def test_a_200_kb_text_result_is_capped_with_the_marker_counted_inside() -> None:
    text = "line of output\n" * (200 * 1024 // 15)
    result = {"content": [{"type": "text", "text": text}]}
    mapped = map_result("srv", "dump", result, 64 * 1024)
    assert len(mapped.content.encode()) <= 64 * 1024
    assert len(mapped.content.encode()) > 64 * 1024 - 16
    decoded = json.loads(mapped.content)
    assert decoded.endswith(TRUNCATION_MARKER)
    assert text.startswith(decoded.removesuffix(TRUNCATION_MARKER))
    assert mapped.summary == f"srv/dump: {len(mapped.content.encode())} bytes, truncated"


def test_the_cap_counts_json_escaping() -> None:
    # Each quote costs two bytes encoded; a cap on characters would overshoot.
    mapped = map_result("srv", "t", {"content": [{"type": "text", "text": '"' * 1000}]}, 100)
    assert len(mapped.content.encode()) <= 100
    assert json.loads(mapped.content) == '"' * 42 + TRUNCATION_MARKER


def test_the_cut_falls_on_a_code_point_boundary() -> None:
    text = "€" * 100  # three bytes each
    content, truncated = cap_text(text, 64)
    assert truncated
    assert len(content.encode()) <= 64
    decoded = json.loads(content)
    assert set(decoded.removesuffix(TRUNCATION_MARKER)) == {"€"}


@settings(max_examples=200, deadline=None)
@given(text=st.text(), cap=st.integers(min_value=64, max_value=400))
def test_capped_content_never_exceeds_the_cap_and_is_a_prefix(text: str, cap: int) -> None:
    content, truncated = cap_text(text, cap)
    assert len(content.encode()) <= cap
    decoded = json.loads(content)
    if truncated:
        assert decoded.endswith(TRUNCATION_MARKER)
        assert text.startswith(decoded.removesuffix(TRUNCATION_MARKER))
    else:
        assert decoded == text


def test_structured_content_over_the_cap_is_dropped_for_the_text_not_cut() -> None:
    result = {
        "content": [{"type": "text", "text": "summary text"}],
        "structuredContent": {"rows": ["x" * 100] * 20},
    }
    mapped = map_result("srv", "rows", result, 256)
    assert json.loads(mapped.content) == "summary text"
    structured_bytes = len(json.dumps(result["structuredContent"], separators=(",", ":")))
    assert mapped.summary == (
        f"srv/rows: 14 bytes, structured content of {structured_bytes} bytes dropped for the text"
    )


def test_is_error_becomes_a_tool_error_naming_the_server_with_text_escaped() -> None:
    result = {"isError": True, "content": [{"type": "text", "text": "no such file\x1b[2J"}]}
    with pytest.raises(ServerToolError) as caught:
        map_result("fs", "read_file", result, 1024)
    message = str(caught.value)
    assert 'server "fs"' in message
    assert "no such file\\x1b[2J" in message
    assert "\x1b" not in message


def test_an_input_required_result_is_a_tool_error() -> None:
    result = {"resultType": "input_required", "inputRequests": {"a": {"method": "roots/list"}}}
    with pytest.raises(ServerToolError, match="asked for more input"):
        map_result("fs", "read_file", result, 1024)


def test_a_result_that_is_not_an_object_is_a_tool_error() -> None:
    with pytest.raises(ServerToolError, match='server "fs"'):
        map_result("fs", "t", ["not", "an", "object"], 1024)
