"""Real hosts, headless: Claude Code's and gemini-cli's own programs call a tool through
the proxy.

The model is a fake API on loopback (Anthropic's Messages API, Google's Gemini API) that
answers the first request with a call of the proxied tool and records the next request:
the tool result in it is what the host made of the proxy's answer, exactly as the model
reads it.
"""

from __future__ import annotations

import json
import platform
import shlex
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from proxy_helpers import REPO, ProxySetup, build_setup, write_private
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
class Seen:
    """A tool result as the host sent it to the model."""

    is_error: bool
    text: str
    raw: dict[str, Any]


@dataclass
class FakeModel:
    """A model that calls `tool` with `arguments` when first offered it, then says a word."""

    tool: str
    arguments: dict[str, Any]
    requests: list[dict[str, Any]] = field(default_factory=list)
    url: str = ""

    def respond(self, path: str, body: dict[str, Any]) -> tuple[bytes, str]:
        raise NotImplementedError

    def results(self) -> list[Seen]:
        raise NotImplementedError


class FakeMessagesAPI(FakeModel):
    """Anthropic's Messages API as Claude Code streams it (`tool_use`, `tool_result`)."""

    def results(self) -> list[Seen]:
        return [
            Seen(block.get("is_error") is True, _text_in(block), block)
            for request in self.requests
            for block in _blocks(request)
            if block.get("type") == "tool_result" and block.get("tool_use_id") == TOOL_USE_ID
        ]

    def respond(self, path: str, body: dict[str, Any]) -> tuple[bytes, str]:
        offered = {tool.get("name") for tool in body.get("tools", [])}
        answered = any(block.get("type") == "tool_result" for block in _blocks(body))
        block: dict[str, Any] = {"type": "text", "text": "Noted."}
        if self.tool in offered and not answered:
            block = {"type": "tool_use", "id": TOOL_USE_ID, "name": self.tool,
                     "input": self.arguments}  # fmt: skip
        if body.get("stream"):
            return _sse(body, block), "text/event-stream"
        return json.dumps(_message(body, [block], _stop(block))).encode(), "application/json"


def _blocks(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        block
        for message in body.get("messages", [])
        if isinstance(message.get("content"), list)
        for block in message["content"]
    ]


def _text_in(block: dict[str, Any]) -> str:
    content = block.get("content", "")
    if isinstance(content, str):
        return content
    return "\n".join(part.get("text", "") for part in content)


class FakeGeminiAPI(FakeModel):
    """Google's Gemini API as gemini-cli calls it (`functionCall`, `functionResponse`):
    a failed call's response holds `error`, a result's `output`."""

    def results(self) -> list[Seen]:
        return [
            Seen("error" in response, str(response.get("output", response.get("error"))), part)
            for request in self.requests
            for part in _parts(request)
            if part.get("functionResponse", {}).get("name") == self.tool
            for response in [part["functionResponse"]["response"]]
        ]

    def respond(self, path: str, body: dict[str, Any]) -> tuple[bytes, str]:
        if ":countTokens" in path:
            return json.dumps({"totalTokens": 1}).encode(), "application/json"
        offered = {
            declaration["name"]
            for tool in body.get("tools", [])
            for declaration in tool.get("functionDeclarations", [])
        }
        answered = any("functionResponse" in part for part in _parts(body))
        part: dict[str, Any] = {"text": "Noted."}
        if self.tool in offered and not answered:
            part = {"functionCall": {"name": self.tool, "args": self.arguments}}
        whole = {
            "candidates": [{"content": {"role": "model", "parts": [part]},
                            "finishReason": "STOP", "index": 0}],
            "usageMetadata": {"promptTokenCount": 1, "candidatesTokenCount": 1,
                              "totalTokenCount": 2},
        }  # fmt: skip
        if "alt=sse" in path:
            return f"data: {json.dumps(whole)}\r\n\r\n".encode(), "text/event-stream"
        return json.dumps(whole).encode(), "application/json"


def _parts(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [part for content in body.get("contents", []) for part in content.get("parts", [])]


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
def serving(model: FakeModel) -> Iterator[FakeModel]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            model.requests.append(body)
            data, kind = model.respond(self.path, body)
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
    model.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield model
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def proxy_command(setup: ProxySetup) -> list[str]:
    """The proxy as a host starts it, its stderr (where it prints the approve command)
    into the setup's file."""
    proxy = f"exec {shlex.join(setup.command())} 2>>{shlex.quote(str(setup.stderr_path))}"
    return ["sh", "-c", proxy]


def finish(model: FakeModel, command: list[str], setup: ProxySetup, **env: str) -> Seen:
    """Run one headless session; the one tool result it sent the model."""
    before = len(model.results())
    finished = subprocess.run(
        command, capture_output=True, text=True, timeout=90, cwd=setup.root,
        stdin=subprocess.DEVNULL, env={**setup.environment(), **env},
    )  # fmt: skip
    assert finished.returncode == 0, finished.stderr[-2000:] + finished.stdout[-2000:]
    results = model.results()
    assert len(results) == before + 1, finished.stdout[-2000:]
    return results[-1]


def run_claude(setup: ProxySetup, model: FakeModel) -> Seen:
    """Claude Code (`-p`) with the proxy as its only MCP server, allowed to call the tool."""
    home = setup.root / "claude-home"
    home.mkdir(exist_ok=True)
    command = proxy_command(setup)
    config = {"mcpServers": {"agentrt": {"command": command[0], "args": command[1:]}}}
    (home / "mcp.json").write_text(json.dumps(config))
    return finish(
        model,
        [
            str(claude_binary()), "-p", "Save the note.", "--bare",
            "--output-format", "stream-json", "--verbose",
            "--mcp-config", str(home / "mcp.json"), "--strict-mcp-config",
            "--allowedTools", model.tool,
            "--model", "claude-sonnet-4-5", "--no-session-persistence",
        ],
        setup,
        HOME=str(home),
        CLAUDE_CONFIG_DIR=str(home / "config"),
        ANTHROPIC_BASE_URL=model.url,
        ANTHROPIC_API_KEY="sk-ant-agentrt-test",
        DISABLE_AUTOUPDATER="1",
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
    )  # fmt: skip


def run_gemini(setup: ProxySetup, model: FakeModel) -> Seen:
    """gemini-cli (`-p`) with the proxy as its only MCP server, trusted to call its tools."""
    home = setup.root / "gemini-home"
    command = proxy_command(setup)
    settings = {
        "mcpServers": {"agentrt": {"command": command[0], "args": command[1:], "trust": True}},
        "security": {"auth": {"selectedType": "gemini-api-key"}},
        "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
        "telemetry": {"enabled": False},
        "privacy": {"usageStatisticsEnabled": False},
    }
    write_private(home / ".gemini" / "settings.json", json.dumps(settings))
    return finish(
        model,
        [
            "node", str(HOSTS / "@google/gemini-cli/bundle/gemini.js"), "-p", "Save the note.",
            "--output-format", "stream-json", "--skip-trust", "--model", "gemini-2.5-flash",
        ],
        setup,
        HOME=str(home),
        GEMINI_API_KEY="agentrt-test",
        GOOGLE_GEMINI_BASE_URL=model.url,
    )  # fmt: skip


@dataclass(frozen=True)
class Host:
    model: type[FakeModel]
    tool_name: Callable[[str], str]
    run: Callable[[ProxySetup, FakeModel], Seen]


REAL_HOSTS = {
    "claude-code": Host(FakeMessagesAPI, "mcp__agentrt__{}".format, run_claude),
    "gemini-cli": Host(FakeGeminiAPI, "mcp_agentrt_{}".format, run_gemini),
}


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
@pytest.mark.parametrize("host_name", sorted(REAL_HOSTS))
async def test_a_real_host_shows_a_held_call_as_pending_and_runs_it_once_after_approval(
    tmp_path: Path, host_name: str, with_output_schema: bool
) -> None:
    host = REAL_HOSTS[host_name]
    case = await held_case(tmp_path, with_output_schema)
    with serving(host.model(host.tool_name(case.tool), case.arguments)) as model:
        held = host.run(case.setup, model)
        # The model is shown the text content (Claude Code: for a tool with an outputSchema,
        # the structured content as JSON, whose message is that text): a wait, not an error.
        assert not held.is_error, held.raw
        assert "PENDING_APPROVAL: this call needs a person's approval" in held.text, held.raw
        assert case.content not in (case.target.read_text() if case.target.exists() else "")
        approve = subprocess.run(
            case.setup.operator_command("approve"), capture_output=True, text=True, timeout=60,
            cwd=case.setup.root, env=case.setup.environment(),
        )  # fmt: skip
        assert approve.returncode == 0, approve.stderr
        ran = host.run(case.setup, model)
    assert not ran.is_error, ran.raw
    assert "PENDING_APPROVAL" not in ran.text, ran.raw
    assert case.target.read_text().count(case.content) == 1
