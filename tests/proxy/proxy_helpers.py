"""Helpers for the proxy tests: a pinned upstream, a configuration, and a real host."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
from anyio.streams.buffered import BufferedByteReceiveStream
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from agentrt.approvals import approve, reject
from agentrt.mcp import Server, pin
from agentrt.store import ApprovalRecord, open_store

UPSTREAM = Path(__file__).parent / "servers" / "proxy_upstream.py"
REPO = Path(__file__).resolve().parents[2]
FILESYSTEM_SERVER = (
    REPO / "tests/npm/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js"
)
AGENTRT = Path(sys.executable).parent / "agentrt"
INSPECTOR = REPO / "tests/npm-inspector/node_modules/.bin/mcp-inspector"

RULES: dict[str, Any] = {
    "echo": {"side_effect": "read_only"},
    "write_note": {"side_effect": "local_mutation", "timeout": "2s"},
    "send_mail": {"side_effect": "remote_mutation"},
    "fail": {"side_effect": "local_mutation"},
    "crash": {"side_effect": "local_mutation"},
    "gate_status": {"side_effect": "read_only", "rename": "gate_status"},
}

_MANIFEST: list[str] = []
_COMMAND = re.compile(r"approve (\S+) --approval (\S+)")


def write_private(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o600)
    return path


@dataclass
class ProxySetup:
    """One proxy's files: configuration, manifest and database in conf/; the upstream log."""

    root: Path
    config_path: Path
    database: Path | str  # a file, or a postgresql:// URL
    upstream_log: Path
    stderr_path: Path
    document: dict[str, Any]

    def executions(self, tool: str | None = None) -> list[str]:
        if not self.upstream_log.exists():
            return []
        lines = [line for line in self.upstream_log.read_text().splitlines() if line]
        lines = [line for line in lines if not line.startswith("start ")]
        return [line for line in lines if tool is None or line.startswith(tool + " ")]

    def started(self) -> list[str]:
        if not self.upstream_log.exists():
            return []
        lines = self.upstream_log.read_text().splitlines()
        return [line for line in lines if line.startswith("start ")]

    def stderr(self) -> str:
        return self.stderr_path.read_text() if self.stderr_path.exists() else ""

    def waiting_commands(self) -> list[tuple[str, str]]:
        """(run id, approval id) of every approval the proxy announced on stderr."""
        return _COMMAND.findall(self.stderr())

    def rewrite(self, **overrides: Any) -> None:
        self.document.update(overrides)
        write_private(self.config_path, json.dumps(self.document))

    def approval(self, approval_id: str) -> ApprovalRecord:
        with open_store(self.database, create=False) as store:
            return store.get_approval(approval_id)

    def approve_latest(self, note: str = "") -> ApprovalRecord:
        run_id, approval_id = self.waiting_commands()[-1]
        with open_store(self.database, create=False) as store:
            shown = store.get_approval(approval_id)
            return approve(
                store, run_id, approval_hash=shown.approval_hash, approval_id=approval_id,
                by="test", note=note,
            )  # fmt: skip

    def reject_latest(self, note: str) -> ApprovalRecord:
        run_id, approval_id = self.waiting_commands()[-1]
        with open_store(self.database, create=False) as store:
            shown = store.get_approval(approval_id)
            return reject(
                store, run_id, approval_hash=shown.approval_hash, approval_id=approval_id,
                by="test", note=note,
            )  # fmt: skip

    def environment(self) -> dict[str, str]:
        return host_environment()

    def command(self) -> list[str]:
        """What a host is configured to start: the `agentrt proxy` command."""
        return [str(AGENTRT), "proxy", "--config", str(self.config_path)]

    def operator_command(self, verb: str) -> list[str]:
        """The exact `agentrt ... approve|reject` command the proxy printed last, runnable."""
        lines = [line for line in self.stderr().splitlines() if " waits for " in line]
        for part in lines[-1].partition(": agentrt ")[2].split("  |  "):
            words = shlex.split("agentrt " + part)
            if verb in words:
                return [str(AGENTRT), *words[1:]]
        raise LookupError(f"no {verb} command was printed")


def upstream_server(log: Path, name: str = "up") -> Server:
    return Server(
        name=name,
        command=[sys.executable, str(UPSTREAM)],
        env=[f"PROXY_UPSTREAM_LOG={log}"],
        connect_timeout=20.0,
    )


async def build_setup(
    root: Path, rules: dict[str, Any] | None = None, **overrides: Any
) -> ProxySetup:
    conf = root / "conf"
    work = root / "work"
    conf.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    log = work / "upstream.log"
    if not _MANIFEST:
        # The upstream's tools do not depend on its log path: pin once per test process.
        _MANIFEST.append((await pin(upstream_server(log))).to_json())
    write_private(conf / "up.manifest.json", _MANIFEST[0])
    document: dict[str, Any] = {
        "database": "proxy.db",
        "session": "test-session",
        "hold": "500ms",
        "lease_ttl": "2s",
        "servers": [
            {
                "name": "up",
                "command": [sys.executable, str(UPSTREAM)],
                "env": [f"PROXY_UPSTREAM_LOG={log}"],
                "default_timeout": "10s",
                "manifest": "up.manifest.json",
                "rules": rules if rules is not None else RULES,
            }
        ],
    }
    if os.environ.get("AGENTRT_TEST_STORE") == "postgresql" and "database" not in overrides:
        # The whole proxy suite on PostgreSQL, by hand (see docs/postgresql.md).
        from _postgres import server

        running = server()
        assert running is not None, "AGENTRT_TEST_STORE=postgresql needs PostgreSQL installed"
        document["database"] = running.database()
    document.update(overrides)
    config_path = write_private(conf / "proxy.json", json.dumps(document))
    return ProxySetup(
        root=root,
        config_path=config_path,
        database=document["database"] if document["database"] != "proxy.db" else conf / "proxy.db",
        upstream_log=log,
        stderr_path=root / "proxy.stderr",
        document=document,
    )


@asynccontextmanager
async def host(setup: ProxySetup) -> AsyncIterator[ClientSession]:
    """A real MCP host: the SDK's client starting the proxy as a subprocess over stdio."""
    command = setup.command()
    parameters = StdioServerParameters(
        command=command[0], args=command[1:], env=setup.environment(), cwd=str(setup.root)
    )
    with setup.stderr_path.open("a") as errlog:
        async with (
            stdio_client(parameters, errlog=errlog) as (read_stream, write_stream),
            ClientSession(read_stream, write_stream) as session,
        ):
            await session.initialize()
            yield session


class WatchingHost:
    """The SDK's client as host (`watching_host`), counting the proxy's
    tools/list_changed notifications and noting a prompts/list_changed."""

    def __init__(self) -> None:
        self.changed = 0
        self._seen = anyio.Event()
        self.prompts_changed = anyio.Event()
        self.session: ClientSession

    async def on_message(self, message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            self.changed += 1
            self._seen.set()
        if isinstance(message, types.PromptListChangedNotification):
            self.prompts_changed.set()

    async def wait_changed(self, seconds: float = 30.0) -> None:
        """Until the proxy says the tools changed (since the last wait)."""
        with anyio.fail_after(seconds):
            await self._seen.wait()
        self._seen = anyio.Event()

    async def names(self) -> set[str]:
        return {tool.name for tool in (await self.session.list_tools()).tools}


@asynccontextmanager
async def host_session(
    setup: ProxySetup, on_message: Any
) -> AsyncIterator[tuple[ClientSession, Any]]:
    """A host starting the proxy over stdio, each notification handed to `on_message`:
    its session and its `initialize` answer."""
    command = setup.command()
    parameters = StdioServerParameters(
        command=command[0], args=command[1:], env=setup.environment(), cwd=str(setup.root)
    )
    with setup.stderr_path.open("a") as errlog:
        async with (
            stdio_client(parameters, errlog=errlog) as (read_stream, write_stream),
            ClientSession(read_stream, write_stream, message_handler=on_message) as session,
        ):
            yield session, await session.initialize()


@asynccontextmanager
async def watching_host(setup: ProxySetup) -> AsyncIterator[WatchingHost]:
    """`host`, watching for the proxy's list changes, which it says it sends."""
    watching = WatchingHost()
    async with host_session(setup, watching.on_message) as (session, initialized):
        assert initialized.capabilities.tools is not None
        assert initialized.capabilities.tools.list_changed is True
        watching.session = session
        yield watching


def text_of(result: Any) -> str:
    return "".join(block.text for block in result.content if getattr(block, "type", "") == "text")


class RawHost:
    """A host speaking JSON-RPC lines to a proxy subprocess, so a test can close its stdin,
    signal it or kill it at an exact moment."""

    def __init__(self, process: Any, stderr: Any) -> None:
        self.process = process
        self._stderr = stderr
        self._reader = BufferedByteReceiveStream(process.stdout)
        self._next_id = 0

    @classmethod
    @asynccontextmanager
    async def start(cls, setup: ProxySetup) -> AsyncIterator[RawHost]:
        with setup.stderr_path.open("a") as errlog:
            process = await anyio.open_process(
                setup.command(), stderr=errlog, env=setup.environment(), cwd=str(setup.root)
            )
            raw = cls(process, errlog)
            try:
                await raw.request("initialize", {
                    "protocolVersion": "2025-06-18", "capabilities": {},
                    "clientInfo": {"name": "raw-host", "version": "0"},
                })  # fmt: skip
                await raw.notify("notifications/initialized", {})
                yield raw
            finally:
                if process.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        process.kill()
                with anyio.CancelScope(shield=True):
                    await process.wait()

    async def notify(self, method: str, params: dict[str, Any]) -> None:
        message = {"jsonrpc": "2.0", "method": method, "params": params}
        await self.process.stdin.send((json.dumps(message) + "\n").encode())

    async def send_request(self, method: str, params: dict[str, Any]) -> int:
        self._next_id += 1
        message = {"jsonrpc": "2.0", "id": self._next_id, "method": method, "params": params}
        await self.process.stdin.send((json.dumps(message) + "\n").encode())
        return self._next_id

    async def response(self, request_id: int) -> dict[str, Any]:
        while True:
            line = await self._reader.receive_until(b"\n", 1 << 22)
            message = json.loads(line)
            if message.get("id") == request_id and "method" not in message:
                return dict(message)

    async def responses(self, request_ids: set[int]) -> dict[int, dict[str, Any]]:
        """The responses to all of `request_ids`, in whatever order the proxy sends them."""
        found: dict[int, dict[str, Any]] = {}
        while set(found) != request_ids:
            message = json.loads(await self._reader.receive_until(b"\n", 1 << 22))
            if message.get("id") in request_ids and "method" not in message:
                found[message["id"]] = dict(message)
        return found

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        return await self.response(await self.send_request(method, params))

    async def call(self, tool: str, arguments: dict[str, Any]) -> int:
        return await self.send_request("tools/call", {"name": tool, "arguments": arguments})


def proxy_pid_from_lease(database: Path | str) -> int:
    """The pid of the proxy process executing a call, read from its run's lease owner."""
    with open_store(database, read_only=True) as store:
        for run in store.list_runs(limit=100):
            if run.lease_owner:
                return int(run.lease_owner.split(":")[2])
    raise LookupError("no run is leased")


CONFORMANCE = Path(__file__).parent / "servers" / "conformance_server.py"
# What a 2025-11-25 host sends by hand over streamable HTTP.
PROTOCOL = "2025-11-25"
ACCEPT = "application/json, text/event-stream"


@dataclass
class HTTPProxy:
    """A proxy serving streamable HTTP: its /mcp URL and its stderr file."""

    url: str
    stderr: Path


def conformance_config(root: Path, session: str, **server: Any) -> Path:
    """A proxy configuration in `root/conf` for the conformance server, pinned, every tool
    allowed read-only under its own name; `server` adds to (or overrides) its entry."""
    conf = root / "conf"
    upstream = Server(
        name="conf", command=[sys.executable, str(CONFORMANCE)], env=server.get("env", [])
    )
    manifest = anyio.run(pin, upstream)
    write_private(conf / "conf.manifest.json", manifest.to_json())
    rules = {name: {"side_effect": "read_only", "rename": name, "allow_hint_mismatch": True}
             for name in manifest.tools}  # fmt: skip
    entry = {
        "name": "conf",
        "command": [sys.executable, str(CONFORMANCE)],
        "default_timeout": "20s",
        "manifest": "conf.manifest.json",
        "rules": rules,
        **server,
    }
    document = {"database": "proxy.db", "session": session, "servers": [entry]}
    return write_private(conf / "proxy.json", json.dumps(document))


def host_environment() -> dict[str, str]:
    """The little a host gives the proxy it starts (PATH and HOME), plus the test session's
    directory of PostgreSQL head anchors, so no test writes into this user's own."""
    environment = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp")}
    if "AGENTRT_ANCHOR_DIR" in os.environ:
        environment["AGENTRT_ANCHOR_DIR"] = os.environ["AGENTRT_ANCHOR_DIR"]
    return environment


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def serving_http(config: Path, root: Path) -> Iterator[tuple[str, Path]]:
    """`agentrt proxy --config CONFIG --http` on a free loopback port, run in `root` with
    its stderr in `root/proxy.stderr`: yields its /mcp URL and that file once it serves,
    and stops it (SIGTERM) after."""
    port = free_port()
    stderr = root / "proxy.stderr"
    with stderr.open("a") as errlog:
        process = subprocess.Popen(
            [str(AGENTRT), "proxy", "--config", str(config), "--http", f"127.0.0.1:{port}"],
            stdin=subprocess.DEVNULL, stderr=errlog, cwd=root,
            env=host_environment(),
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while "serving streamable HTTP" not in stderr.read_text():
            assert process.poll() is None, stderr.read_text()
            assert time.monotonic() < deadline, stderr.read_text()
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp", stderr
    finally:
        process.terminate()
        process.wait(timeout=20)


def wait_for(condition: Callable[[], bool], limit: float = 15.0) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the condition never held")
        time.sleep(0.05)


async def until(condition: Callable[[], bool], limit: float = 15.0) -> None:
    with anyio.fail_after(limit):
        while not condition():
            await anyio.sleep(0.05)


@dataclass
class RawHTTPHost:
    """A host speaking the 2025-11-25 wire by hand over streamable HTTP, so each answer's
    status and headers can be read."""

    client: httpx2.AsyncClient
    url: str
    session_id: str = ""
    next_id: int = field(default=1)

    def headers(self, **extra: str) -> dict[str, str]:
        return {"accept": ACCEPT, "content-type": "application/json",
                "mcp-session-id": self.session_id, "mcp-protocol-version": PROTOCOL,
                **extra}  # fmt: skip

    def body(self, method: str, params: dict[str, Any], request_id: int | None = None) -> str:
        if request_id is None:
            self.next_id += 1
            request_id = self.next_id
        return json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})

    async def request(
        self, method: str, params: dict[str, Any], request_id: int | None = None
    ) -> httpx2.Response:
        body = self.body(method, params, request_id)
        return await self.client.post(self.url, content=body, headers=self.headers())

    async def call(
        self, name: str, meta: dict[str, Any] | None = None, **arguments: Any
    ) -> httpx2.Response:
        params: dict[str, Any] = {"name": name, "arguments": arguments}
        if meta is not None:
            params["_meta"] = meta
        return await self.request("tools/call", params)


INITIALIZE = {
    "jsonrpc": "2.0", "id": 1, "method": "initialize",
    "params": {"protocolVersion": PROTOCOL, "capabilities": {},
               "clientInfo": {"name": "raw", "version": "1"}},
}  # fmt: skip


@asynccontextmanager
async def raw_http_host(url: str) -> AsyncIterator[RawHTTPHost]:
    """A `RawHTTPHost` with its session opened (initialize, then initialized)."""
    async with httpx2.AsyncClient(timeout=30.0) as client:
        answer = await client.post(url, json=INITIALIZE, headers={"accept": ACCEPT})
        assert answer.status_code == 200, answer.text
        host = RawHTTPHost(client, url, answer.headers["mcp-session-id"])
        initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        assert (await client.post(url, json=initialized, headers=host.headers())).status_code == 202
        yield host


def sse_data(lines: Iterable[str]) -> list[dict[str, Any]]:
    """The JSON messages of an event stream's non-empty `data:` lines."""
    return [json.loads(line[len("data:") :]) for line in lines
            if line.startswith("data:") and line[len("data:") :].strip()]  # fmt: skip
