"""A POST whose event stream ends or breaks before its answer, after an event id, is
resumed with GET and Last-Event-ID, so the answer is recovered and the request is never
sent again; a server that will not resume fails the call in one sentence and harms
nothing else (hostile_http.py cuts the stream)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from servers.harness import hostile_http

from agentrt.mcp import Server
from agentrt.mcp._connection import ProtocolViolation, connect

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

_PRIMING = ["id: e1\nretry: 300\ndata: \n\n"]


def _requests(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def _calls_posted(log: Path) -> int:
    return sum(
        1
        for entry in _requests(log)
        if entry["method"] == "POST" and '"tools/call"' in entry["body"]
    )


@pytest.mark.parametrize("cut", ["end_without_answer", "cut_midway"])
async def test_a_stream_cut_before_its_answer_is_resumed_and_the_answer_recovered(
    tmp_path: Path, cut: str
) -> None:
    log = tmp_path / "requests.jsonl"
    scenario = {
        "mode": "sse",
        "log": str(log),
        "on_get": "answer",
        "calls": {"slow": {cut: True, "before_raw": _PRIMING}},
    }
    with hostile_http(scenario) as url:
        connection = await connect(Server(name="remote", endpoint=url))
        try:
            started = time.monotonic()
            result = await connection.call_tool("slow", "{}", timeout=10)
            waited = time.monotonic() - started
        finally:
            await connection.aclose()
        requests = _requests(log)
    assert result == {"content": [{"type": "text", "text": "recovered"}]}
    assert waited >= 0.3  # the server's retry was respected
    assert _calls_posted(log) == 1  # never sent again
    (resumption,) = [entry for entry in requests if entry["method"] == "GET"]
    assert resumption["headers"]["last-event-id"] == "e1"
    assert resumption["headers"]["mcp-session-id"] == "session-7f3a"


@pytest.mark.parametrize(
    ("on_get", "said"),
    [
        ("refuse", "and did not resume it (HTTP 405)"),
        ("empty", "did not answer tools/call in its event stream, resumed 3 times"),
    ],
)
async def test_a_server_that_does_not_resume_fails_the_call_in_one_sentence(
    tmp_path: Path, on_get: str, said: str
) -> None:
    log = tmp_path / "requests.jsonl"
    scenario = {
        "mode": "sse",
        "log": str(log),
        "on_get": on_get,
        "calls": {"slow": {"end_without_answer": True, "before_raw": ["id: e1\nretry: 10\n\n"]}},
    }
    with hostile_http(scenario) as url:
        connection = await connect(Server(name="remote", endpoint=url))
        try:
            with pytest.raises(ProtocolViolation) as caught:
                await connection.call_tool("slow", "{}", timeout=10)
            # Nothing else was harmed: the next call on the session is answered.
            assert await connection.call_tool("ok", "{}", timeout=10)
        finally:
            await connection.aclose()
    assert str(caught.value).startswith('server "remote" ')
    assert said in str(caught.value)
    assert _calls_posted(log) == 2  # "slow" once, "ok" once


async def test_a_stream_without_an_event_id_is_not_resumed(tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    scenario = {
        "mode": "sse",
        "log": str(log),
        "on_get": "answer",
        "calls": {"slow": {"end_without_answer": True}},
    }
    with hostile_http(scenario) as url:
        connection = await connect(Server(name="remote", endpoint=url))
        try:
            with pytest.raises(ProtocolViolation, match="ended its event stream without answering"):
                await connection.call_tool("slow", "{}", timeout=10)
        finally:
            await connection.aclose()
    assert not [entry for entry in _requests(log) if entry["method"] == "GET"]
