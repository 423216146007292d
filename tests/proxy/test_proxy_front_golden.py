"""The stdio front's answers and refusals, byte for byte, against a transcript recorded
before the front changed (issue 36, decision 0057): each line a host may send, well formed
or not, in either era, and every line the proxy wrote back before the next `ping` fence.

A change to how the front parses, checks or shapes its messages (plain dicts in place of
the SDK's pydantic models) must leave these bytes alone, the SDK's error messages
included.  `AGENTRT_RECORD_FRONT_GOLDEN=1` writes the transcripts anew: only on a commit
whose front is the reference, never to make a failing run pass; with
`AGENTRT_FRONT_GOLDEN_SRC=<a checkout of that commit>/src` the proxy that records runs
that checkout's code (the lines added with decision 0061 were recorded so, on 41054fb,
the front before it read plain JSON)."""

from __future__ import annotations

import json
import os
from importlib.metadata import version
from pathlib import Path
from typing import Any, Final

import anyio
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream
from proxy_helpers import build_setup

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

GOLDEN: Final = Path(__file__).parent / "golden"
_RECORD: Final = os.environ.get("AGENTRT_RECORD_FRONT_GOLDEN") == "1"
# Where the recorded front's code is (another checkout's `src`), when recording.
_REFERENCE: Final = os.environ.get("AGENTRT_FRONT_GOLDEN_SRC") if _RECORD else None

_CLIENT: Final = {"name": "golden-host", "version": "1"}
_INITIALIZE: Final = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": _CLIENT}
_ENVELOPE: Final = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientInfo": _CLIENT,
    "io.modelcontextprotocol/clientCapabilities": {},
}


def _line(message: Any) -> bytes:
    return json.dumps(message).encode()


def _request(request_id: Any, method: str, params: Any = None, **extra: Any) -> bytes:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        message["params"] = params
    return _line({**message, **extra})


def _modern(request_id: Any, method: str, params: dict[str, Any] | None = None) -> bytes:
    return _request(request_id, method, {**(params or {}), "_meta": _ENVELOPE})


# A host of the handshake era: refusals before and after `initialize`, then the methods
# every host sends, each well formed and not.
HANDSHAKE_ERA: Final[list[bytes]] = [
    b"this is not json",
    b"[]",
    b"42",
    b'{"jsonrpc": "2.0"}',
    _line({"jsonrpc": "1.0", "id": 1, "method": "ping"}),
    _line({"jsonrpc": "2.0", "id": 2}),
    _line({"jsonrpc": "2.0", "id": {"an": "object"}, "method": "ping"}),
    _request(3, "tools/list"),
    _request(4, "initialize", {"protocolVersion": 5, "capabilities": {}, "clientInfo": _CLIENT}),
    _request(5, "initialize", {"capabilities": {}}),
    _request(6, "initialize", _INITIALIZE),
    _line({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    _request(7, "tools/list"),
    _request(8, "tools/list", {"cursor": 3}),
    _request(9, "tools/list", "not an object"),
    _request(10, "tools/call"),
    _request(11, "tools/call", {"arguments": {"text": "x"}}),
    _request(12, "tools/call", {"name": "no_such_tool", "arguments": {}}),
    _request(13, "tools/call", {"name": "up_echo", "arguments": {"text": 5}}),
    _request(14, "tools/call", {"name": "up_echo", "arguments": {}}),
    _request(15, "tools/call", {"name": "up_echo", "arguments": "text"}),
    _request(16, "tools/call", {"name": 7, "arguments": {}}),
    _request(
        17,
        "tools/call",
        {"name": "up_echo", "arguments": {"text": 'héllo \u2028 "q"', "seconds": 0}},
    ),
    _request(
        "string-id", "tools/call", {"name": "up_echo", "arguments": {"text": "again", "seconds": 0}}
    ),
    _request(18, "ping", {"_meta": {"k": 1}}),
    _request(19, "no/such/method", {}),
    _line({"jsonrpc": "2.0", "method": "notifications/no-such", "params": {}}),
    _line({"jsonrpc": "2.0", "id": 20, "result": {}}),
    _request(21, "initialize", _INITIALIZE),
    _request(22, "server/discover"),
    # Added with decision 0061, recorded on 41054fb (the front before it read plain JSON).
    _request(23, "prompts/list"),
    _request(24, "resources/list", {"cursor": None, "_meta": {"progressToken": "p"}}),
    _request(25, "resources/templates/list", {"_meta": None}),
    _request(26, "tools/list", {"_meta": {"progressToken": 1.5}}),
    _request(27, "tools/list", {"_meta": {"progressToken": True}}),
    _request(28, "tools/list", {"_meta": {"progress_token": 1, "x": None}}),
    _request(29, "tools/list", {"cursor": "abc", "extra": [1, 2]}),
    _request(30, "tools/call", {"name": "gate_status", "arguments": {}}),
    _request(31, "tools/call", {"name": "gate_status"}),
    _request(32, "tools/call", {"name": "gate_status", "arguments": None, "_meta": {"a": 1}}),
    _request(33, "tools/call", {"name": "gate_status", "arguments": {"approval_id": 7}}),
    _request(34, "tools/call", {"name": "up_echo", "arguments": {"text": "t"}, "task": {}}),
    _request(35, "tools/call", {"name": "up_echo", "arguments": {}, "requestState": "x"}),
    _request(36, "tools/call", {"name": "up_echo", "arguments": {}, "inputResponses": 5}),
    _request(
        37,
        "tools/call",
        {
            "name": "up_echo",
            "arguments": {"text": "p", "seconds": 0},
            "_meta": {"progressToken": 9},
        },
    ),
    _request(38, "ping", None, extra_member=True),
    _request(39, "ping", "params"),
    _line({"jsonrpc": "2.0", "id": 40, "method": "ping", "params": None}),
    _line({"jsonrpc": "2.0", "id": 41, "error": {"code": -1, "message": "stray"}}),
    _line({"jsonrpc": "2.0", "id": 42, "error": {"code": "x", "message": 1}}),
    _line({"jsonrpc": "2.0", "id": 43, "result": "not an object"}),
    _line({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 99}}),
    _request(44, "tools/call", {"name": "up_echo", "arguments": {"text": "x"}, "_meta": []}),
]

# A host of the 2026-07-28 era: discovery, the envelope missing or wrong, then lists
# and calls as above.
MODERN_ERA: Final[list[bytes]] = [
    _modern(2, "server/discover"),
    _request(
        3, "tools/list", {"_meta": {**_ENVELOPE, "io.modelcontextprotocol/protocolVersion": 9}}
    ),
    _request(4, "tools/list", {"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}),
    _modern(5, "tools/list"),
    _modern(6, "tools/list", {"cursor": 3}),
    _modern(7, "tools/call"),
    _modern(8, "tools/call", {"name": "no_such_tool", "arguments": {}}),
    _modern(9, "tools/call", {"name": "up_echo", "arguments": {"text": 5}}),
    _modern(10, "tools/call", {"name": "up_echo", "arguments": "text"}),
    _modern(11, "tools/call", {"name": "up_echo", "arguments": {"text": "héllo", "seconds": 0}}),
    _modern(12, "ping"),
    _modern(13, "no/such/method"),
    b"this is not json",
    # Added with decision 0061, recorded on 41054fb.
    _modern(14, "prompts/list"),
    _modern(15, "resources/list"),
    _modern(16, "resources/templates/list"),
    _modern(17, "tools/call", {"name": "gate_status", "arguments": {}}),
    _request(
        18,
        "tools/list",
        {
            "_meta": {
                **_ENVELOPE,
                "io.modelcontextprotocol/logLevel": "debug",
                "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}, "roots": {}},
                "progressToken": "t",
            }
        },
    ),
    _request(
        19, "tools/list", {"_meta": {**_ENVELOPE, "io.modelcontextprotocol/clientCapabilities": 5}}
    ),
    _request(
        20, "tools/list", {"_meta": {**_ENVELOPE, "io.modelcontextprotocol/clientInfo": {"n": 1}}}
    ),
    _request(21, "tools/list", {"_meta": {**_ENVELOPE, "io.modelcontextprotocol/logLevel": "x"}}),
    _modern(22, "tools/call", {"name": "up_echo", "arguments": {"text": "q"}, "requestState": "s"}),
    # Added with decision 0062 (the era in plain JSON), recorded on 0e556d6.
    _modern(23, "subscriptions/listen"),
    _modern(24, "subscriptions/listen", {"notifications": {"toolsListChanged": "maybe"}}),
    _modern(25, "subscriptions/listen", {"notifications": []}),
    _request(
        26,
        "tools/list",
        {
            "_meta": {
                **_ENVELOPE,
                "io.modelcontextprotocol/clientInfo": {
                    "name": "h",
                    "version": "1",
                    "icons": [{"src": "https://example.com/i.png"}],
                },
            }
        },
    ),
    _request(27, "tools/list", {"_meta": {**_ENVELOPE, "progress_token": 1}}),
    _request(28, "tools/list", {"_meta": {**_ENVELOPE, "progressToken": True}}),
    _request(
        29, "server/discover", {"_meta": {**_ENVELOPE, "io.modelcontextprotocol/logLevel": "info"}}
    ),
    _request(
        30,
        "tools/call",
        {
            "name": "up_echo",
            "arguments": {"text": "w"},
            "_meta": {
                **_ENVELOPE,
                "progressToken": 7,
                "io.modelcontextprotocol/clientCapabilities": {"tasks": {}, "sampling": {"x": 1}},
            },
        },
    ),
    _modern(31, "tools/list", {"cursor": None, "extra": {"a": 1}}),
    _modern(32, "prompts/get", {"name": "nothing"}),
]


def _normal(line: bytes, root: Path) -> str:
    """The line as text, with what differs from run to run (the test's directory, the
    package's version) named rather than spelled."""
    text = line.decode()
    for spelled, name in ((str(root), "<root>"), (version("agentrt"), "<version>")):
        text = text.replace(json.dumps(spelled)[1:-1], name)
    return text


async def _transcript(tmp_path: Path, lines: list[bytes]) -> tuple[list[str], list[str]]:
    """Each line sent, then a `ping` fence; every line the proxy wrote before the fence's
    answer (and a call's own answer), in order, under the line that drew it.  With the
    tools the upstream server started a call of."""
    setup = await build_setup(tmp_path)
    out: list[str] = []
    with setup.stderr_path.open("a") as errlog:
        environment = setup.environment()
        if _REFERENCE is not None:
            environment["PYTHONPATH"] = _REFERENCE  # the checkout whose front is recorded
        process = await anyio.open_process(
            setup.command(), stderr=errlog, env=environment, cwd=str(setup.root)
        )
        reader = BufferedByteReceiveStream(process.stdout)  # type: ignore[arg-type]
        try:
            assert process.stdin is not None
            for index, line in enumerate(lines):
                out.append("> " + _normal(line, setup.root))
                sent = json.loads(line) if line.startswith(b"{") else None
                # A call's answer comes when its run ends, and one the SDK's server gives
                # when it has loaded: either may follow the fence's, so wait for each
                # request's own answer too.
                call = sent.get("id") if isinstance(sent, dict) and "method" in sent else None
                if not isinstance(call, str | int):
                    call = None
                fence = f"fence-{index}"
                ping = _request(
                    fence, "ping", {"_meta": _ENVELOPE} if lines is MODERN_ERA else None
                )
                await process.stdin.send(line + b"\n" + ping + b"\n")
                awaited = {fence} if call is None else {fence, call}
                with anyio.fail_after(30):
                    while awaited:
                        answer = await reader.receive_until(b"\n", 1 << 22)
                        answered = json.loads(answer).get("id")
                        awaited.discard(answered)
                        if answered != fence:
                            out.append("< " + _normal(answer, setup.root))
        finally:
            if process.stdin is not None:
                await process.stdin.aclose()
            with anyio.fail_after(30):
                await process.wait()
    return out, [line.split()[1] for line in setup.started()]


@pytest.mark.parametrize(("name", "lines"), [("handshake", HANDSHAKE_ERA), ("modern", MODERN_ERA)])
async def test_the_fronts_answers_and_refusals_are_the_recorded_bytes(
    tmp_path: Path, name: str, lines: list[bytes]
) -> None:
    path = GOLDEN / f"front_{name}.txt"
    transcript, ran = await _transcript(tmp_path, lines)
    if _RECORD:
        GOLDEN.mkdir(exist_ok=True)
        path.write_bytes(("\n".join(transcript) + "\n").encode())
    # Split on "\n" alone: an answer may hold U+2028, which `splitlines` would split on.
    recorded = path.read_bytes().decode().split("\n")[:-1]
    assert sum(line.startswith("> ") for line in recorded) == len(lines)
    assert transcript == recorded
    # Only the well-formed calls reached the upstream server, every refused one did not
    # (it logs each call to echo that has "seconds").
    assert ran == (["echo"] * 3 if name == "handshake" else ["echo"])
