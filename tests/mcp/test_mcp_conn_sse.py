"""The SSE reader: any line ending and any chunking give the same events."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator

import anyio
import httpx2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrt.mcp._connection_errors import ProtocolViolation
from agentrt.mcp._http import MAX_RESPONSE_BODY_BYTES, _sse_data
from agentrt.mcp._server import Server

_SERVER = Server(name="sse", endpoint="http://127.0.0.1:9/mcp")


class _Chunks(httpx2.AsyncByteStream):
    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self._chunks:
            yield chunk


def _events(body: bytes, cuts: list[int]) -> list[bytes]:
    positions = sorted({cut % (len(body) + 1) for cut in cuts} | {0, len(body)})
    chunks = [body[start:end] for start, end in itertools.pairwise(positions)]
    response = httpx2.Response(
        200, headers={"content-type": "text/event-stream"}, stream=_Chunks(chunks)
    )

    async def collect() -> list[bytes]:
        return [data async for data in _sse_data(response, _SERVER)]

    return anyio.run(collect)


_DATA = st.lists(
    st.text(alphabet=st.characters(blacklist_characters="\r\n", codec="utf-8"), max_size=20),
    min_size=1,
    max_size=3,
)


@settings(max_examples=300, deadline=None)
@given(
    events=st.lists(st.tuples(st.sampled_from(["", "message", "other"]), _DATA), max_size=5),
    newline=st.sampled_from([b"\n", b"\r\n", b"\r"]),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=8),
)
def test_sse_events_survive_any_line_ending_and_any_chunking(
    events: list[tuple[str, list[str]]], newline: bytes, cuts: list[int]
) -> None:
    body = b": opening comment" + newline + newline
    expected: list[bytes] = []
    for event_type, data_lines in events:
        if event_type:
            body += b"event: " + event_type.encode() + newline
        for line in data_lines:
            body += b"data: " + line.encode() + newline
        body += newline
        if event_type in ("", "message"):
            expected.append(b"\n".join(line.encode() for line in data_lines))
    assert _events(body, cuts) == expected


def test_an_event_cut_off_by_the_end_of_the_stream_is_dropped() -> None:
    assert _events(b"data: complete\n\ndata: cut off", []) == [b"complete"]


def test_data_without_a_space_after_the_colon_is_kept_whole() -> None:
    assert _events(b"data:x\ndata:  two spaces\n\n", []) == [b"x\n two spaces"]


def test_an_sse_body_over_the_cap_is_refused_while_streaming() -> None:
    chunk = b": " + b"x" * (1024 * 1024) + b"\n"
    count = MAX_RESPONSE_BODY_BYTES // len(chunk) + 2
    response = httpx2.Response(
        200, headers={"content-type": "text/event-stream"}, stream=_Chunks([chunk] * count)
    )

    async def collect() -> list[bytes]:
        return [data async for data in _sse_data(response, _SERVER)]

    with pytest.raises(ProtocolViolation):
        anyio.run(collect)
