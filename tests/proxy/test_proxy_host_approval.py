"""Approve in the host: a held call asks the host's user through form elicitation (the official
SDK client with an elicitation callback), and the answer is an operator's decision."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from proxy_helpers import RULES, ProxySetup, build_setup, text_of
from test_proxy_hosts import http_proxy

from agentrt import grants
from agentrt.proxy import ConfigError, load_config
from agentrt.store import ApprovalStatus, open_store

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]

Answerer = Callable[[Any, Any], Awaitable[types.ElicitResult]]


@asynccontextmanager
async def host_asked(setup: ProxySetup, answer: Answerer | None) -> AsyncIterator[ClientSession]:
    """A real host that shows elicitation: the SDK client with `answer` as its callback."""
    command = setup.command()
    parameters = StdioServerParameters(
        command=command[0], args=command[1:], env=setup.environment(), cwd=str(setup.root)
    )
    with setup.stderr_path.open("a") as errlog:
        async with (
            stdio_client(parameters, errlog=errlog) as (read_stream, write_stream),
            ClientSession(
                read_stream, write_stream, elicitation_callback=answer,
                client_info=types.Implementation(name="desk-host", version="1.0"),
            ) as session,
        ):  # fmt: skip
            await session.initialize()
            yield session


def _answering(asked: list[str], action: str, content: dict[str, Any] | None = None) -> Answerer:
    async def answer(context: Any, params: Any) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action=action, content=content)  # type: ignore[arg-type]

    return answer


def _latest_approval(setup: ProxySetup) -> Any:
    with open_store(setup.database, create=False) as store:
        [run] = store.list_runs(limit=1)
        approval = store.latest_approval(run.run_id)
        assert store.verify_chain().ok
        return approval


async def test_approved_in_the_host_the_call_runs_in_the_same_request_recorded_by_the_host(
    tmp_path: Path,
) -> None:
    setup = await build_setup(tmp_path, approve_in_host=True)
    asked: list[str] = []
    answer = _answering(asked, "accept", {"decision": "approve", "note": "looks right"})
    async with host_asked(setup, answer) as session:
        result = await session.call_tool("up_send_mail", {"to": "ops@example.org", "body": "hi"})
    assert result.is_error is False, text_of(result)
    assert setup.executions() == ["send_mail ops@example.org"]
    approval = _latest_approval(setup)
    assert approval.status is ApprovalStatus.USED
    assert approval.decided_by == "host:desk-host" and approval.note == "looks right"
    [message] = asked
    assert "up_send_mail" in message and "ops@example.org" in message
    assert approval.approval_hash in message


async def test_declined_in_the_host_is_a_rejection_that_says_so(tmp_path: Path) -> None:
    setup = await build_setup(tmp_path, approve_in_host=True)
    async with host_asked(setup, _answering([], "decline")) as session:
        result = await session.call_tool("up_send_mail", {"to": "x@y.z", "body": "b"})
    assert text_of(result).startswith("REJECTED: ")
    assert "declined in the host" in text_of(result)
    approval = _latest_approval(setup)
    assert approval.status is ApprovalStatus.REJECTED
    assert approval.decided_by == "host:desk-host"
    assert setup.executions() == []


async def test_rejected_in_the_host_tells_the_model_the_note(tmp_path: Path) -> None:
    setup = await build_setup(tmp_path, approve_in_host=True)
    answer = _answering([], "accept", {"decision": "reject", "note": "wrong recipient"})
    async with host_asked(setup, answer) as session:
        result = await session.call_tool("up_send_mail", {"to": "x@y.z", "body": "b"})
    assert text_of(result).startswith("REJECTED: ") and "wrong recipient" in text_of(result)
    assert setup.executions() == []


async def test_a_cancel_in_the_host_leaves_the_approval_waiting_for_the_command(
    tmp_path: Path,
) -> None:
    setup = await build_setup(tmp_path, approve_in_host=True)
    async with host_asked(setup, _answering([], "cancel")) as session:
        held = await session.call_tool("up_send_mail", {"to": "x@y.z", "body": "b"})
        assert text_of(held).startswith("PENDING_APPROVAL: ")
        assert _latest_approval(setup).status is ApprovalStatus.PENDING
        setup.approve_latest()
        ran = await session.call_tool("up_send_mail", {"to": "x@y.z", "body": "b"})
    assert ran.is_error is False
    assert setup.executions() == ["send_mail x@y.z"]


async def test_the_host_is_never_asked_for_an_excluded_class_or_when_not_configured(
    tmp_path: Path,
) -> None:
    rules = {**RULES, "write_note": {"side_effect": "destructive", "outcome": "require_approval"}}
    setup = await build_setup(tmp_path, rules=rules, approve_in_host=True)
    asked: list[str] = []
    approve = _answering(asked, "accept", {"decision": "approve"})
    async with host_asked(setup, approve) as session:
        destructive = await session.call_tool("up_write_note", {"note": "n"})
    plain = await build_setup(tmp_path / "plain")
    async with host_asked(plain, approve) as session:
        unconfigured = await session.call_tool("up_send_mail", {"to": "x@y.z", "body": "b"})
    assert asked == []
    assert text_of(destructive).startswith("PENDING_APPROVAL: ")
    assert text_of(unconfigured).startswith("PENDING_APPROVAL: ")
    assert setup.executions() == [] and plain.executions() == []


async def test_a_host_without_elicitation_is_not_asked_and_the_call_waits(
    tmp_path: Path,
) -> None:
    setup = await build_setup(tmp_path, approve_in_host=True)
    async with host_asked(setup, None) as session:
        held = await session.call_tool("up_send_mail", {"to": "x@y.z", "body": "b"})
    assert text_of(held).startswith("PENDING_APPROVAL: ")
    assert _latest_approval(setup).status is ApprovalStatus.PENDING


async def test_the_host_is_never_asked_when_the_proxy_serves_many_hosts_over_http(
    tmp_path: Path,
) -> None:
    setup = await build_setup(tmp_path, approve_in_host=True)
    asked: list[str] = []
    approve = _answering(asked, "accept", {"decision": "approve"})
    async with (
        http_proxy(setup) as url,
        streamable_http_client(url) as (read_stream, write_stream),
        ClientSession(read_stream, write_stream, elicitation_callback=approve) as session,
    ):
        await session.initialize()
        held = await session.call_tool("up_send_mail", {"to": "x@y.z", "body": "b"})
    assert asked == []
    assert text_of(held).startswith("PENDING_APPROVAL: ")
    assert setup.executions() == []


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("yes", "approve_in_host"),
        ({"exclude_classes": ["destructiv"]}, "approve_in_host.exclude_classes"),
        ({"exclude_tools": "x"}, "approve_in_host.exclude_tools"),
        ({"wait": 10}, "approve_in_host.wait"),
        ({"ask": True}, "approve_in_host.ask"),
    ],
)
def test_a_wrong_approve_in_host_field_is_refused_naming_it(
    tmp_path: Path, value: Any, named: str
) -> None:
    document = {
        "database": "proxy.db",
        "session": "s",
        "approve_in_host": value,
        "servers": [{"name": "up", "command": ["x"], "manifest": "m.json", "rules": RULES}],
    }
    path = tmp_path / "proxy.json"
    path.write_text(json.dumps(document))
    path.chmod(0o600)
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        load_config(path)


async def test_approve_and_grant_in_the_host_gives_the_grant_whose_scope_the_message_showed(
    tmp_path: Path,
) -> None:
    setup = await build_setup(
        tmp_path, approve_in_host=True, standing_grants={"max_for": "1h", "max_calls": 2}
    )
    asked: list[Any] = []

    async def answer(context: Any, params: Any) -> types.ElicitResult:
        asked.append(params)
        return types.ElicitResult(action="accept", content={"decision": "approve_and_grant"})

    async with host_asked(setup, answer) as session:
        first = await session.call_tool("up_send_mail", {"to": "a@example.org", "body": "1"})
        second = await session.call_tool("up_send_mail", {"to": "b@example.org", "body": "2"})
    assert first.is_error is False and second.is_error is False
    assert setup.executions() == ["send_mail a@example.org", "send_mail b@example.org"]
    [params] = asked  # the second call ran under the grant: nobody was asked
    assert params.requested_schema["properties"]["decision"]["enum"] == [
        "approve", "approve_and_grant", "reject",
    ]  # fmt: skip
    with open_store(setup.database, create=False) as store:
        [grant] = grants.list_grants(store, include_ended=True)
    assert f"grant scope hash: {grant.scope_hash}" in params.message
    assert grant.given_by == "host:desk-host" and grant.calls_left == 1


async def test_the_host_is_offered_no_grant_where_none_may_be_given(tmp_path: Path) -> None:
    setup = await build_setup(tmp_path, approve_in_host=True)
    asked: list[Any] = []

    async def answer(context: Any, params: Any) -> types.ElicitResult:
        asked.append(params)
        return types.ElicitResult(action="accept", content={"decision": "approve_and_grant"})

    async with host_asked(setup, answer) as session:
        held = await session.call_tool("up_send_mail", {"to": "a@example.org", "body": "1"})
    [params] = asked
    assert params.requested_schema["properties"]["decision"]["enum"] == ["approve", "reject"]
    assert "standing grant" not in params.message
    # An answer the form did not offer decides nothing: the approval still waits.
    assert text_of(held).startswith("PENDING_APPROVAL: ")
    assert setup.executions() == []


async def test_a_host_on_the_2026_revision_is_asked_through_an_input_required_result(
    tmp_path: Path,
) -> None:
    from mcp import Client

    setup = await build_setup(tmp_path, approve_in_host=True)
    asked: list[str] = []
    answer = _answering(asked, "accept", {"decision": "approve", "note": "yes, statelessly"})
    command = setup.command()
    parameters = StdioServerParameters(
        command=command[0], args=command[1:], env=setup.environment(), cwd=str(setup.root)
    )
    async with Client(
        parameters, mode="2026-07-28", elicitation_callback=answer,
        client_info=types.Implementation(name="new-host", version="2.0"),
    ) as client:  # fmt: skip
        assert client.protocol_version == "2026-07-28"
        result = await client.call_tool("up_send_mail", {"to": "ops@example.org", "body": "hi"})
    assert result.is_error is False, text_of(result)
    # Asked once, through the call's input-required result; the retry ran the call once.
    [message] = asked
    assert "up_send_mail" in message
    assert setup.executions() == ["send_mail ops@example.org"]
    approval = _latest_approval(setup)
    assert approval.status is ApprovalStatus.USED
    assert approval.decided_by == "host:new-host" and approval.note == "yes, statelessly"
    assert approval.approval_hash in message
