"""Real hosts, headless: Claude Code's own binary calls a tool through the proxy.

The model is a fake Messages API on loopback that answers the first request with a
`tool_use` of the proxied tool and records the next request: its `tool_result` block is
what Claude Code made of the proxy's answer, exactly as the model would read it.
"""

from __future__ import annotations

import json
import platform
import shlex
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from proxy_helpers import REPO, ProxySetup, build_setup
from test_proxy_hosts import filesystem_setup

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.timeout(120)]

HOSTS = REPO / "tests/npm-hosts/node_modules"
TOOL_USE_ID = "toolu_agentrt_01"


def claude_binary() -> Path:
    """The native binary of the platform package, which Claude Code's postinstall would
    copy over `bin/claude.exe`: with `npm ci --ignore-scripts` it stays where npm put it."""
    system = {"linux": "linux", "darwin": "darwin"}[sys.platform]
    machine = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}
    return (
        HOSTS / f"@anthropic-ai/claude-code-{system}-{machine[platform.machine().lower()]}/claude"
    )


@dataclass
class FakeMessagesAPI:
    """Anthropic's Messages API as Claude Code streams it: the first request that offers
    `tool` gets a `tool_use` of it with `arguments`; every later request gets a short text."""

    tool: str
    arguments: dict[str, Any]
    requests: list[dict[str, Any]] = field(default_factory=list)
    url: str = ""

    def tool_results(self) -> list[dict[str, Any]]:
        """Every `tool_result` block Claude Code sent back for the scripted call."""
        return [
            block
            for request in self.requests
            for message in request.get("messages", [])
            if isinstance(message.get("content"), list)
            for block in message["content"]
            if block.get("type") == "tool_result" and block.get("tool_use_id") == TOOL_USE_ID
        ]

    def reply(self, body: dict[str, Any]) -> dict[str, Any]:
        offered = {tool.get("name") for tool in body.get("tools", [])}
        answered = any(
            block.get("type") == "tool_result"
            for message in body.get("messages", [])
            if isinstance(message.get("content"), list)
            for block in message["content"]
        )
        if self.tool in offered and not answered:
            return {
                "type": "tool_use",
                "id": TOOL_USE_ID,
                "name": self.tool,
                "input": self.arguments,
            }
        return {"type": "text", "text": "Noted."}


def _message(body: dict[str, Any], content: list[dict[str, Any]], stop: str | None) -> Any:
    return {
        "id": "msg_agentrt", "type": "message", "role": "assistant", "model": body.get("model"),
        "content": content, "stop_reason": stop, "stop_sequence": None,
        "usage": {"input_tokens": 1, "output_tokens": 1},
    }  # fmt: skip


def _stop(block: dict[str, Any]) -> str:
    return "tool_use" if block["type"] == "tool_use" else "end_turn"


def _sse(body: dict[str, Any], block: dict[str, Any]) -> bytes:
    """The documented streaming events of one message holding one content block."""
    message = _message(body, [], None)
    if block["type"] == "tool_use":
        start = {**block, "input": {}}
        delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
    else:
        start = {"type": "text", "text": ""}
        delta = {"type": "text_delta", "text": block["text"]}
    events = [
        {"type": "message_start", "message": message},
        {"type": "content_block_start", "index": 0, "content_block": start},
        {"type": "content_block_delta", "index": 0, "delta": delta},
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": _stop(block), "stop_sequence": None},
         "usage": {"output_tokens": 1}},
        {"type": "message_stop"},
    ]  # fmt: skip
    return "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events).encode()


@contextmanager
def serving(api: FakeMessagesAPI) -> Iterator[FakeMessagesAPI]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            api.requests.append(body)
            block = api.reply(body)
            if body.get("stream"):
                data, kind = _sse(body, block), "text/event-stream"
            else:
                whole = _message(body, [block], _stop(block))
                data, kind = json.dumps(whole).encode(), "application/json"
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    api.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield api
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def run_claude(setup: ProxySetup, api: FakeMessagesAPI, tool: str) -> dict[str, Any]:
    """One headless Claude Code session (`-p`) with the proxy as its only MCP server,
    allowed to call `tool` without asking; the tool_result it sent the model."""
    home = setup.root / "claude-home"
    home.mkdir(exist_ok=True)
    # The proxy's stderr (where it prints the approve command) goes to the setup's file.
    proxy = f"exec {shlex.join(setup.command())} 2>>{shlex.quote(str(setup.stderr_path))}"
    config = {"mcpServers": {"agentrt": {"command": "sh", "args": ["-c", proxy]}}}
    (setup.root / "claude-mcp.json").write_text(json.dumps(config))
    before = len(api.tool_results())
    finished = subprocess.run(
        [
            str(claude_binary()), "-p", "Save the note.", "--bare",
            "--output-format", "stream-json", "--verbose",
            "--mcp-config", str(setup.root / "claude-mcp.json"), "--strict-mcp-config",
            "--allowedTools", f"mcp__agentrt__{tool}",
            "--model", "claude-sonnet-4-5", "--no-session-persistence",
        ],
        capture_output=True, text=True, timeout=90, cwd=setup.root, stdin=subprocess.DEVNULL,
        env={
            **setup.environment(),
            "HOME": str(home),
            "CLAUDE_CONFIG_DIR": str(home / "config"),
            "ANTHROPIC_BASE_URL": api.url,
            "ANTHROPIC_API_KEY": "sk-ant-agentrt-test",
            "DISABLE_AUTOUPDATER": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        },
    )  # fmt: skip
    assert finished.returncode == 0, finished.stderr + finished.stdout[-2000:]
    results = api.tool_results()
    assert len(results) == before + 1, finished.stdout[-2000:]
    return results[-1]


def text_in(block: dict[str, Any]) -> str:
    content = block.get("content", "")
    if isinstance(content, str):
        return content
    return "\n".join(part.get("text", "") for part in content)


@dataclass
class HeldCase:
    setup: ProxySetup
    tool: str
    arguments: dict[str, Any]
    target: Path
    content: str


async def held_case(root: Path, with_output_schema: bool) -> HeldCase:
    if with_output_schema:
        # The stock filesystem server's write_file declares an outputSchema.
        setup, sandbox = await filesystem_setup(root)
        target = sandbox / "held.txt"
        arguments = {"path": str(target), "content": "held line\n"}
        return HeldCase(setup, "fs_write_file", arguments, target, "held line\n")
    setup = await build_setup(root, policy={"local_mutation": "require_approval"})
    arguments = {"note": "held-note"}
    return HeldCase(setup, "up_write_note", arguments, setup.upstream_log, "write_note held-note")


@pytest.mark.parametrize("with_output_schema", [False, True], ids=["plain", "output-schema"])
async def test_claude_code_shows_a_held_call_as_pending_and_runs_it_once_after_approval(
    tmp_path: Path, with_output_schema: bool
) -> None:
    case = await held_case(tmp_path, with_output_schema)
    name = f"mcp__agentrt__{case.tool}"
    with serving(FakeMessagesAPI(name, case.arguments)) as api:
        held = run_claude(case.setup, api, case.tool)
        # Claude Code shows the model the text content, or for a tool with an outputSchema
        # the structured content as JSON: either way a wait, not an error.
        assert held.get("is_error") is not True, held
        assert "PENDING_APPROVAL: this call needs a person's approval" in text_in(held), held
        if with_output_schema:
            assert json.loads(text_in(held))["agentrt"]["status"] == "PENDING_APPROVAL"
        assert case.content not in (case.target.read_text() if case.target.exists() else "")
        approve = subprocess.run(
            case.setup.operator_command("approve"), capture_output=True, text=True, timeout=60,
            cwd=case.setup.root, env=case.setup.environment(),
        )  # fmt: skip
        assert approve.returncode == 0, approve.stderr
        ran = run_claude(case.setup, api, case.tool)
    assert ran.get("is_error") is not True, ran
    assert "PENDING_APPROVAL" not in text_in(ran), ran
    assert case.target.read_text().count(case.content) == 1
