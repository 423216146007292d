"""What a host's user meets: the server's own results, per-tool rules, empty lists, the status.

Real clients (the official Python SDK) against a real `agentrt proxy` in front of
the stock filesystem and everything servers.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from proxy_helpers import (
    REPO,
    ProxySetup,
    RawHost,
    build_setup,
    host,
    text_of,
    until,
    write_private,
)
from test_proxy_hosts import filesystem_setup, http_proxy

from agentrt.canonical import canonical_json
from agentrt.mcp import Server, pin
from agentrt.proxy.config import load_config
from agentrt.store import open_store

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120), pytest.mark.slow]

EVERYTHING_SERVER = (
    REPO / "tests/npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js"
)


def _rewrite_rules(setup: ProxySetup, rules: dict[str, Any], **top: Any) -> None:
    document = dict(setup.document, **top)
    document["servers"] = [dict(document["servers"][0], rules=rules)]
    write_private(setup.config_path, json.dumps(document))
    setup.document = document


def _steps(database: Path) -> list[Any]:
    with open_store(database) as store:
        runs = store.list_runs()
        return [step for run in runs for step in store.list_steps(run.run_id)]


async def test_a_text_file_reads_as_plain_text_and_the_record_ties_to_the_answer(
    tmp_path: Path,
) -> None:
    setup, sandbox = await filesystem_setup(tmp_path)
    (sandbox / "quoted.txt").write_text('line "one"\nline two\n')
    async with host(setup) as session:
        listed = {tool.name: tool for tool in (await session.list_tools()).tools}
        result = await session.call_tool("fs_read_text_file", {"path": str(sandbox / "quoted.txt")})
    # The server's own text block, not a JSON-escaped string of it.
    assert result.is_error is False
    assert [block.type for block in result.content] == ["text"]
    assert result.content[0].text == 'line "one"\nline two\n'
    assert listed["fs_read_text_file"].output_schema is not None
    assert result.structured_content == {"content": 'line "one"\nline two\n'}
    forwarded = result.model_dump(by_alias=True, exclude_none=True, mode="json")
    forwarded.pop("_meta", None)
    encoded = canonical_json(
        {
            "content": forwarded["content"],
            "isError": False,
            "structuredContent": forwarded["structuredContent"],
        }
    ).encode()
    [step] = [step for step in _steps(setup.database) if step.tool == "fs_read_text_file"]
    assert f"forwarded {len(encoded)} bytes, sha256 {hashlib.sha256(encoded).hexdigest()}" in (
        step.summary or ""
    )


async def test_flattened_results_keep_the_old_single_text(tmp_path: Path) -> None:
    setup, sandbox = await filesystem_setup(tmp_path)
    document = dict(setup.document)
    document["servers"] = [dict(document["servers"][0], results="flattened")]
    write_private(setup.config_path, json.dumps(document))
    async with host(setup) as session:
        listed = {tool.name: tool for tool in (await session.list_tools()).tools}
        result = await session.call_tool("fs_read_text_file", {"path": str(sandbox / "README.md")})
    assert listed["fs_read_text_file"].output_schema is None
    assert result.structured_content is None
    assert json.loads(text_of(result)) == {"content": "hello from the sandbox\n"}


async def test_a_result_over_max_result_bytes_is_cut_with_a_note_the_model_reads(
    tmp_path: Path,
) -> None:
    setup, sandbox = await filesystem_setup(tmp_path)
    (sandbox / "big.txt").write_text("x" * 5000)
    document = dict(setup.document)
    document["servers"] = [dict(document["servers"][0], max_result_bytes=2048)]
    write_private(setup.config_path, json.dumps(document))
    async with host(setup) as session:
        result = await session.call_tool("fs_read_text_file", {"path": str(sandbox / "big.txt")})
    text = text_of(result)
    assert "[agentrt: this result was cut to the proxy's limit of 2048 bytes" in text
    assert "the structured content" in text and "the rest of text block 1" in text
    assert len(json.dumps(result.model_dump(by_alias=True, exclude_none=True))) < 2300
    # The outputSchema promised structured content that no longer fits: an error, not a lie.
    assert result.is_error is True


async def test_repeat_window_0s_runs_the_identical_write_twice(tmp_path: Path) -> None:
    setup, sandbox = await filesystem_setup(tmp_path)
    rules = {
        "read_text_file": {"side_effect": "read_only"},
        "write_file": {
            "side_effect": "local_mutation",
            "allow_hint_mismatch": True,
            "repeat_window": "0s",
            "outcome": "allow",
        },
    }
    _rewrite_rules(setup, rules)
    target = sandbox / "staged.txt"
    arguments = {"path": str(target), "content": "v1\n"}
    async with host(setup) as session:
        first = await session.call_tool("fs_write_file", arguments)
        target.write_text("edited meanwhile\n")
        second = await session.call_tool("fs_write_file", arguments)
    assert first.is_error is False and second.is_error is False, text_of(second)
    assert target.read_text() == "v1\n"
    assert len([s for s in _steps(setup.database) if s.tool == "fs_write_file"]) == 2


async def test_a_rule_outcome_deny_denies_one_read_only_tool(tmp_path: Path) -> None:
    setup, sandbox = await filesystem_setup(tmp_path)
    rules = {
        "read_text_file": {"side_effect": "read_only", "outcome": "deny"},
        "list_allowed_directories": {"side_effect": "read_only"},
    }
    _rewrite_rules(setup, rules)
    async with host(setup) as session:
        denied = await session.call_tool("fs_read_text_file", {"path": str(sandbox / "README.md")})
        listed = await session.call_tool("fs_list_allowed_directories", {})
    assert denied.is_error is True
    assert text_of(denied).startswith("DENIED: ")
    assert "the rule for fs_read_text_file denies it" in text_of(denied)
    assert listed.is_error is False and str(sandbox) in text_of(listed)


async def test_resources_templates_and_prompts_list_empty_and_ping_answers(
    setup: ProxySetup,
) -> None:
    async with host(setup) as session:
        assert (await session.list_resources()).resources == []
        assert (await session.list_resource_templates()).resource_templates == []
        assert (await session.list_prompts()).prompts == []
        await session.send_ping()


async def test_gate_status_says_approved_after_agentrt_approve_with_or_without_an_id(
    setup: ProxySetup,
) -> None:
    arguments = {"to": "ops@example.org", "body": "hi"}
    async with host(setup) as session:
        pending = await session.call_tool("up_send_mail", arguments)
        assert text_of(pending).startswith("PENDING_APPROVAL: ")
        approval_id = setup.waiting_commands()[-1][1]
        approved = subprocess.run(
            setup.operator_command("approve"), capture_output=True, text=True, timeout=30,
            env=setup.environment(),
        )  # fmt: skip
        assert approved.returncode == 0, approved.stderr
        assert "the next identical call" in approved.stdout + approved.stderr
        status = await session.call_tool("gate_status", {"approval_id": approval_id})
        assert "was approved and has not run yet" in text_of(status)
        listing = text_of(await session.call_tool("gate_status", {}))
        assert "waits for a person's decision" not in listing
        assert f"approval {approval_id}: up_send_mail was approved" in listing
        assert "runs on the next call of the tool with exactly the same arguments" in listing
        assert "next call of the tool with exactly the same arguments" in text_of(status)
        ran = await session.call_tool("up_send_mail", arguments)
        assert ran.is_error is False
        after = await session.call_tool("gate_status", {"approval_id": approval_id})
    assert "the call ran: the server returned a result" in text_of(after)
    assert setup.executions() == ["send_mail ops@example.org"]


async def test_a_host_traceparent_lands_in_the_runs_metadata(setup: ProxySetup) -> None:
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    async with host(setup) as session:
        await session.call_tool("up_echo", {"text": "hi"}, meta={"traceparent": parent})
    with open_store(setup.database) as store:
        [run] = store.list_runs()
        assert run.metadata["traceparent"] == parent
        assert run.metadata["proxy_session"] == "test-session"


async def test_an_upstream_tool_error_keeps_the_tool_error_prefix(setup: ProxySetup) -> None:
    async with host(setup) as session:
        failed = await session.call_tool("up_fail", {})
    assert failed.is_error is True
    assert text_of(failed).startswith("TOOL_ERROR: the tool up_fail failed: ")


async def everything_setup(root: Path) -> ProxySetup:
    conf = root / "conf"
    command = ["node", str(EVERYTHING_SERVER)]
    manifest = await pin(Server(name="ev", command=command, connect_timeout=30.0))
    write_private(conf / "ev.manifest.json", manifest.to_json())
    document: dict[str, Any] = {
        "database": "proxy.db",
        "session": "ev-session",
        "hold": "300ms",
        "servers": [
            {
                "name": "ev",
                "command": command,
                "default_timeout": "30s",
                "manifest": "ev.manifest.json",
                "rules": {
                    "get-tiny-image": {"side_effect": "read_only", "allow_hint_mismatch": True},
                    "echo": {"side_effect": "read_only", "allow_hint_mismatch": True},
                },
            }
        ],
    }
    config_path = write_private(conf / "proxy.json", json.dumps(document))
    return ProxySetup(
        root=root, config_path=config_path, database=conf / "proxy.db",
        upstream_log=root / "none.log", stderr_path=root / "proxy.stderr", document=document,
    )  # fmt: skip


async def test_the_everything_servers_image_tool_returns_an_image_block_over_http(
    tmp_path: Path,
) -> None:
    setup = await everything_setup(tmp_path)
    async with (
        http_proxy(setup) as url,
        streamable_http_client(url) as (read_stream, write_stream),
        ClientSession(read_stream, write_stream) as session,
    ):
        await session.initialize()
        result = await session.call_tool("ev_get-tiny-image", {})
        resources = await session.list_resources()
    kinds = [block.type for block in result.content]
    assert "image" in kinds, kinds
    image = next(block for block in result.content if block.type == "image")
    assert image.mime_type == "image/png" and len(image.data) > 100
    # The resources are offered as pinned (issue 20); before, the list was empty.
    pinned = json.loads((setup.config_path.parent / "ev.manifest.json").read_text())["resources"]
    assert {str(resource.uri) for resource in resources.resources} == set(pinned)


async def test_http_on_a_port_in_use_says_one_sentence_and_exits_1(setup: ProxySetup) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        finished = subprocess.run(
            [*setup.command(), "--http", f"127.0.0.1:{port}"], capture_output=True, text=True,
            timeout=60, stdin=subprocess.DEVNULL, env=setup.environment(), cwd=setup.root,
        )  # fmt: skip
    assert finished.returncode == 1, finished.stderr
    assert "Traceback" not in finished.stderr, finished.stderr[-4000:]
    last = finished.stderr.strip().splitlines()[-1]
    assert last.startswith("agentrt proxy: ") and f"127.0.0.1:{port}" in last
    assert "in use" in last


async def test_zero_durations_mean_off_where_off_makes_sense(tmp_path: Path) -> None:
    setup = await build_setup(tmp_path)
    document = dict(
        setup.document, hold="0s", repeat_window="0s", approval_ttl="0s", grant_ttl="0s"
    )
    write_private(setup.config_path, json.dumps(document))
    config = load_config(setup.config_path)
    assert (config.hold, config.repeat_window) == (0.0, 0.0)
    assert config.approval_ttl is None and config.grant_ttl is None
    document["lease_ttl"] = "0s"
    write_private(setup.config_path, json.dumps(document))
    with pytest.raises(Exception, match="lease_ttl"):
        load_config(setup.config_path)


async def everything_with_progress(root: Path) -> ProxySetup:
    setup = await everything_setup(root)
    rules = dict(setup.document["servers"][0]["rules"])
    rules["trigger-long-running-operation"] = {
        "side_effect": "read_only",
        "allow_hint_mismatch": True,
    }
    _rewrite_rules(setup, rules)
    return setup


async def test_a_long_running_operation_with_a_progress_token_delivers_the_upstreams_progress(
    tmp_path: Path,
) -> None:
    setup = await everything_with_progress(tmp_path)
    notes: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        notes.append((progress, total, message))

    async with host(setup) as session:
        result = await session.call_tool(
            "ev_trigger-long-running-operation",
            {"duration": 1, "steps": 3},
            progress_callback=on_progress,
        )
    assert result.is_error is False, text_of(result)
    assert [(progress, total) for progress, total, _ in notes] == [(1, 3), (2, 3), (3, 3)]


async def test_the_typescript_client_reads_text_lists_the_pinned_resources_and_gets_progress(
    tmp_path: Path,
) -> None:
    setup = await everything_with_progress(tmp_path)
    calls = [
        {"name": "ev_echo", "arguments": {"message": "plain text"}},
        {"name": "ev_get-tiny-image", "arguments": {}},
        {"name": "ev_trigger-long-running-operation", "arguments": {"duration": 1, "steps": 2}},
    ]
    finished = subprocess.run(
        ["node", str(Path(__file__).parent / "clients" / "ts_host.mjs")],
        capture_output=True, text=True, timeout=90, cwd=setup.root,
        env={
            **setup.environment(),
            "AGENTRT_NODE_MODULES": str(REPO / "tests/npm/node_modules"),
            "AGENTRT_PROXY_COMMAND": json.dumps(setup.command()),
            "AGENTRT_CALLS": json.dumps(calls),
            "HOME": os.environ.get("HOME", "/tmp"),
        },
    )  # fmt: skip
    assert finished.returncode == 0, finished.stderr
    seen = json.loads(finished.stdout)
    # The resources and prompts are offered as pinned (issue 20); before, both lists were empty.
    pinned = json.loads((setup.config_path.parent / "ev.manifest.json").read_text())
    assert {resource["uri"] for resource in seen["resources"]} == set(pinned["resources"])
    assert {prompt["name"] for prompt in seen["prompts"]} == set(pinned["prompts"])
    echo, image, slow = seen["results"]
    assert echo["content"] == [{"type": "text", "text": "Echo: plain text"}]
    assert any(block["type"] == "image" for block in image["content"])
    assert slow.get("isError") is not True
    # The proxy sent both progress notes, before the long call's answer (the last response).
    wire = seen["wire"]
    last = max(index for index, message in enumerate(wire) if "response" in message)
    assert wire[last - 2 :] == [{"progress": 1}, {"progress": 2}, wire[last]]
    # The client's own handler gets them, except that the TypeScript SDK drops a note that
    # arrives in the same read as its call's response (see ts_host.mjs): under load, the last.
    assert [note["progress"] for note in seen["progress"]] in ([1, 2], [1])
    assert seen["logged"] == []


async def test_the_2026_revision_discovers_and_calls_without_a_session(tmp_path: Path) -> None:
    setup, sandbox = await filesystem_setup(tmp_path)
    command = setup.command()
    parameters = StdioServerParameters(
        command=command[0], args=command[1:], env=setup.environment(), cwd=str(setup.root)
    )
    with setup.stderr_path.open("a"):
        async with Client(parameters, mode="auto", cache=None) as client:
            listed = await client.list_tools()
            result = await client.call_tool(
                "fs_read_text_file", {"path": str(sandbox / "README.md")}
            )
            version = client.protocol_version
    assert {tool.name for tool in listed.tools} >= {"fs_read_text_file", "gate_status"}
    assert result.content[0].text == "hello from the sandbox\n"
    assert version == "2026-07-28"


async def test_the_2025_handshake_still_works_and_ping_answers(tmp_path: Path) -> None:
    setup, sandbox = await filesystem_setup(tmp_path)
    command = setup.command()
    parameters = StdioServerParameters(
        command=command[0], args=command[1:], env=setup.environment(), cwd=str(setup.root)
    )
    async with Client(parameters, mode="legacy", cache=None) as client:
        await client.send_ping()
        result = await client.call_tool("fs_read_text_file", {"path": str(sandbox / "README.md")})
        version = client.protocol_version
    assert version.startswith("2025-")
    assert result.content[0].text == "hello from the sandbox\n"


async def test_after_a_hosts_notifications_cancelled_no_response_is_sent_for_that_request(
    setup: ProxySetup,
) -> None:
    async with RawHost.start(setup) as raw:
        ping_before = await raw.request("ping", {})
        cancelled = await raw.call("up_write_note", {"note": "left", "seconds": 1.5})
        await until(lambda: len(setup.started()) == 1)
        await raw.notify(
            "notifications/cancelled", {"requestId": cancelled, "reason": "the user gave up"}
        )
        # Past the call's end, so a response to it would have been written by now.
        await until(lambda: setup.executions() == ["write_note left"])
        await anyio.sleep(0.5)
        later = await raw.send_request("ping", {})
        seen: list[dict[str, Any]] = []
        while True:
            message = json.loads(await raw._reader.receive_until(b"\n", 1 << 22))
            seen.append(message)
            if message.get("id") == later:
                break
    assert ping_before["result"] == {}
    assert [message for message in seen if message.get("id") == cancelled] == []


async def test_log_lines_read_by_a_call_its_host_gave_up_still_reach_the_host(
    setup: ProxySetup,
) -> None:
    # The call the host cancelled goes on (it is recorded) and is the one reading the
    # server's stdout; the log lines it reads meanwhile belong to the session, not to it.
    async with RawHost.start(setup) as raw:
        await raw.request("logging/setLevel", {"level": "debug"})
        given_up = await raw.call("up_echo", {"text": "slow", "seconds": 2})
        await until(lambda: len(setup.started()) == 1)
        await raw.notify("notifications/cancelled", {"requestId": given_up, "reason": "gave up"})
        waited = await raw.call("up_echo", {"text": "log:meanwhile"})
        seen: list[dict[str, Any]] = []
        with anyio.fail_after(30):
            while not any(message.get("id") == waited for message in seen):
                seen.append(json.loads(await raw._reader.receive_until(b"\n", 1 << 22)))
        logged = [m["params"] for m in seen if m.get("method") == "notifications/message"]
    assert [(line["level"], line["logger"]) for line in logged] == [
        ("debug", "upstream"), ("warning", "upstream")
    ]  # fmt: skip
    assert "debug log:meanwhile" in logged[0]["data"]
    answer = next(message for message in seen if message.get("id") == waited)
    assert answer["result"]["content"][0]["text"] == "log:meanwhile"


async def test_a_changed_fixed_value_asks_again_instead_of_using_the_old_approval(
    tmp_path: Path,
) -> None:
    from proxy_helpers import RULES

    rules = dict(RULES, send_mail={"side_effect": "remote_mutation", "fixed": {"body": "v1"}})
    setup = await build_setup(tmp_path, rules=rules)
    arguments = {"to": "ops@example.org"}
    async with host(setup) as session:
        first = await session.call_tool("up_send_mail", arguments)
    assert text_of(first).startswith("PENDING_APPROVAL: ")
    old = setup.approve_latest()
    assert old.capability["fixed"] == {"body": '"v1"'}
    changed = dict(rules, send_mail={"side_effect": "remote_mutation", "fixed": {"body": "v2"}})
    _rewrite_rules(setup, changed)
    async with host(setup) as session:
        again = await session.call_tool("up_send_mail", arguments)
    assert text_of(again).startswith("PENDING_APPROVAL: "), text_of(again)
    assert setup.executions() == []
    assert setup.approval(old.approval_id).status == "superseded"


async def test_upstream_logging_reaches_the_host_only_after_it_set_a_level_and_sanitized(
    setup: ProxySetup,
) -> None:
    received: list[Any] = []

    async def on_log(params: Any) -> None:
        received.append(params)

    command = setup.command()
    parameters = StdioServerParameters(
        command=command[0], args=command[1:], env=setup.environment(), cwd=str(setup.root)
    )
    with setup.stderr_path.open("a") as errlog:
        async with (
            stdio_client(parameters, errlog=errlog) as (read_stream, write_stream),
            ClientSession(read_stream, write_stream, logging_callback=on_log) as session,
        ):
            await session.initialize()
            before = await session.call_tool("up_echo", {"text": "log:before"})
            assert received == []
            await session.set_logging_level("warning")
            after = await session.call_tool("up_echo", {"text": "log:after"})
    assert before.is_error is False and after.is_error is False
    assert [(message.level, message.logger) for message in received] == [("warning", "upstream")]
    [message] = received
    assert "warning log:after" in message.data
    assert "\x1b" not in message.data and "\u202e" not in message.data


async def test_ping_answers_before_initialize(setup: ProxySetup) -> None:
    with setup.stderr_path.open("a") as errlog:
        process = await anyio.open_process(
            setup.command(), stderr=errlog, env=setup.environment(), cwd=str(setup.root)
        )
        raw = RawHost(process, errlog)
        try:
            with anyio.fail_after(30):
                before = await raw.request("ping", {})
                initialized = await raw.request("initialize", {
                    "protocolVersion": "2025-06-18", "capabilities": {},
                    "clientInfo": {"name": "raw-host", "version": "0"},
                })  # fmt: skip
        finally:
            process.kill()
            with anyio.CancelScope(shield=True):
                await process.wait()
    assert before == {"jsonrpc": "2.0", "id": 1, "result": {}}
    assert "result" in initialized
