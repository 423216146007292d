"""Helpers for the proxy tests: a pinned upstream, a configuration, and a real host."""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
INSPECTOR = REPO / "tests/npm-inspector/node_modules/.bin/mcp-inspector"

RULES: dict[str, Any] = {
    "echo": {"side_effect": "read_only"},
    "write_note": {"side_effect": "local_mutation", "timeout": "2s"},
    "send_mail": {"side_effect": "remote_mutation"},
    "fail": {"side_effect": "local_mutation"},
    "gate_status": {"side_effect": "read_only", "rename": "gate_status"},
}

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
    database: Path
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
        return {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp")}

    def command(self) -> list[str]:
        return [sys.executable, "-m", "agentrt.proxy", "--config", str(self.config_path)]


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
    manifest = await pin(upstream_server(log))
    write_private(conf / "up.manifest.json", manifest.to_json())
    document: dict[str, Any] = {
        "database": "proxy.db",
        "session": "test-session",
        "hold": "500ms",
        "lease_ttl": "1s",
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
    document.update(overrides)
    config_path = write_private(conf / "proxy.json", json.dumps(document))
    return ProxySetup(
        root=root,
        config_path=config_path,
        database=conf / "proxy.db",
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


def text_of(result: Any) -> str:
    return "".join(block.text for block in result.content if getattr(block, "type", "") == "text")
