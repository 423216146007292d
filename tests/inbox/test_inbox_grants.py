"""Standing grants from the inbox: the scope is fetched and shown with its hash, and the
decision gives the grant only against that hash; refusals change nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from inbox_support import Inbox, start_inbox
from proxy_helpers import build_setup, host, text_of

from agentrt import grants
from agentrt.store import ApprovalStatus, open_store

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]


def _post(inbox: Inbox, path: str, body: dict[str, Any]) -> httpx.Response:
    headers = {
        "Authorization": f"Bearer {inbox.token}",
        "Origin": inbox.base.rstrip("/"),
        "X-CSRF-Token": inbox.session()["csrf"],
    }
    with inbox.client(**headers) as client:
        return client.post(path, json=body)


def _shown(inbox: Inbox) -> dict[str, Any]:
    with inbox.authorized() as client:
        shown: dict[str, Any] = client.get("/api/approvals").json()["approvals"][0]
        return shown


async def test_the_inbox_shows_a_grants_scope_and_gives_it_only_against_that_hash(
    tmp_path: Path,
) -> None:
    setup = await build_setup(tmp_path, standing_grants={"max_for": "1h", "max_calls": 10})
    async with host(setup) as session:
        held = await session.call_tool("up_send_mail", {"to": "x@example.org", "body": "0"})
        assert text_of(held).startswith("PENDING_APPROVAL: ")
    assert isinstance(setup.database, Path)
    inbox = start_inbox(setup.database)
    try:
        shown = _shown(inbox)
        where = {"run_id": shown["decide"]["run_id"], "approval_id": shown["decide"]["approval_id"]}
        wider = _post(inbox, "/api/grant-scope", {**where, "for": "2h"})
        bad_condition = _post(inbox, "/api/grant-scope", {**where, "when": "args.to ==="})
        scope = _post(inbox, "/api/grant-scope", {**where, "calls": 3, "for": "30m"})
        decision = {
            "verdict": "approve", **where, "approval_hash": shown["approval_hash"],
            "by": "alice", "note": "",
        }  # fmt: skip
        other_scope = {"calls": 4, "for": "30m", "scope_hash": scope.json()["scope_hash"]}
        refused = _post(inbox, "/api/decide", {**decision, "grant": other_scope})
        with open_store(setup.database, create=False) as store:
            assert store.get_approval(where["approval_id"]).status is ApprovalStatus.PENDING
            assert grants.list_grants(store, include_ended=True) == []
        given = _post(
            inbox, "/api/decide",
            {**decision, "grant": {"calls": 3, "for": "30m",
                                   "scope_hash": scope.json()["scope_hash"]}},
        )  # fmt: skip
    finally:
        inbox.stop()
    assert wider.status_code == 409 and "wider than the operator's maximum" in wider.json()["error"]
    assert bad_condition.status_code == 409 and "does not compile" in bad_condition.json()["error"]
    assert scope.status_code == 200
    assert any("the next 3 call(s), for 30m" in line for line in scope.json()["lines"])
    assert refused.status_code == 409 and "not the scope that was shown" in refused.json()["error"]
    assert given.status_code == 200 and given.json()["status"] == "approved"
    with open_store(setup.database, create=False) as store:
        [grant] = grants.list_grants(store)
        assert (grant.calls_left, grant.given_by) == (3, "alice")
        assert store.verify_chain().ok
