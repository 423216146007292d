"""Real hosts and real servers: the MCP Inspector CLI, the stock filesystem server, HTTP."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from proxy_helpers import (
    FILESYSTEM_SERVER,
    INSPECTOR,
    ProxySetup,
    free_port,
    host,
    text_of,
    until,
    write_private,
)

from agentrt.mcp import Server, pin

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]

FS_RULES: dict[str, Any] = {
    "read_text_file": {"side_effect": "read_only"},
    "list_allowed_directories": {"side_effect": "read_only"},
    "write_file": {"side_effect": "local_mutation", "allow_hint_mismatch": True},
}


def inspector(setup: ProxySetup, *arguments: str) -> subprocess.CompletedProcess[str]:
    command = [str(INSPECTOR), "--cli", *arguments, "--", *setup.command()]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=60, cwd=setup.root,
        env={**setup.environment(), "HOME": str(setup.root)},
    )  # fmt: skip


async def test_the_inspector_cli_lists_and_calls_through_the_proxy(setup: ProxySetup) -> None:
    listing = inspector(setup, "--method", "tools/list")
    assert listing.returncode == 0, listing.stderr
    names = {tool["name"] for tool in json.loads(listing.stdout)["tools"]}
    assert names == {
        "gate_status",
        "up_crash",
        "up_echo",
        "up_fail",
        "up_send_mail",
        "up_write_note",
    }
    called = inspector(
        setup, "--method", "tools/call", "--tool-name", "up_echo", "--tool-arg", "text=hi there"
    )
    assert called.returncode == 0, called.stderr
    assert json.loads(called.stdout)["content"][0]["text"] == "hi there"
    held = inspector(
        setup, "--method", "tools/call", "--tool-name", "up_send_mail",
        "--tool-arg", "to=x@y.z", "body=b",
    )  # fmt: skip
    assert json.loads(held.stdout)["content"][0]["text"].startswith("PENDING_APPROVAL: ")
    assert setup.executions() == []


async def filesystem_setup(root: Path) -> tuple[ProxySetup, Path]:
    sandbox = root / "sandbox"
    sandbox.mkdir()
    (sandbox / "README.md").write_text("hello from the sandbox\n")
    conf = root / "conf"
    command = ["node", str(FILESYSTEM_SERVER), str(sandbox)]
    manifest = await pin(Server(name="fs", command=command, connect_timeout=30.0))
    write_private(conf / "fs.manifest.json", manifest.to_json())
    document: dict[str, Any] = {
        "database": "proxy.db",
        "session": "fs-session",
        "hold": "300ms",
        "policy": {"read_only": "allow", "local_mutation": "require_approval"},
        "servers": [
            {
                "name": "fs",
                "command": command,
                "default_timeout": "10s",
                "manifest": "fs.manifest.json",
                "rules": FS_RULES,
            }
        ],
    }
    config_path = write_private(conf / "proxy.json", json.dumps(document))
    setup = ProxySetup(
        root=root, config_path=config_path, database=conf / "proxy.db",
        upstream_log=root / "none.log", stderr_path=root / "proxy.stderr", document=document,
    )  # fmt: skip
    return setup, sandbox


async def test_the_stock_filesystem_server_writes_only_after_approval_and_only_once(
    tmp_path: Path,
) -> None:
    setup, sandbox = await filesystem_setup(tmp_path)
    target = sandbox / "notes.txt"
    arguments = {"path": str(target), "content": "line one\nline two\n"}
    async with host(setup) as session:
        listed = (await session.list_tools()).tools
        names = {tool.name for tool in listed}
        write_tool = next(tool for tool in listed if tool.name == "fs_write_file")
        # The server claims destructiveHint; the operator classified it local_mutation.
        assert write_tool.annotations is not None
        assert write_tool.annotations.destructive_hint is False
        assert names == {"gate_status", "fs_read_text_file", "fs_list_allowed_directories",
                         "fs_write_file"}  # fmt: skip
        read = await session.call_tool("fs_read_text_file", {"path": str(sandbox / "README.md")})
        assert "hello from the sandbox" in text_of(read)
        pending = await session.call_tool("fs_write_file", arguments)
        assert text_of(pending).startswith("PENDING_APPROVAL: ")
        assert not target.exists()
        approval = setup.approval(setup.waiting_commands()[-1][1])
        assert approval.presentation["lines"] == 2
        assert approval.presentation["path"] == str(target)
        setup.approve_latest()
        written = await session.call_tool("fs_write_file", arguments)
        assert written.is_error is False
        assert target.read_text() == "line one\nline two\n"
        target.write_text("changed by someone else\n")
        again = await session.call_tool("fs_write_file", arguments)
    assert text_of(again).startswith("DUPLICATE: ")
    assert target.read_text() == "changed by someone else\n"


def test_the_proxy_refuses_to_start_a_server_over_its_own_files(tmp_path: Path) -> None:
    conf = tmp_path / "conf"
    document = {
        "database": "proxy.db",
        "session": "s",
        "servers": [
            {
                "name": "fs",
                "command": ["node", str(FILESYSTEM_SERVER), str(tmp_path)],
                "manifest": "fs.manifest.json",
                "rules": FS_RULES,
            }
        ],
    }
    config_path = write_private(conf / "proxy.json", json.dumps(document))
    finished = subprocess.run(
        [sys.executable, "-m", "agentrt.proxy", "--config", str(config_path)],
        capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert finished.returncode == 1
    assert "forge an approval" in finished.stderr
    assert finished.stdout == ""
    assert not (conf / "proxy.db").exists()


@asynccontextmanager
async def http_proxy(setup: ProxySetup, *extra: str) -> AsyncIterator[str]:
    port = free_port()
    with setup.stderr_path.open("a") as errlog:
        process = await anyio.open_process(
            [*setup.command(), "--http", f"127.0.0.1:{port}", *extra],
            stderr=errlog, env=setup.environment(), cwd=str(setup.root),
        )  # fmt: skip
        try:
            await until(lambda: "serving streamable HTTP" in setup.stderr())
            await until(lambda: _listening(port))
            yield f"http://127.0.0.1:{port}/mcp"
        finally:
            process.terminate()
            with anyio.fail_after(20):
                await process.wait()


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


async def test_streamable_http_on_loopback_serves_the_same_gate(setup: ProxySetup) -> None:
    async with (
        http_proxy(setup) as url,
        streamable_http_client(url) as (read_stream, write_stream),
        ClientSession(read_stream, write_stream) as session,
    ):
        await session.initialize()
        echo = await session.call_tool("up_echo", {"text": "over http"})
        held = await session.call_tool("up_send_mail", {"to": "h@t.tp", "body": "b"})
    assert text_of(echo) == "over http"
    assert text_of(held).startswith("PENDING_APPROVAL: ")
    assert setup.executions() == []


async def test_streamable_http_with_a_token_refuses_a_request_without_it(
    setup: ProxySetup,
) -> None:
    async with http_proxy(setup, "--token", "s3cret-token") as url:
        async with httpx2.AsyncClient() as client:
            refused = await client.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
        headers = {"Authorization": "Bearer s3cret-token"}
        async with (
            httpx2.AsyncClient(headers=headers) as client,
            streamable_http_client(url, http_client=client) as (read_stream, write_stream),
            ClientSession(read_stream, write_stream) as session,
        ):
            await session.initialize()
            echo = await session.call_tool("up_echo", {"text": "with token"})
    assert refused.status_code == 401
    assert text_of(echo) == "with token"


async def test_http_on_a_non_loopback_address_needs_allow_remote_and_a_token(
    setup: ProxySetup,
) -> None:
    for extra in ([], ["--allow-remote"], ["--token", "t"]):
        finished = subprocess.run(
            [*setup.command(), "--http", "0.0.0.0:9", *extra],
            capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
            env={**os.environ},
        )  # fmt: skip
        assert finished.returncode == 1
        assert "--allow-remote and a --token" in finished.stderr
    assert not setup.database.exists()


async def test_sigterm_over_http_lets_the_call_in_flight_finish_and_be_recorded(
    tmp_path: Path,
) -> None:
    from proxy_helpers import RULES, build_setup

    from agentrt.store import RunStatus, open_store

    rules = {**RULES, "write_note": {"side_effect": "local_mutation", "timeout": "30s"}}
    setup = await build_setup(tmp_path, rules=rules)
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    with setup.stderr_path.open("a") as errlog:
        process = await anyio.open_process(
            [*setup.command(), "--http", f"127.0.0.1:{port}"],
            stderr=errlog, env=setup.environment(), cwd=str(setup.root),
        )  # fmt: skip
        await until(lambda: _listening(port))

        async def call() -> None:
            # The host may lose its answer when the server goes away; the call must not.
            with contextlib.suppress(Exception):
                async with (
                    streamable_http_client(url) as (read_stream, write_stream),
                    ClientSession(read_stream, write_stream) as session,
                ):
                    await session.initialize()
                    await session.call_tool("up_write_note", {"note": "h", "seconds": 1.5})

        async with anyio.create_task_group() as group:
            group.start_soon(call)
            await until(lambda: len(setup.started()) == 1)
            process.terminate()
            with anyio.fail_after(20):
                code = await process.wait()
            group.cancel_scope.cancel()
    assert setup.executions() == ["write_note h"]
    with open_store(setup.database, read_only=True) as store:
        assert [run.status for run in store.list_runs()] == [RunStatus.COMPLETED]
    assert code == 0, setup.stderr()


def test_a_database_others_can_write_stops_the_proxy_with_exit_2(tmp_path: Path) -> None:
    conf = tmp_path / "conf"
    database = conf / "proxy.db"
    conf.mkdir()
    database.write_bytes(b"")
    database.chmod(0o666)
    document = {
        "database": "proxy.db",
        "session": "s",
        "servers": [
            {
                "name": "fs",
                "command": ["node", str(FILESYSTEM_SERVER), str(tmp_path / "sandbox")],
                "manifest": "fs.manifest.json",
                "rules": FS_RULES,
            }
        ],
    }
    config_path = write_private(conf / "proxy.json", json.dumps(document))
    finished = subprocess.run(
        [sys.executable, "-m", "agentrt.proxy", "--config", str(config_path)],
        capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert finished.returncode == 2, finished.stderr
    assert "writable by group or others" in finished.stderr
    assert database.read_bytes() == b""


async def test_a_held_call_to_a_tool_with_an_output_schema_reads_as_pending_in_both_clients(
    tmp_path: Path,
) -> None:
    setup, sandbox = await filesystem_setup(tmp_path)
    arguments = {"path": str(sandbox / "held.txt"), "content": "x\n"}
    async with host(setup) as session:
        listed = {tool.name: tool for tool in (await session.list_tools()).tools}
        # The Python client checks a success's structured content against the listing.
        held = await session.call_tool("fs_write_file", arguments)
    schema = listed["fs_write_file"].output_schema
    assert schema is not None and schema["anyOf"][0]["properties"]["content"]["type"] == "string"
    assert held.is_error is False
    assert text_of(held).startswith("PENDING_APPROVAL: this call needs a person's approval")
    assert "call this same tool (fs_write_file) again" in text_of(held)
    assert held.structured_content is not None
    assert held.structured_content["agentrt"]["status"] == "PENDING_APPROVAL"
    finished = subprocess.run(
        ["node", str(Path(__file__).parent / "clients" / "ts_host.mjs")],
        capture_output=True, text=True, timeout=90, cwd=setup.root,
        env={
            **setup.environment(),
            "AGENTRT_NODE_MODULES": str(
                Path(__file__).resolve().parents[1] / "npm" / "node_modules"
            ),
            "AGENTRT_PROXY_COMMAND": json.dumps(setup.command()),
            "AGENTRT_CALLS": json.dumps([{"name": "fs_write_file", "arguments": arguments}]),
            "HOME": os.environ.get("HOME", "/tmp"),
        },
    )  # fmt: skip
    # The TypeScript client (Claude Code's, the Inspector's) refuses a success its schema
    # does not admit: it took this one, and the model reads it as waiting, not failed.
    assert finished.returncode == 0, finished.stderr
    [ts_held] = json.loads(finished.stdout)["results"]
    assert ts_held.get("isError") is not True
    assert ts_held["content"][0]["text"].startswith("PENDING_APPROVAL: ")
    assert ts_held["structuredContent"]["agentrt"]["status"] == "PENDING_APPROVAL"
    assert not (sandbox / "held.txt").exists()


def test_a_schema_whose_refs_point_into_it_is_listed_as_sent() -> None:
    from agentrt.proxy._answers import admits_waiting, listed_output_schema

    with_defs = {
        "type": "object",
        "$defs": {"line": {"type": "string"}},
        "properties": {"first": {"$ref": "#/$defs/line"}},
    }
    wrapped = listed_output_schema(with_defs)
    assert wrapped["$defs"] == with_defs["$defs"] and admits_waiting(wrapped)
    pointing = {"type": "object", "properties": {"a": {"type": "string"},
                                                 "b": {"$ref": "#/properties/a"}}}  # fmt: skip
    assert listed_output_schema(pointing) == pointing
    assert not admits_waiting(pointing)
