"""The proxy driven as a host drives it: list, call, approve, duplicate, reject, expire."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest
from proxy_helpers import ProxySetup, build_setup, host, text_of, write_private

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


@pytest.fixture
async def setup(tmp_path: Path, on_backend: dict[str, Any]) -> ProxySetup:
    """Each test once with the proxy's store in SQLite and once in PostgreSQL."""
    return await build_setup(tmp_path, **on_backend)


async def test_the_host_sees_only_loaded_tools_and_one_gate_status(setup: ProxySetup) -> None:
    async with host(setup) as session:
        listing = await session.list_tools()
    names = sorted(tool.name for tool in listing.tools)
    assert names == [
        "gate_status",
        "up_crash",
        "up_echo",
        "up_fail",
        "up_send_mail",
        "up_write_note",
    ]
    hints = {
        tool.name: (tool.annotations.read_only_hint, tool.annotations.destructive_hint)
        for tool in listing.tools
        if tool.annotations is not None
    }
    # The operator's classes are what the host is told.
    assert hints["up_echo"] == (True, False)
    assert hints["up_write_note"] == (False, False)
    status = next(tool for tool in listing.tools if tool.name == "gate_status")
    assert "never runs" in (status.description or "")
    assert "already taken" in setup.stderr()


async def test_a_read_only_call_runs_and_answers_the_result(setup: ProxySetup) -> None:
    async with host(setup) as session:
        result = await session.call_tool("up_echo", {"text": "hello"})
    assert text_of(result) == "hello"
    assert result.is_error is False


async def test_approval_round_trip_runs_the_call_once_and_a_third_call_is_duplicate(
    setup: ProxySetup,
) -> None:
    arguments = {"to": "ops@example.org", "body": "deploy done"}
    async with host(setup) as session:
        first = await session.call_tool("up_send_mail", arguments)
        assert text_of(first).startswith("PENDING_APPROVAL: ")
        assert first.is_error is False
        assert setup.executions() == []
        # The operator runs exactly what the proxy printed.
        decided = subprocess.run(
            [*setup.operator_command("approve"), "--yes"], capture_output=True, text=True,
            timeout=30, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        assert decided.returncode == 0, decided.stderr
        approved = setup.approval(setup.waiting_commands()[-1][1])
        second = await session.call_tool("up_send_mail", arguments)
        assert text_of(second) == "sent to ops@example.org"
        assert second.is_error is False
        third = await session.call_tool("up_send_mail", arguments)
    assert text_of(third).startswith("DUPLICATE: ")
    assert "succeeded" in text_of(third)
    assert third.is_error is True
    assert setup.executions() == ["send_mail ops@example.org"]
    assert setup.approval(approved.approval_id).status == "used"


async def test_the_pending_answer_tells_the_model_to_wait_and_names_nothing_operational(
    setup: ProxySetup,
) -> None:
    async with host(setup) as session:
        result = await session.call_tool("up_send_mail", {"to": "a@b.c", "body": "x"})
    text = text_of(result)
    run_id, approval_id = setup.waiting_commands()[-1]
    assert "Nothing ran" in text
    assert "Do not retry" in text
    assert "another tool" in text
    assert "Tell the user that a person must approve it in the agentrt inbox" in text
    assert "exactly the same arguments" in text
    assert approval_id in text
    # `agentrt approve` and the inbox may be named (the user must hear where a person
    # approves); how to reach the records may not.
    for secret in (run_id, "test-session.", str(setup.database), "proxy.db", "proxy.json",
                   "agentrt --db", "--db", "--approval"):  # fmt: skip
        assert secret not in text


async def test_the_operator_line_on_stderr_has_the_exact_commands(setup: ProxySetup) -> None:
    async with host(setup) as session:
        await session.call_tool("up_send_mail", {"to": "a@b.c", "body": "x"})
    run_id, approval_id = setup.waiting_commands()[-1]
    assert run_id.startswith("test-session.") and len(run_id) == len("test-session.") + 16
    assert (
        f"agentrt --db {setup.database} approve {run_id} --approval {approval_id}" in setup.stderr()
    )
    assert f"agentrt --db {setup.database} reject {run_id} --approval {approval_id}" in (
        setup.stderr()
    )


async def test_a_rejection_is_told_with_the_note_and_no_new_approval_is_asked(
    setup: ProxySetup,
) -> None:
    arguments = {"to": "everyone@example.org", "body": "spam"}
    async with host(setup) as session:
        await session.call_tool("up_send_mail", arguments)
        setup.reject_latest("not to the whole company\x1b[31m")
        again = await session.call_tool("up_send_mail", arguments)
        once_more = await session.call_tool("up_send_mail", arguments)
    for result in (again, once_more):
        text = text_of(result)
        assert text.startswith("REJECTED: ")
        assert "not to the whole company\\x1b[31m" in text
        assert result.is_error is True
    assert len(setup.waiting_commands()) == 1
    assert setup.executions() == []


async def test_an_approval_nobody_decides_expires_and_the_call_never_runs(
    tmp_path: Path,
) -> None:
    setup = await build_setup(tmp_path, approval_ttl="1s", hold="200ms")
    arguments = {"to": "late@example.org", "body": "x"}
    async with host(setup) as session:
        first = await session.call_tool("up_send_mail", arguments)
        assert text_of(first).startswith("PENDING_APPROVAL: ")
        await anyio.sleep(1.3)
        second = await session.call_tool("up_send_mail", arguments)
        third = await session.call_tool("up_send_mail", arguments)
    assert text_of(second).startswith("EXPIRED: ")
    assert second.is_error is True
    assert text_of(third).startswith("EXPIRED: ")
    assert setup.executions() == []


async def test_an_approval_granted_while_the_call_is_held_runs_it_in_that_call(
    setup: ProxySetup,
) -> None:
    setup.rewrite(hold="10s")
    arguments = {"to": "held@example.org", "body": "x"}
    answers = []
    async with host(setup) as session:

        async def call() -> None:
            answers.append(await session.call_tool("up_send_mail", arguments))

        async with anyio.create_task_group() as group:
            group.start_soon(call)
            with anyio.fail_after(10):
                while not setup.waiting_commands():
                    await anyio.sleep(0.05)
            setup.approve_latest()
    assert text_of(answers[0]) == "sent to held@example.org"
    assert setup.executions() == ["send_mail held@example.org"]


async def test_a_held_call_sends_progress_when_the_host_asked_for_it(setup: ProxySetup) -> None:
    setup.rewrite(hold="2500ms")
    progress: list[float] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(value)

    async with host(setup) as session:
        result = await session.call_tool(
            "up_send_mail", {"to": "p@q.r", "body": "x"}, progress_callback=on_progress
        )
    assert text_of(result).startswith("PENDING_APPROVAL: ")
    assert len(progress) >= 2
    assert progress == sorted(progress)


async def test_a_server_error_is_an_error_result_with_its_text_escaped(setup: ProxySetup) -> None:
    async with host(setup) as session:
        result = await session.call_tool("up_fail", {})
    text = text_of(result)
    assert result.is_error is True
    assert "\x1b" not in text and "\u202e" not in text
    assert "\\x1b[2Jdisk full" in text


async def test_a_denied_class_is_denied_and_nothing_runs(tmp_path: Path) -> None:
    setup = await build_setup(tmp_path, policy={"read_only": "allow", "local_mutation": "deny"})
    async with host(setup) as session:
        result = await session.call_tool("up_write_note", {"note": "n"})
        mail = await session.call_tool("up_send_mail", {"to": "x@y.z", "body": "b"})
    assert text_of(result).startswith("DENIED: ")
    assert result.is_error is True
    # A class the file leaves out is denied, never given the default's answer.
    assert text_of(mail).startswith("DENIED: ")
    assert setup.executions() == []


async def test_arguments_outside_the_schema_are_invalid_and_nothing_runs(
    setup: ProxySetup,
) -> None:
    async with host(setup) as session:
        result = await session.call_tool("up_write_note", {"note": 5, "extra\u202e": "x"})
        missing = await session.call_tool("no_such_tool", {})
    assert text_of(result).startswith("INVALID: ")
    assert result.is_error is True
    assert text_of(missing).startswith("INVALID: ")
    assert setup.executions() == []


async def test_a_tampered_approval_never_runs_and_the_model_learns_no_run_id(
    setup: ProxySetup,
) -> None:
    from agentrt.store import open_store

    arguments = {"to": "boss@example.org", "body": "raise"}
    async with host(setup) as session:
        await session.call_tool("up_send_mail", arguments)
        run_id, approval_id = setup.waiting_commands()[-1]
        setup.approve_latest()
        # Someone with write access to the database swaps the approved request.
        with open_store(setup.database) as store, store.transaction() as connection:
            connection.execute(
                "UPDATE approvals SET args = ? WHERE approval_id = ?",
                ('{"body":"raise","to":"attacker@example.org"}', approval_id),
            )
        answer = await session.call_tool("up_send_mail", arguments)
    assert text_of(answer).startswith("UNAVAILABLE: ")
    assert run_id not in text_of(answer)
    assert setup.executions() == []
    assert "no longer matches its hash" in setup.stderr()


async def test_a_server_that_does_not_load_is_left_out_and_the_others_serve(
    tmp_path: Path,
) -> None:
    import sys

    setup = await build_setup(tmp_path)
    manifest = json.loads((setup.config_path.parent / "up.manifest.json").read_text())
    manifest["server"] = "broken"
    write_private(setup.config_path.parent / "broken.manifest.json", json.dumps(manifest))
    broken = {
        "name": "broken",
        "command": [sys.executable, "-c", "import sys; sys.stderr.write('boom\\x1b[2J'); exit(3)"],
        "manifest": "broken.manifest.json",
        "rules": {"echo": {"side_effect": "read_only"}},
    }
    setup.rewrite(servers=[*setup.document["servers"], broken])
    async with host(setup) as session:
        names = {tool.name for tool in (await session.list_tools()).tools}
        echo = await session.call_tool("up_echo", {"text": "fine"})
    assert "up_echo" in names and not any(name.startswith("broken_") for name in names)
    assert text_of(echo) == "fine"
    assert "server broken did not load" in setup.stderr()
    assert "boom" in setup.stderr() and "\x1b[2J" not in setup.stderr()
