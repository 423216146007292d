"""Malformed and hostile messages from the host, over stdio and streamable HTTP: each is
answered (never dropped in silence), none runs anything, and the proxy serves on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from proxy_helpers import ProxySetup, RawHost, build_setup, text_of, until
from test_proxy_hosts import _listening, free_port

from agentrt.proxy._stdio import MAX_LINE_BYTES

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

PARSE_ERROR = -32700
INVALID_REQUEST = -32600

# (what the host sends, the error code, the id the answer carries)
MALFORMED: list[tuple[str, bytes, int, Any]] = [
    ("invalid UTF-8", b'{"jsonrpc":"2.0","id":3,"method":"ping","x":"\xff"}', PARSE_ERROR, None),
    (
        "a lone surrogate",
        b'{"jsonrpc":"2.0","id":4,"method":"ping","params":{"x":"\\ud800"}}',
        PARSE_ERROR,
        4,
    ),
    (
        "nesting past the limit",
        b'{"jsonrpc":"2.0","id":5,"method":"ping","params":{"x":' + b"[" * 300 + b"]" * 300 + b"}}",
        PARSE_ERROR,
        5,
    ),
    (
        "an over-long integer",
        b'{"jsonrpc":"2.0","id":6,"method":"ping","params":{"n":' + b"9" * 10_001 + b"}}",
        PARSE_ERROR,
        None,
    ),
    (
        "a byte-order mark",
        b'\xef\xbb\xbf{"jsonrpc":"2.0","id":7,"method":"ping"}',
        PARSE_ERROR,
        None,
    ),
    ("a NUL byte", b'{"jsonrpc":"2.0","id":8,"method":"pi\x00ng"}', PARSE_ERROR, None),
    ('"jsonrpc": "1.0"', b'{"jsonrpc":"1.0","id":9,"method":"ping"}', INVALID_REQUEST, 9),
    ("a batch", b'[{"jsonrpc":"2.0","id":10,"method":"ping"}]', INVALID_REQUEST, None),
    ("id 1.5", b'{"jsonrpc":"2.0","id":1.5,"method":"ping"}', INVALID_REQUEST, None),
    ("id true", b'{"jsonrpc":"2.0","id":true,"method":"ping"}', INVALID_REQUEST, None),
    ("id {}", b'{"jsonrpc":"2.0","id":{},"method":"ping"}', INVALID_REQUEST, None),
    ("id []", b'{"jsonrpc":"2.0","id":[],"method":"ping"}', INVALID_REQUEST, None),
    (
        "an id no peer can hold",
        b'{"jsonrpc":"2.0","id":' + b"9" * 40 + b',"method":"ping"}',
        INVALID_REQUEST,
        None,
    ),
    ("no method, result or error", b'{"jsonrpc":"2.0","id":11}', INVALID_REQUEST, 11),
]

REPEATED_KEYS: list[tuple[str, bytes]] = [
    (
        "a repeated key in the arguments",
        b'{"jsonrpc":"2.0","id":21,"method":"tools/call","params":{"name":"up_write_note",'
        b'"arguments":{"note":"a","note":"b"}}}',
    ),
    (
        "a repeated name",
        b'{"jsonrpc":"2.0","id":21,"method":"tools/call","params":{"name":"up_echo",'
        b'"name":"up_write_note","arguments":{"note":"n"}}}',
    ),
]


async def _next_line(raw: RawHost) -> dict[str, Any]:
    with anyio.fail_after(30):
        return dict(json.loads(await raw._reader.receive_until(b"\n", 1 << 22)))


def _refusal_lines(setup: ProxySetup) -> list[str]:
    return [
        line
        for line in setup.stderr().splitlines()
        if "refused a message from the host" in line or "was refused before the gate" in line
    ]


async def test_every_malformed_host_message_gets_the_json_rpc_error_the_spec_names(
    tmp_path: Path,
) -> None:
    setup = await build_setup(tmp_path)
    answers: dict[str, dict[str, Any]] = {}
    async with RawHost.start(setup) as raw:
        for name, line, _code, _id in MALFORMED:
            await raw.process.stdin.send(line + b"\n")
            answers[name] = await _next_line(raw)
        after = await raw.request(
            "tools/call", {"name": "up_echo", "arguments": {"text": "still serving"}}
        )
    for name, _line, code, request_id in MALFORMED:
        answer = answers[name]
        assert answer["jsonrpc"] == "2.0", name
        assert answer["error"]["code"] == code, (name, answer)
        assert answer["id"] == request_id, (name, answer)
    assert "".join(block["text"] for block in after["result"]["content"]) == "still serving"
    # One line for the operator per refused message, never silence.
    assert len(_refusal_lines(setup)) == len(MALFORMED), setup.stderr()
    assert setup.executions() == []


@pytest.mark.parametrize(("case", "line"), REPEATED_KEYS, ids=[case for case, _ in REPEATED_KEYS])
async def test_a_repeated_key_from_the_host_is_invalid_and_nothing_runs(
    tmp_path: Path, case: str, line: bytes
) -> None:
    setup = await build_setup(tmp_path)
    async with RawHost.start(setup) as raw:
        await raw.process.stdin.send(line + b"\n")
        refused = await raw.response(21)
        after = await raw.request(
            "tools/call", {"name": "up_write_note", "arguments": {"note": "after"}}
        )
    text = "".join(block["text"] for block in refused["result"]["content"])
    assert text.startswith("INVALID: "), text
    assert "is repeated in one object" in text
    assert refused["result"]["isError"] is True
    assert "".join(block["text"] for block in after["result"]["content"]) == "noted after"
    assert setup.executions() == ["write_note after"]
    assert len(_refusal_lines(setup)) == 1


@pytest.mark.slow
async def test_bytes_after_the_cut_of_an_over_long_line_never_run(tmp_path: Path) -> None:
    setup = await build_setup(tmp_path)
    smuggled = (
        b'{"jsonrpc":"2.0","id":31,"method":"tools/call","params":{"name":"up_write_note",'
        b'"arguments":{"note":"smuggled"}}}'
    )
    async with RawHost.start(setup) as raw:
        # Whitespace is valid before a JSON value: were the tail after the cut
        # read as a line of its own, it would be a well-formed tools/call.
        await raw.process.stdin.send(b" " * (MAX_LINE_BYTES + 1) + smuggled + b"\n")
        cut = await _next_line(raw)
        after = await raw.request(
            "tools/call", {"name": "up_write_note", "arguments": {"note": "after"}}
        )
    assert cut["error"]["code"] == INVALID_REQUEST
    assert cut["id"] is None
    assert "discarded whole" in cut["error"]["message"]
    assert "".join(block["text"] for block in after["result"]["content"]) == "noted after"
    assert setup.executions() == ["write_note after"]


# -- streamable HTTP ---------------------------------------------------------

_INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "raw-http", "version": "0"},
    },
}
_ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


async def _http_proxy(setup: ProxySetup, port: int) -> Any:
    errlog = setup.stderr_path.open("a")
    process = await anyio.open_process(
        [*setup.command(), "--http", f"127.0.0.1:{port}"],
        stderr=errlog, env=setup.environment(), cwd=str(setup.root),
    )  # fmt: skip
    await until(lambda: _listening(port), 30)
    return process, errlog


async def test_over_http_a_repeated_key_is_invalid_and_a_malformed_body_is_answered(
    tmp_path: Path,
) -> None:
    setup = await build_setup(tmp_path)
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    process, errlog = await _http_proxy(setup, port)
    try:
        async with httpx2.AsyncClient(headers=_ACCEPT, timeout=30) as client:
            opened = await client.post(url, content=json.dumps(_INITIALIZE))
            session = {"mcp-session-id": opened.headers["mcp-session-id"]}
            await client.post(
                url, headers=session,
                content=json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}),
            )  # fmt: skip
            repeated = await client.post(url, headers=session, content=REPEATED_KEYS[0][1])
            batch = await client.post(url, headers=session, content=MALFORMED[7][1])
            not_utf8 = await client.post(url, headers=session, content=MALFORMED[0][1])
        async with (
            streamable_http_client(url) as (read_stream, write_stream),
            ClientSession(read_stream, write_stream) as sdk_session,
        ):
            await sdk_session.initialize()
            after = await sdk_session.call_tool("up_write_note", {"note": "after"})
    finally:
        process.terminate()
        with anyio.fail_after(20):
            await process.wait()
        errlog.close()
    answer = repeated.json()
    assert repeated.status_code == 200
    assert answer["id"] == 21
    assert answer["result"]["isError"] is True
    assert answer["result"]["content"][0]["text"].startswith("INVALID: ")
    assert batch.status_code == 400
    assert batch.json()["error"]["code"] == INVALID_REQUEST
    assert not_utf8.json()["error"]["code"] == PARSE_ERROR
    assert not_utf8.json()["id"] is None
    assert text_of(after) == "noted after"
    assert setup.executions() == ["write_note after"]
