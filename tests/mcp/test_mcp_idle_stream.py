"""The standalone GET event stream of a 2025 HTTP session, held for the session's life by
`Connection.watch_idle` (`mcp/_idle.py`, decision 0049): only for a server that advertises
list changes or subscriptions, opened again when it ends with `Last-Event-ID`, never
asked again after a 405, and closed with the connection."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from servers.harness import hostile_http

from agentrt.mcp import Server
from agentrt.mcp._connection import connect

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

LIST_CHANGED = {"tools": {"listChanged": True}}


def _gets(log: Path) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    return [line for line in lines if line["method"] == "GET"]


async def _watching(scenario: dict[str, Any], seconds: float) -> tuple[list[str], str]:
    """Connect over a legacy session, watch while idle for `seconds`, then call a tool and
    close: the notifications heard, and the call's text."""
    heard: list[str] = []

    async def notified(method: str, _params: dict[str, Any]) -> None:
        heard.append(method)

    with hostile_http(scenario) as url:
        connection = await connect(Server(name="remote", endpoint=url, revision="legacy"))
        connection.on_notification = notified
        async with anyio.create_task_group() as group:
            group.start_soon(connection.watch_idle)
            await anyio.sleep(seconds)
            result = await connection.call_tool("ok", "{}", timeout=10)
            with anyio.fail_after(5):
                await connection.aclose()  # ends the held stream, and so watch_idle
    return heard, result["content"][0]["text"]


async def test_a_held_event_stream_that_ends_is_opened_again_with_last_event_id(
    tmp_path: Path,
) -> None:
    log = tmp_path / "received.jsonl"
    scenario = {"log": str(log), "capabilities": LIST_CHANGED, "on_get": "numbered"}
    heard, text = await _watching(scenario, 1.5)
    assert text == "ok"
    gets = _gets(log)
    # Each stream carried one list change with an event id and `retry: 100`, then ended.
    assert len(gets) >= 3, gets
    assert "last-event-id" not in gets[0]["headers"]
    assert [get["headers"]["last-event-id"] for get in gets[1:3]] == ["e1", "e2"]
    assert heard[:3] == ["notifications/tools/list_changed"] * 3
    assert all(get["headers"]["mcp-session-id"] == "session-7f3a" for get in gets)


async def test_a_server_that_offers_no_event_stream_is_asked_once(tmp_path: Path) -> None:
    log = tmp_path / "received.jsonl"
    heard, text = await _watching({"log": str(log), "capabilities": LIST_CHANGED}, 2.5)
    assert text == "ok"
    assert len(_gets(log)) == 1  # 405: it offers none, and is not asked again
    assert heard == []


async def test_a_server_that_advertises_no_pushes_is_never_asked_for_an_event_stream(
    tmp_path: Path,
) -> None:
    log = tmp_path / "received.jsonl"
    heard, text = await _watching({"log": str(log), "on_get": "numbered"}, 1.0)
    assert text == "ok"
    assert _gets(log) == []
    assert heard == []
