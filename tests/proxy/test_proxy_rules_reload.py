"""Through `agentrt proxy`, with the official SDK's client as host: the operator's rules,
changed with `agentrt classify` while the proxy serves, are taken without a restart
(docs/proxy.md, "Live list changes"; decision 0047).

A tool newly classified becomes visible (the host is told its list changed) and its calls
are decided by its new class under the new policy identity; a rules file others may write
is refused in one line and the old rules still govern; `agentrt recheck` finds no decision,
before the swap or after, that the rules as they are now would change; the chain verifies.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from proxy_helpers import (
    AGENTRT,
    UPSTREAM,
    ProxySetup,
    build_setup,
    text_of,
    watching_host,
    write_private,
)

from agentrt.store import open_store

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120), pytest.mark.slow]


def _agentrt(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(AGENTRT), *arguments], capture_output=True, text=True, timeout=60,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


def _decided(setup: ProxySetup) -> list[tuple[str, str, str]]:
    """Each recorded decision: (tool, outcome, policy_id), oldest first; the chain verified."""
    found = []
    tools: dict[tuple[str, int], str] = {}
    with open_store(setup.database, create=False) as store:
        store.verify_chain()
        for event in store.events_after(0):
            payload = dict(event.payload)
            if "tool" in payload and "step" in payload:
                tools.setdefault((event.run_id, payload["step"]), payload["tool"])
            if event.type == "policy_decided":
                tool = tools[(event.run_id, payload["step"])]
                found.append((tool, payload["outcome"], payload["policy_id"]))
    return found


async def _until_in_stderr(setup: ProxySetup, text: str, count: int = 1) -> None:
    with anyio.fail_after(15):
        while setup.stderr().count(text) < count:
            await anyio.sleep(0.1)


async def test_a_tool_classified_while_the_proxy_runs_is_served_under_its_new_class(
    tmp_path: Path,
) -> None:
    setup = await build_setup(tmp_path)
    rules_path = write_private(
        setup.root / "conf" / "up.rules.json",
        json.dumps({"echo": {"side_effect": "read_only"}}),
    )
    [server] = setup.document["servers"]
    setup.rewrite(servers=[{**server, "rules": "up.rules.json"}])
    async with watching_host(setup) as host:
        assert "up_send_mail" not in await host.names()
        before = await host.session.call_tool("up_echo", {"text": "before"})
        unknown = await host.session.call_tool(
            "up_send_mail", {"to": "a@example.org", "body": "hi"}
        )

        classified = _agentrt(
            "classify", "--config", str(setup.config_path), "--set",
            "up.send_mail=remote-mutation",
        )  # fmt: skip
        assert classified.returncode == 0, classified.stderr
        await host.wait_changed()
        served = await host.names()
        held = await host.session.call_tool("up_send_mail", {"to": "b@example.org", "body": "hi"})
        after = await host.session.call_tool("up_echo", {"text": "after"})

        # The operator loosens send_mail in a file others may write: refused in one
        # line, the old rules still govern, and the host is not told anything changed.
        changed_before = host.changed
        rules_path.write_text(
            json.dumps(
                {
                    "echo": {"side_effect": "read_only"},
                    "send_mail": {"side_effect": "read_only"},
                    "write_note": {"side_effect": "local_mutation"},
                }
            )
        )
        rules_path.chmod(0o666)
        await _until_in_stderr(setup, "were not taken")
        still_held = await host.session.call_tool(
            "up_send_mail", {"to": "c@example.org", "body": "hi"}
        )
        unsafe_names = await host.names()
        # Put back as classify left it: taken again, the same rules and the same identity.
        rules_path.write_text(
            json.dumps(
                {
                    "echo": {"side_effect": "read_only"},
                    "send_mail": {"side_effect": "remote_mutation"},
                }
            )
        )
        rules_path.chmod(0o600)
        await _until_in_stderr(setup, "took the new rules of", 2)
        changed_after = host.changed

    assert unknown.is_error and "there is no tool with this name" in text_of(unknown)
    assert "up_send_mail" in served and "up_write_note" not in served
    assert text_of(before) == "before" and text_of(after) == "after"
    assert "approval" in text_of(held).lower(), text_of(held)
    assert "approval" in text_of(still_held).lower()
    assert "up_write_note" not in unsafe_names
    assert changed_after == changed_before
    assert setup.executions("send_mail") == []

    refused = [line for line in setup.stderr().splitlines() if "were not taken" in line]
    assert len(refused) == 1
    assert refused[0].startswith(f"agentrt proxy: the rules of {setup.config_path} changed, ")
    assert refused[0].endswith("; the proxy keeps the ones it had")
    assert "up.rules.json" in refused[0]

    decided = _decided(setup)
    assert [(tool, outcome) for tool, outcome, _ in decided] == [
        ("up_echo", "allow"),
        ("up_send_mail", "require_approval"),
        ("up_echo", "allow"),
        ("up_send_mail", "require_approval"),
    ]
    old_id, new_id = decided[0][2], decided[1][2]
    assert old_id != new_id
    assert [policy for _, _, policy in decided[1:]] == [new_id] * 3

    rechecked = _agentrt("recheck", "--config", str(setup.config_path), "--json")
    assert rechecked.returncode == 0, rechecked.stderr
    records = [json.loads(line) for line in rechecked.stdout.splitlines()]
    assert records[-1] == {
        "record": "recheck", "checked": 4, "skipped": 0, "differ": 0, "policy_id": new_id,
    }  # fmt: skip


async def test_a_class_changed_in_the_configuration_governs_and_a_broken_file_is_refused(
    tmp_path: Path,
) -> None:
    setup = await build_setup(tmp_path, rules={"echo": {"side_effect": "read_only"}})
    async with watching_host(setup) as host:
        before = await host.session.call_tool("up_echo", {"text": "read"})
        # classify writes rules kept in proxy.json into proxy.json itself.
        classified = _agentrt(
            "classify", "--config", str(setup.config_path), "--set",
            "up.echo=destructive", "--allow-hint-mismatch",
        )  # fmt: skip
        assert classified.returncode == 0, classified.stderr
        await _until_in_stderr(setup, "took the new rules of")
        denied = await host.session.call_tool("up_echo", {"text": "destroy"})
        # Broken: not JSON.  Refused in one line, and destructive still governs.
        setup.config_path.write_text("{")
        await _until_in_stderr(setup, "were not taken")
        still = await host.session.call_tool("up_echo", {"text": "still"})
        # A server added: its rules are not taken (servers change at the next start).
        document = json.loads(json.dumps(setup.document))
        document["servers"][0]["rules"] = {"echo": {"side_effect": "read_only"}}
        document["servers"].append({**document["servers"][0], "name": "more"})
        write_private(setup.config_path, json.dumps(document))
        await _until_in_stderr(setup, "servers are added or removed at the next start")
        after = await host.session.call_tool("up_echo", {"text": "after"})
        names = await host.names()

    assert text_of(before) == "read"
    for answer in (denied, still, after):
        assert answer.is_error and text_of(answer).startswith("DENIED"), text_of(answer)
    assert names == {"up_echo", "gate_status"}
    refused = [line for line in setup.stderr().splitlines() if "not taken" in line]
    assert len(refused) == 2 and "is not usable JSON" in refused[0]
    assert refused[1].endswith("; the proxy keeps the rules it had")
    assert [outcome for _, outcome, _ in _decided(setup)] == ["allow", "deny", "deny", "deny"]


async def test_a_tool_whose_rule_is_removed_is_withheld_until_classified_again(
    tmp_path: Path,
) -> None:
    rules = {"echo": {"side_effect": "read_only"}, "send_mail": {"side_effect": "read_only"}}
    setup = await build_setup(tmp_path, rules=rules)
    [server] = setup.document["servers"]
    async with watching_host(setup) as host:
        sent = await host.session.call_tool("up_send_mail", {"to": "a", "body": "first"})
        setup.rewrite(servers=[{**server, "rules": {"echo": rules["echo"]}}])
        await host.wait_changed()
        withheld = await host.names()
        refused = await host.session.call_tool("up_send_mail", {"to": "b", "body": "gone"})
        echo = await host.session.call_tool("up_echo", {"text": "still here"})
        classified = _agentrt(
            "classify", "--config", str(setup.config_path), "--set",
            "up.send_mail=remote-mutation",
        )  # fmt: skip
        assert classified.returncode == 0, classified.stderr
        await host.wait_changed()
        served = await host.names()
        held = await host.session.call_tool("up_send_mail", {"to": "c", "body": "held"})

    assert text_of(sent) == "sent to a"
    assert withheld == {"up_echo", "gate_status"}
    assert refused.is_error and text_of(refused).endswith(
        "was not called: since its rules changed, no rule classifies it any more; "
        "classify it to serve it again. Nothing ran."
    )
    assert text_of(echo) == "still here"
    assert "up_send_mail" in served
    assert "approval" in text_of(held).lower(), text_of(held)
    assert setup.executions("send_mail") == ["send_mail a"]
    # The withheld call is recorded and refused on its session, as a tool whose pin it no
    # longer matches is (decision 0037): nothing reached the server.
    assert [(tool, outcome) for tool, outcome, _ in _decided(setup)] == [
        ("up_send_mail", "allow"), ("up_send_mail", "allow"), ("up_echo", "allow"),
        ("up_send_mail", "require_approval"),
    ]  # fmt: skip


async def test_a_tool_renamed_by_a_changed_rule_is_served_only_under_its_new_name(
    tmp_path: Path,
) -> None:
    setup = await build_setup(tmp_path)
    [server] = setup.document["servers"]
    rules = server["rules"]
    async with watching_host(setup) as host:
        before = await host.names()
        renaming = {**rules, "echo": {**rules["echo"], "rename": "say"}}
        setup.rewrite(servers=[{**server, "rules": renaming}])
        await host.wait_changed()
        renamed = await host.names()
        old = await host.session.call_tool("up_echo", {"text": "old name"})
        unknown = await host.session.call_tool("no_such_tool", {"text": "never was"})
        new = await host.session.call_tool("say", {"text": "new name"})
        # The rule put back: the old name is served again and the new one retired.
        setup.rewrite(servers=[server])
        await host.wait_changed()
        restored = await host.names()
        gone = await host.session.call_tool("say", {"text": "gone again"})
        again = await host.session.call_tool("up_echo", {"text": "old name again"})

    assert "up_echo" in before and "say" not in before
    assert renamed == before - {"up_echo"} | {"say"}
    assert restored == before
    # The old name is answered exactly as a name that never was a tool.
    assert old.is_error and unknown.is_error and gone.is_error
    assert text_of(old).replace("up_echo", "NAME") == text_of(unknown).replace(
        "no_such_tool", "NAME"
    )
    assert text_of(gone).replace("say", "NAME") == text_of(unknown).replace("no_such_tool", "NAME")
    assert text_of(new) == "new name" and text_of(again) == "old name again"
    assert (
        "agentrt proxy: server up: its rules rename echo to say; up_echo is no longer served"
        in setup.stderr().splitlines()
    )
    # Only the calls to served names were recorded, each under its name then.
    assert [tool for tool, _, _ in _decided(setup)] == ["say", "up_echo"]


async def test_a_rule_changed_while_the_servers_load_is_taken_at_the_first_look(
    tmp_path: Path,
) -> None:
    setup = await build_setup(tmp_path, rules={"echo": {"side_effect": "read_only"}})
    # The server says it started (so the proxy has read its configuration), then takes 3 s to
    # answer: the rules are changed inside that window, before the proxy watches its files.
    started = tmp_path / "started"
    slow = (
        "import pathlib, runpy, sys, time; pathlib.Path(sys.argv[1]).touch(); time.sleep(3); "
        "sys.argv = sys.argv[2:]; runpy.run_path(sys.argv[0], run_name='__main__')"
    )
    [server] = setup.document["servers"]
    command = [sys.executable, "-c", slow, str(started), str(UPSTREAM)]
    setup.rewrite(servers=[{**server, "command": command}])

    async def change_while_loading() -> None:
        with anyio.fail_after(30):
            while not started.exists():
                await anyio.sleep(0.02)
        document = json.loads(setup.config_path.read_text())
        document["servers"][0]["rules"] = {"echo": {"side_effect": "destructive"}}
        write_private(setup.config_path, json.dumps(document))

    async with anyio.create_task_group() as group:
        group.start_soon(change_while_loading)
        async with watching_host(setup) as host:
            await _until_in_stderr(setup, "took the new rules of")
            answer = await host.session.call_tool("up_echo", {"text": "destroy"})

    assert answer.is_error and text_of(answer).startswith("DENIED"), text_of(answer)
    assert [outcome for _, outcome, _ in _decided(setup)] == ["deny"]
