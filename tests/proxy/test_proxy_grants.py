"""Standing grants through the proxy: given with an approval, spent by the calls they cover,
ended by their count, their time or a person; refused, with nothing changed, when wider
than the operator's maximum, on a destructive tool, or with a condition that does not compile."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from proxy_helpers import AGENTRT, RULES, ProxySetup, build_setup, host, text_of

from agentrt import approvals, grants
from agentrt.grants import GrantRefused, GrantRequest
from agentrt.store import GrantStatus, open_store

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

_LIMITS: dict[str, Any] = {"max_for": "1h", "max_calls": 10}


def _agentrt(setup: ProxySetup, *words: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(AGENTRT), "--db", str(setup.database), *words], capture_output=True, text=True,
        timeout=60, env=setup.environment(), cwd=setup.root,
    )  # fmt: skip


def _approve(setup: ProxySetup, *grant: str) -> subprocess.CompletedProcess[str]:
    run_id, approval_id = setup.waiting_commands()[-1]
    return _agentrt(setup, "approve", run_id, "--approval", approval_id, "--yes", *grant)


def _events(setup: ProxySetup, kind: str) -> list[dict[str, Any]]:
    with open_store(setup.database, create=False) as store:
        return [
            {"run_id": event.run_id, **event.payload}
            for event in store.events_after(0, 10_000)
            if event.type == kind
        ]


def _state(setup: ProxySetup) -> tuple[int, list[str], list[Any]]:
    """What a refusal must leave as it was: the events, the approvals' statuses, the grants."""
    with open_store(setup.database, create=False) as store:
        events = len(store.events_after(0, 10_000))
        statuses = [str(store.latest_approval(run.run_id)) for run in store.list_runs()]
        given = grants.list_grants(store, include_ended=True)
        assert store.verify_chain().ok
    return events, statuses, given


def _pending(answer: Any) -> bool:
    return text_of(answer).startswith("PENDING_APPROVAL: ")


async def test_a_grant_lets_the_next_calls_through_up_to_its_count_each_recorded_with_its_id(
    tmp_path: Path, on_backend: dict[str, Any]
) -> None:
    setup = await build_setup(tmp_path, standing_grants=_LIMITS, **on_backend)
    async with host(setup) as session:
        mail = {"to": "ops@example.org", "body": "first"}
        assert _pending(await session.call_tool("up_send_mail", mail))
        approved = _approve(setup, "--grant-calls", "2")
        assert approved.returncode == 0, approved.stderr
        assert "grant scope hash: " in approved.stdout
        [grant_id] = re.findall(r"standing grant (g[0-9a-f]{15}) covers", approved.stdout)
        # The approved call runs under its approval and spends nothing of the grant.
        assert (await session.call_tool("up_send_mail", mail)).is_error is False
        second = await session.call_tool("up_send_mail", {"to": "a@example.org", "body": "2"})
        third = await session.call_tool("up_send_mail", {"to": "b@example.org", "body": "3"})
        fourth = await session.call_tool("up_send_mail", {"to": "c@example.org", "body": "4"})
    assert second.is_error is False and third.is_error is False
    assert _pending(fourth)
    assert setup.executions("send_mail") == [
        "send_mail ops@example.org", "send_mail a@example.org", "send_mail b@example.org",
    ]  # fmt: skip
    used = _events(setup, "standing_grant_used")
    assert [(event["grant_id"], event["calls_left"]) for event in used] == [
        (grant_id, 1), (grant_id, 0),
    ]  # fmt: skip
    decided = [e for e in _events(setup, "policy_decided") if e["outcome"] == "allow"]
    assert [e["reason"] for e in decided] == [f"standing grant {grant_id} covers it"] * 2
    [given] = _events(setup, "standing_grant_given")
    assert given["grant_id"] == grant_id and given["scope"]["calls"] == 2
    listed = _agentrt(setup, "--json", "grants", "--all")
    [record] = [json.loads(line) for line in listed.stdout.splitlines()]
    assert record["status"] == "used_up" and record["calls_left"] == 0
    assert _agentrt(setup, "verify").returncode == 0


async def test_revoke_ends_a_grant_at_once_and_the_next_call_asks_again(tmp_path: Path) -> None:
    setup = await build_setup(tmp_path, standing_grants=_LIMITS)
    async with host(setup) as session:
        assert _pending(await session.call_tool("up_send_mail", {"to": "x@a.b", "body": "0"}))
        approved = _approve(setup, "--grant-for", "30m")
        assert approved.returncode == 0, approved.stderr
        with open_store(setup.database, create=False) as store:
            [grant] = grants.list_grants(store)
        assert grant.calls_left == 10  # the operator's maximum count, none named
        covered = await session.call_tool("up_send_mail", {"to": "y@a.b", "body": "1"})
        revoked = _agentrt(setup, "revoke", grant.grant_id)
        after = await session.call_tool("up_send_mail", {"to": "z@a.b", "body": "2"})
        again = _agentrt(setup, "revoke", grant.grant_id)
    assert covered.is_error is False
    assert revoked.returncode == 0, revoked.stderr
    assert _pending(after)
    assert again.returncode == 1 and "already ended (revoked)" in again.stderr
    assert [e["grant_id"] for e in _events(setup, "standing_grant_revoked")] == [grant.grant_id]
    assert "revoked" in _agentrt(setup, "grants", "--all").stdout


async def test_an_expired_grant_is_recorded_as_expired_and_the_call_asks_again(
    tmp_path: Path,
) -> None:
    setup = await build_setup(tmp_path, standing_grants=_LIMITS)
    async with host(setup) as session:
        assert _pending(await session.call_tool("up_send_mail", {"to": "x@a.b", "body": "0"}))
        assert _approve(setup, "--grant-for", "1s").returncode == 0
        time.sleep(1.2)
        late = await session.call_tool("up_send_mail", {"to": "y@a.b", "body": "1"})
    assert _pending(late)
    assert len(_events(setup, "standing_grant_expired")) == 1
    assert _events(setup, "standing_grant_used") == []
    assert setup.executions("send_mail") == []


async def test_a_grant_with_a_condition_covers_only_the_calls_it_accepts(tmp_path: Path) -> None:
    setup = await build_setup(tmp_path, standing_grants=_LIMITS)
    async with host(setup) as session:
        assert _pending(await session.call_tool("up_send_mail", {"to": "x@a.b", "body": "0"}))
        condition = 'args.to.endsWith("@example.org")'
        approved = _approve(setup, "--grant-calls", "5", "--grant-when", condition)
        assert approved.returncode == 0, approved.stderr
        inside = await session.call_tool("up_send_mail", {"to": "ok@example.org", "body": "1"})
        outside = await session.call_tool("up_send_mail", {"to": "evil@elsewhere", "body": "2"})
        no_field = await session.call_tool("up_send_mail", {"to": 7, "body": "3"})
    assert inside.is_error is False
    assert _pending(outside)
    assert no_field.is_error is True or _pending(no_field)
    assert setup.executions("send_mail") == ["send_mail ok@example.org"]


async def test_grants_are_refused_with_nothing_changed_and_the_approval_still_decidable(
    tmp_path: Path, on_backend: dict[str, Any]
) -> None:
    rules = {**RULES, "write_note": {"side_effect": "destructive", "outcome": "require_approval"}}
    setup = await build_setup(tmp_path, rules=rules, standing_grants=_LIMITS, **on_backend)
    async with host(setup) as session:
        assert _pending(await session.call_tool("up_write_note", {"note": "n"}))
        destructive = _approve(setup, "--grant-calls", "1")
        assert _pending(await session.call_tool("up_send_mail", {"to": "x@a.b", "body": "0"}))
        before = _state(setup)
        refusals = {
            "longer": _approve(setup, "--grant-for", "2h"),
            "more calls": _approve(setup, "--grant-calls", "11"),
            "condition": _approve(setup, "--grant-when", "args.to ==="),
        }
        after = _state(setup)
        # Still decidable: the approval and the store are as they were.
        plain = _approve(setup)
    assert destructive.returncode == 1
    assert "destructive tool" in destructive.stderr
    assert "wider than the operator's maximum of 1h" in refusals["longer"].stderr
    assert "wider than the operator's maximum of 10 calls" in refusals["more calls"].stderr
    assert "does not compile" in refusals["condition"].stderr
    assert all(result.returncode == 1 for result in refusals.values())
    assert before == after
    assert plain.returncode == 0, plain.stderr
    assert _events(setup, "standing_grant_given") == []


async def test_a_grant_is_refused_without_an_operators_maximum_and_against_another_scope(
    tmp_path: Path,
) -> None:
    setup = await build_setup(tmp_path)
    async with host(setup) as session:
        assert _pending(await session.call_tool("up_send_mail", {"to": "x@a.b", "body": "0"}))
    refused = _approve(setup, "--grant-calls", "1")
    assert refused.returncode == 1
    assert 'has no "standing_grants" maximum' in refused.stderr
    setup.rewrite(standing_grants=_LIMITS)
    async with host(setup):
        pass  # the proxy records the operator's maximum at start-up
    run_id, approval_id = setup.waiting_commands()[-1]
    with open_store(setup.database, create=False) as store:
        approval = store.get_approval(approval_id)
        scope = grants.grant_scope(store, approval, GrantRequest(calls=3))
        wider = GrantRequest(calls=4, scope_hash=scope.scope_hash)
        with pytest.raises(GrantRefused, match="not the scope that was shown"):
            approvals.approve(
                store, run_id, approval_hash=approval.approval_hash, approval_id=approval_id,
                grant=wider,
            )  # fmt: skip
        assert store.get_approval(approval_id).status == "pending"
        for kind in ("unknown_outcome", "interrupted_side_effect"):
            with pytest.raises(GrantRefused, match="never covers"):
                grants.grant_scope(store, dataclasses.replace(approval, kind=kind), wider)
        approvals.approve(
            store, run_id, approval_hash=approval.approval_hash, approval_id=approval_id,
            grant=dataclasses.replace(wider, calls=3),
        )  # fmt: skip
        [given] = grants.list_grants(store)
        assert given.status is GrantStatus.ACTIVE and given.calls_left == 3
        assert store.verify_chain().ok
