"""Flow rules through a real host and the small upstream, labels set on its rules:
orders, a denying rule, conditions reading the taint, an approval that runs the held send,
and a configuration without labels recording nothing new."""

from __future__ import annotations

import json
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, ClientSession
from mcp.client.streamable_http import streamable_http_client
from proxy_helpers import RULES, ProxySetup, build_setup, host, serving_http, text_of

from agentrt.store import open_store

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]

TRIFECTA = {"after": ["private", "untrusted"], "call": "egress", "outcome": "require_approval"}
POLICY = {"read_only": "allow", "local_mutation": "allow", "remote_mutation": "allow"}


def _rules(**extra: dict[str, Any]) -> dict[str, Any]:
    """echo reads private data, write_note takes in an outsider's text, send_mail sends."""
    rules = {name: dict(rule) for name, rule in RULES.items()}
    rules["echo"]["labels"] = ["private"]
    rules["write_note"]["labels"] = ["untrusted"]
    rules["send_mail"]["labels"] = ["egress"]
    for name, fields in extra.items():
        rules[name].update(fields)
    return rules


async def _setup(
    tmp_path: Path, flows: list[dict[str, Any]] | None = None, **extra: Any
) -> ProxySetup:
    rules = _rules(**extra.pop("rules", {}))
    return await build_setup(
        tmp_path,
        rules,
        policy={**POLICY, "flows": flows if flows is not None else [TRIFECTA]},
        hold="0s",
        **extra,
    )


async def _calls(setup: ProxySetup, *names: str) -> list[str]:
    arguments = {
        "echo": {"text": "private"},
        "write_note": {"note": "from outside"},
        "send_mail": {"to": "a@example.com", "body": "hello"},
    }
    answers = []
    async with host(setup) as session:
        for position, name in enumerate(names):
            # Each send differs, so no repeat rule answers for the flow rule.
            args = dict(arguments[name])
            if name == "send_mail":
                args["body"] = f"hello {position}"
            answers.append(text_of(await session.call_tool(f"up_{name}", args)))
    return answers


def _decisions(database: str | Path) -> list[dict[str, Any]]:
    with open_store(database, read_only=True, create=False) as store:
        rows = store.query(
            "SELECT payload FROM events WHERE type IN ('policy_decided', 'run_resumed')"
            " ORDER BY seq"
        )
        assert store.verify_chain().ok and store.verify_state().ok
    return [json.loads(row[0]) for row in rows]


@pytest.mark.parametrize(
    ("order", "held_at"),
    [
        (("echo", "write_note", "send_mail"), 2),
        (("write_note", "echo", "send_mail"), 2),
        (("send_mail", "echo", "write_note", "send_mail"), 3),
        (("echo", "send_mail", "write_note", "echo", "send_mail"), 4),
        (("echo", "send_mail"), None),
        (("write_note", "send_mail"), None),
    ],
)
async def test_a_send_is_held_only_once_the_session_holds_every_label_of_the_rule(
    tmp_path: Path, order: tuple[str, ...], held_at: int | None
) -> None:
    setup = await _setup(tmp_path)
    answers = await _calls(setup, *order)
    for position, answer in enumerate(answers):
        if position == held_at:
            assert answer.startswith("PENDING_APPROVAL"), answer
        else:
            assert not answer.startswith(("PENDING_APPROVAL", "DENIED")), answer
    log = setup.upstream_log.read_text() if setup.upstream_log.exists() else ""
    sent = [line for line in log.splitlines() if "mail" in line]
    assert len(sent) == order.count("send_mail") - (held_at is not None)


async def test_a_denying_flow_rule_denies_and_tells_the_model_no_session_or_call(
    tmp_path: Path,
) -> None:
    rule = {"after": ["private"], "call": "egress", "outcome": "deny"}
    setup = await _setup(tmp_path, flows=[rule])
    _, answer = await _calls(setup, "echo", "send_mail")
    assert answer.startswith("DENIED"), answer
    assert "stdio-" not in answer and "up_echo" not in answer
    assert not setup.upstream_log.exists()  # nothing changing ran
    assert _decisions(setup.database)[-1]["flow"]["tainted_by"][0]["tool"] == "up_echo"


async def test_a_flow_rule_never_loosens_a_stricter_class_decision(tmp_path: Path) -> None:
    setup = await _setup(tmp_path, rules={"send_mail": {"outcome": "deny"}})
    _, _, answer = await _calls(setup, "echo", "write_note", "send_mail")
    assert answer.startswith("DENIED"), answer  # the rule's deny stands over require_approval


async def test_conditions_read_the_session_labels_and_the_tools_own(tmp_path: Path) -> None:
    when = [
        {"if": "'private' in session.labels && 'egress' in labels", "outcome": "deny"},
    ]
    setup = await _setup(tmp_path, flows=[], rules={"send_mail": {"when": when}})
    first, _, second = await _calls(setup, "send_mail", "echo", "send_mail")
    assert not first.startswith("DENIED"), first
    assert second.startswith("DENIED"), second


async def test_an_approved_held_send_runs_once_and_its_resume_records_the_taint(
    tmp_path: Path, on_backend: dict[str, Any]
) -> None:
    setup = await _setup(tmp_path, **on_backend)
    async with host(setup) as session:
        await session.call_tool("up_echo", {"text": "private"})
        await session.call_tool("up_write_note", {"note": "from outside"})
        arguments = {"to": "a@example.com", "body": "hello"}
        held = text_of(await session.call_tool("up_send_mail", arguments))
        assert held.startswith("PENDING_APPROVAL"), held
        approved = subprocess.run(
            setup.operator_command("approve"), capture_output=True, text=True,
            env=setup.environment(),
        )  # fmt: skip
        assert approved.returncode == 0, approved.stderr
        (why,) = [line for line in approved.stdout.splitlines() if line.startswith("why: ")]
        assert "host session stdio-" in why and "up_echo" in why and "up_write_note" in why
        ran = text_of(await session.call_tool("up_send_mail", arguments))
        assert not ran.startswith(("PENDING_APPROVAL", "DENIED")), ran
    assert setup.upstream_log.read_text().count("mail") == 1
    resumed = _decisions(setup.database)[-1]
    assert resumed["flow"]["taint"] == ["private", "untrusted"]
    assert resumed["flow"]["adds"] == ["egress"]


async def test_without_labels_no_decision_records_a_flow(tmp_path: Path) -> None:
    setup = await build_setup(tmp_path, RULES, policy={**POLICY, "flows": [TRIFECTA]}, hold="0s")
    await _calls(setup, "echo", "write_note", "send_mail")
    decisions = _decisions(setup.database)
    assert decisions and all("flow" not in payload for payload in decisions)
    with open_store(setup.database, read_only=True, create=False) as store:
        runs = store.list_runs()
    assert all("host_session" not in run.metadata for run in runs)


async def test_recheck_replays_recorded_calls_under_a_new_flow_rule_with_their_recorded_taint(
    tmp_path: Path,
) -> None:
    setup = await _setup(tmp_path, flows=[])
    answers = await _calls(setup, "send_mail", "echo", "write_note", "send_mail")
    assert not any(answer.startswith("PENDING_APPROVAL") for answer in answers)
    setup.document["policy"]["flows"] = [TRIFECTA]
    setup.config_path.write_text(json.dumps(setup.document))
    checked = subprocess.run(
        [*setup.command()[:1], "--json", "recheck", "--config", str(setup.config_path)],
        capture_output=True, text=True, env=setup.environment(),
    )  # fmt: skip
    assert checked.returncode == 0, checked.stderr
    records = [json.loads(line) for line in checked.stdout.splitlines()]
    differences = [record for record in records if record.get("record") == "difference"]
    # Only the last send: the first was made before the session held anything.
    assert [(d["tool"], d["was"], d["would"]) for d in differences] == [
        ("up_send_mail", "allow", "require_approval")
    ], records
    assert "up_echo" in differences[0]["would_reason"]
    assert "up_write_note" in differences[0]["would_reason"]


async def test_a_stateless_hosts_taint_is_kept_under_the_operators_key_across_a_restart(
    tmp_path: Path,
) -> None:
    setup = await _setup(tmp_path, stateless_session="desk-key")
    with serving_http(setup.config_path, setup.root) as (url, _stderr):
        async with Client(url, mode="2026-07-28", cache=None) as stateless:
            await stateless.call_tool("up_echo", {"text": "private"})
            await stateless.call_tool("up_write_note", {"note": "from outside"})
    # A new proxy process: the key outlives it, and so does its taint.
    second = tmp_path / "second"  # its own stderr, so its start line is its own
    second.mkdir()
    with serving_http(setup.config_path, second) as (url, _stderr):
        async with Client(url, mode="2026-07-28", cache=None) as stateless:
            held = await stateless.call_tool("up_send_mail", {"to": "a@x", "body": "1"})
        async with _http_session(url) as fresh:
            sent = await fresh.call_tool("up_send_mail", {"to": "a@x", "body": "2"})
    assert text_of(held).startswith("PENDING_APPROVAL"), text_of(held)
    assert not text_of(sent).startswith(("PENDING_APPROVAL", "DENIED")), text_of(sent)
    sessions = [payload["flow"]["session"] for payload in _decisions(setup.database)]
    assert sessions[:3] == ["desk-key"] * 3 and sessions[3].startswith("http-")


@asynccontextmanager
async def _http_session(url: str) -> AsyncIterator[ClientSession]:
    async with (
        streamable_http_client(url) as (read_stream, write_stream),
        ClientSession(read_stream, write_stream) as session,
    ):
        await session.initialize()
        yield session


async def test_calls_a_flow_rule_holds_count_against_max_pending(tmp_path: Path) -> None:
    setup = await _setup(tmp_path, max_pending=1)
    *_, first, second = await _calls(setup, "echo", "write_note", "send_mail", "send_mail")
    assert first.startswith("PENDING_APPROVAL"), first
    assert second.startswith("UNAVAILABLE") and "already wait" in second, second


async def test_the_model_is_offered_no_way_to_clear_a_taint(tmp_path: Path) -> None:
    setup = await _setup(tmp_path)
    async with host(setup) as session:
        listed = await session.list_tools()
    names = {tool.name for tool in listed.tools}
    assert names == {f"up_{name}" for name in RULES if name != "gate_status"} | {"gate_status"}
    assert not any("taint" in name or "flow" in name for name in names)
