"""The upstream client on either revision: `server/discover` first, the legacy handshake
as the fallback, stateless requests with the `_meta` envelope, the HTTP headers the
revision mirrors, listings kept per `ttlMs`, and the revision remembered in the manifest.

The modern servers are built with the official SDK (`servers/sdk_revision.py`, which
speaks both eras) or scripted (`hostile_stdio.py`, for what a real server would not do).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from servers.harness import HOSTILE_STDIO, http_server, process_gone, stdio_server, wait_until

from agentrt import ToolCall
from agentrt.mcp import LoadError, Rule, Server, ServerToolError, load, pin
from agentrt.mcp._connection import ServerErrorResponse, connect
from agentrt.mcp._context import CallContext
from agentrt.mcp._manifest import Manifest
from agentrt.mcp._revision import MAX_LISTING_TTL_MS, MODERN_REVISION
from agentrt.tools import SideEffect

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

SDK_REVISION = Path(__file__).parent / "servers" / "sdk_revision.py"

_DISCOVERED = json.dumps(
    {"supportedVersions": [MODERN_REVISION], "capabilities": {"tools": {}}, "_meta": {}}
)
_ENVELOPE_KEYS = {
    "io.modelcontextprotocol/protocolVersion",
    "io.modelcontextprotocol/clientInfo",
    "io.modelcontextprotocol/clientCapabilities",
}


def _sdk_stdio(*arguments: str, **settings: Any) -> Server:
    settings.setdefault("revision", "auto")
    return Server(
        name="sdk", command=[sys.executable, str(SDK_REVISION), "stdio", *arguments], **settings
    )


def _received(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def _modern(log: Path, **scenario: Any) -> Server:
    """A scripted stdio server that answers server/discover naming the revision."""
    methods = {"server/discover": {"result": _DISCOVERED}, **scenario.pop("methods", {})}
    return stdio_server({"log": str(log), "methods": methods, **scenario}, revision="auto")


async def test_a_modern_sdk_server_is_spoken_to_statelessly_with_the_envelope() -> None:
    connection = await connect(_sdk_stdio())
    try:
        assert connection.modern
        assert connection.protocol_version == MODERN_REVISION
        assert connection.server_info == {"name": "sdk-revision", "version": ""}
        assert [tool.name for tool in await connection.list_tools()] == [
            "add",
            "region",
            "reheader",
            "write_note",
        ]
        result = await connection.call_tool("add", '{"a":2,"b":3}', timeout=10)
        assert result["content"][0]["text"].startswith("5 ")
        assert connection.notes == []
    finally:
        await connection.aclose()


async def test_every_modern_request_carries_the_envelope_and_no_handshake_is_sent(
    tmp_path: Path,
) -> None:
    log = tmp_path / "received.jsonl"
    connection = await connect(_modern(log), on_step=lambda _step: None)
    try:
        await connection.list_tools()
        await connection.call_tool("ok", '{"x":1.50}', timeout=5, progress=_ignore)
    finally:
        await connection.aclose()
    received = _received(log)
    assert [message.get("method") for message in received] == [
        "server/discover",
        "tools/list",
        "tools/call",
    ]
    for message in received:
        assert set(message["params"]["_meta"]) >= _ENVELOPE_KEYS
        assert message["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] == (
            MODERN_REVISION
        )
    call = received[2]["params"]
    assert call["_meta"]["progressToken"] == "agentrt-1"
    # The arguments are still sent as the exact text given.
    assert '"arguments":{"x":1.50}' in log.read_text().splitlines()[2]


async def _ignore(*_args: Any) -> None:
    return None


async def test_over_http_requests_carry_mcp_method_name_and_x_mcp_header_parameters() -> None:
    with http_server(SDK_REVISION, "http", "--stateless") as url:
        connection = await connect(Server(name="remote", endpoint=url, revision="auto"))
        try:
            assert connection.modern
            await connection.list_tools()
            # A value that is not plain ASCII goes as the base64 sentinel; the SDK server
            # rejects a call whose Mcp-Param-Region is missing or disagrees with the body.
            result = await connection.call_tool(
                "region", '{"region":"eu-wést","query":"q"}', timeout=10
            )
            assert result["content"][0]["text"] == "ran q in eu-wést"
            connection._header_maps.clear()  # as if the annotation had never been read
            # HeaderMismatch (the header was needed): the tools are listed again, and the
            # call sent once more with it (test_mcp_header_retry.py).
            told: list[str] = []
            again = await connection.call_tool_checked(
                "region", '{"region":"eu","query":"q"}', timeout=10, on_retry=told.append
            )
            assert again["content"][0]["text"] == "ran q in eu"
            assert len(told) == 1 and "(HeaderMismatch)" in told[0]
        finally:
            await connection.aclose()


async def test_a_tool_with_invalid_x_mcp_header_annotations_is_left_out_and_said(
    tmp_path: Path,
) -> None:
    tools = [
        {"name": "fine", "inputSchema": {"type": "object"}},
        {
            "name": "bad",
            "inputSchema": {
                "type": "object",
                "properties": {"n": {"type": "number", "x-mcp-header": "N"}},
            },
        },
    ]
    page = json.dumps({"tools": tools})
    with http_server(
        Path(__file__).parent / "servers" / "hostile_http.py",
        json.dumps({"methods": {"server/discover": _DISCOVERED}, "pages": {"": page}}),
    ) as url:
        connection = await connect(Server(name="remote", endpoint=url, revision="auto"))
        try:
            assert connection.modern
            listed = [tool.name for tool in await connection.list_tools()]
        finally:
            await connection.aclose()
    assert listed == ["fine"]
    assert any('lists the tool "bad" with invalid x-mcp-header' in n for n in connection.notes)


async def test_listings_are_kept_per_ttl_ms_and_asked_again_when_it_ends() -> None:
    connection = await connect(_sdk_stdio("--ttl", "60000"))
    try:
        for _ in range(3):
            await connection.list_tools()
        result = await connection.call_tool("add", '{"a":1,"b":1}', timeout=10)
        assert result["content"][0]["text"] == "2 (listed 1 times)"
        connection.forget_listings()
        await connection.list_tools()
        result = await connection.call_tool("add", '{"a":1,"b":1}', timeout=10)
        assert result["content"][0]["text"] == "2 (listed 2 times)"
    finally:
        await connection.aclose()


@pytest.mark.parametrize(
    ("ttl", "kept", "note"),
    [
        ("0", False, None),
        ("-5", False, "a ttlMs of -5, which is not a lifetime in milliseconds"),
        ('"soon"', False, "a ttlMs of soon, which is not a lifetime"),
        ("1000000000000", True, None),
    ],
)
async def test_bad_ttl_values_keep_nothing_and_an_enormous_one_is_capped(
    tmp_path: Path, ttl: str, kept: bool, note: str | None
) -> None:
    log = tmp_path / "received.jsonl"
    page = '{"tools":[{"name":"t","inputSchema":{"type":"object"}}],"ttlMs":' + ttl + "}"
    connection = await connect(_modern(log, pages={"": page}))
    try:
        await connection.list_tools()
        await connection.list_tools()
        listings = [m for m in _received(log) if m.get("method") == "tools/list"]
        assert len(listings) == (1 if kept else 2)
        if kept:
            (until, _result), *_ = connection._listings.values()
            assert until - anyio.current_time() <= MAX_LISTING_TTL_MS / 1000
        if note is None:
            assert connection.notes == []
        else:
            assert len(connection.notes) == 1
            assert note in connection.notes[0]
        # Nothing else was harmed: the session still serves calls.
        assert (await connection.call_tool("ok", "{}", timeout=5))["content"][0]["text"] == "ok"
    finally:
        await connection.aclose()


@pytest.mark.parametrize(
    ("discover", "said"),
    [
        ({"result": '"garbage"'}, "is not a discover result"),
        ({"result": '{"supportedVersions":"2026-07-28"}'}, "is not a discover result"),
        ({"line": "this is not JSON {id}"}, None),
        ({"error": {"code": -32601, "message": "Method not found"}}, None),
        (
            {
                "error": {
                    "code": -32022,
                    "message": "Unsupported protocol version",
                    "data": {"supported": ["2025-11-25"], "requested": MODERN_REVISION},
                }
            },
            None,
        ),
    ],
)
async def test_a_discover_answer_that_is_not_modern_falls_back_to_the_handshake(
    tmp_path: Path, discover: dict[str, Any], said: str | None
) -> None:
    log = tmp_path / "received.jsonl"
    connection = await connect(
        stdio_server({"log": str(log), "methods": {"server/discover": discover}}, revision="auto")
    )
    try:
        assert not connection.modern
        assert connection.protocol_version == "2025-11-25"
        assert [tool.name for tool in await connection.list_tools()][:1] == ["env"]
        if said is not None:
            assert len(connection.notes) == 1 and said in connection.notes[0]
    finally:
        await connection.aclose()
    assert [m.get("method") for m in _received(log)][:2] == ["server/discover", "initialize"]


async def test_a_modern_only_server_sharing_no_revision_is_refused_in_one_sentence(
    tmp_path: Path,
) -> None:
    error = {
        "code": -32022,
        "message": "Unsupported protocol version",
        "data": {"supported": ["2027-01-01"], "requested": MODERN_REVISION},
    }
    server = stdio_server({"methods": {"server/discover": {"error": error}}}, revision="auto")
    with pytest.raises(Exception) as caught:
        await connect(server)
    assert str(caught.value).startswith(
        'server "hostile" speaks only protocol versions 2027-01-01, which this client '
        "does not speak"
    )


async def test_a_server_silent_on_discover_falls_back_within_the_probes_bound(
    tmp_path: Path,
) -> None:
    server = stdio_server(
        {"methods": {"server/discover": {"never": True}}}, connect_timeout=4, revision="auto"
    )
    started = time.monotonic()
    with anyio.fail_after(4):
        connection = await connect(server)
    try:
        assert time.monotonic() - started < 3.5  # half the caller's budget at most
        assert not connection.modern
        assert "did not answer server/discover within" in connection.notes[0]
        assert await connection.call_tool("ok", "{}", timeout=5)
    finally:
        await connection.aclose()


async def test_revision_legacy_never_probes(tmp_path: Path) -> None:
    log = tmp_path / "received.jsonl"
    refused = {"error": {"code": -32022, "message": "Unsupported protocol version"}}
    modern_only = _modern(log, initialize=refused)
    with pytest.raises(ServerErrorResponse):
        await connect(Server(name="hostile", command=modern_only.command, revision="legacy"))
    assert [message.get("method") for message in _received(log)] == ["initialize"]


async def test_the_pins_are_the_same_whichever_revision_the_tools_were_listed_over() -> None:
    modern = await pin(_sdk_stdio())
    legacy = await pin(_sdk_stdio(revision="session"))
    assert modern.revision == MODERN_REVISION
    assert legacy.revision == "2025-11-25"

    def without_revision_and_time(manifest: Manifest) -> str:
        lines = manifest.to_json().splitlines()
        return "\n".join(
            line for line in lines if not line.lstrip().startswith(('"revision"', '"pinned_at"'))
        )

    assert without_revision_and_time(modern) == without_revision_and_time(legacy)
    assert '"revision": "2026-07-28"' in modern.to_json()


def test_a_manifest_without_a_revision_still_loads_and_one_with_a_bad_revision_is_refused() -> None:
    old = '{"pinned_at": "2026-01-02T03:04:05.000000Z", "server": "s", "tools": {}}'
    assert Manifest.from_json(old).revision is None
    assert "revision" not in Manifest.from_json(old).to_json()
    with pytest.raises(Exception, match='"revision" must be a non-empty string'):
        Manifest.from_json(old[:-1] + ', "revision": 7}')


async def test_a_server_that_flips_revision_between_pin_and_load_is_refused(
    tmp_path: Path,
) -> None:
    scenario = tmp_path / "scenario.json"
    scenario.write_text(json.dumps({"methods": {"server/discover": {"result": _DISCOVERED}}}))
    command = [sys.executable, str(HOSTILE_STDIO), str(scenario)]
    server = Server(name="hostile", command=command, default_timeout=5, revision="auto")
    manifest = await pin(server)
    assert manifest.revision == MODERN_REVISION
    scenario.write_text("{}")  # the same server, now on the legacy handshake only
    rules = {"ok": Rule(side_effect=SideEffect.READ_ONLY)}
    with pytest.raises(LoadError) as refused:
        await load(server, manifest, rules, log=lambda _line: None)
    assert str(refused.value) == (
        'server "hostile" now speaks protocol revision 2025-11-25 but was pinned over '
        "2026-07-28; it is refused until `agentrt pin` is run again and the result reviewed"
    )
    # Nothing else was harmed: pinned again, it loads and calls.
    again = await pin(server)
    tools, report = await load(server, again, rules, log=lambda _line: None)
    try:
        assert len(tools) == 1
    finally:
        assert report.connection is not None
        await report.connection.aclose()


async def test_input_required_rounds_on_the_revision_carry_the_envelope_each_time(
    tmp_path: Path,
) -> None:
    log = tmp_path / "rounds.log"
    script = Path(__file__).resolve().parents[1] / "proxy" / "servers" / "input_required_server.py"
    server = Server(
        name="asking",
        command=[sys.executable, str(script)],
        env=[f"INPUT_REQUIRED_LOG={log}", "INPUT_REQUIRED_MODERN=1"],
        revision="auto",
    )
    asked: list[str] = []

    async def ask(method: str, params: Any) -> dict[str, Any]:
        asked.append(method)
        return {"action": "accept", "content": {"username": "Ada"}}

    connection = await connect(server)
    try:
        assert connection.modern
        result = await connection.call_tool(
            "ask_name", "{}", timeout=10, context=CallContext(ask=ask)
        )
    finally:
        await connection.aclose()
    assert result["content"][0]["text"] == "Hello, Ada (accept)"
    assert asked == ["elicitation/create"]
    assert log.read_text().splitlines() == [
        "tools/call ask_name first",
        "tools/call ask_name answered",
    ]


async def test_session_mode_keeps_a_session_with_a_dual_era_server_and_goes_modern_without_one(
    tmp_path: Path,
) -> None:
    dual = await connect(_sdk_stdio(revision="session"))
    await dual.aclose()
    assert not dual.modern and dual.protocol_version == "2025-11-25"
    log = tmp_path / "received.jsonl"
    refused = {
        "error": {
            "code": -32022,
            "message": "Unsupported protocol version",
            "data": {"supported": [MODERN_REVISION], "requested": "2025-11-25"},
        }
    }
    modern_only = _modern(log, initialize=refused)
    connection = await connect(
        Server(name="hostile", command=modern_only.command, revision="session")
    )
    try:
        assert connection.modern
        assert connection.notes == []
        assert (await connection.call_tool("ok", "{}", timeout=5))["content"][0]["text"] == "ok"
    finally:
        await connection.aclose()
    methods = [message.get("method") for message in _received(log)]
    assert methods[:3] == ["initialize", "server/discover", "tools/call"]


async def test_a_server_restarted_on_the_other_era_is_refused_and_nothing_runs(
    tmp_path: Path,
) -> None:
    scenario = tmp_path / "scenario.json"
    scenario.write_text(json.dumps({"methods": {"server/discover": {"result": _DISCOVERED}}}))
    command = [sys.executable, str(HOSTILE_STDIO), str(scenario)]
    server = Server(name="srv", command=command, default_timeout=10, revision="auto")
    manifest = await pin(server)
    rules = {name: Rule(side_effect=SideEffect.LOCAL_MUTATION) for name in ("ok", "pid")}
    lines: list[str] = []
    tools, report = await load(server, manifest, rules, log=lines.append)
    by_name = {tool.spec.name[4:]: tool for tool in tools}
    assert report.connection is not None
    try:
        first = await by_name["pid"].call(ToolCall(args="{}", tool="srv_pid", run_id="r", step=1))
        scenario.write_text("{}")  # started again, it speaks only the handshake
        pid = json.loads(first.content)["pid"]
        os.kill(pid, signal.SIGKILL)
        assert wait_until(lambda: process_gone(pid))
        with pytest.raises(ServerToolError) as refused:
            await by_name["ok"].call(ToolCall(args="{}", tool="srv_ok", run_id="r", step=2))
        assert refused.value.outcome_known
        assert "now speaks protocol revision 2025-11-25 but was pinned over 2026-07-28" in (
            str(refused.value)
        )
        assert len(lines) == 1 and "now speaks protocol revision" in lines[0]
    finally:
        await report.connection.aclose()


async def test_auto_probes_again_when_the_handshake_after_a_late_probe_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A dual-era server slow to answer the first probe (a stdio server still starting) is
    # set on the revision by it, and refuses the handshake that follows naming its version.
    monkeypatch.setattr("agentrt.mcp._revision.DISCOVER_TIMEOUT", 0.5)
    refused = {
        "error": {
            "code": -32022,
            "message": "connection is serving the 2026-07-28 protocol",
            "data": {"supported": [MODERN_REVISION], "requested": "2025-11-25"},
        }
    }
    log = tmp_path / "log"
    server = _modern(
        log,
        methods={"server/discover": {"result": _DISCOVERED, "sleep_first": 1.5}},
        initialize=refused,
    )
    connection = await connect(server)
    try:
        assert connection.modern
        assert connection.protocol_version == MODERN_REVISION
        result = await connection.call_tool("ok", "{}", timeout=5)
        assert result["content"][0]["text"] == "ok"
    finally:
        await connection.aclose()
    methods = [message.get("method") for message in _received(log)]
    assert methods[:3] == ["server/discover", "initialize", "server/discover"]
