"""The inbox's button that clears a host session's taint (docs/flows.md), over real HTTP."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from inbox_support import start_inbox
from test_flows_rules import _calls, _setup

from agentrt.store import open_store

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]


def _cleared(database: Path) -> list[dict[str, object]]:
    with open_store(database, read_only=True, create=False) as store:
        rows = store.query("SELECT payload FROM events WHERE type = 'taint_cleared'")
        assert store.verify_chain().ok and store.verify_state().ok
    return [json.loads(row[0]) for row in rows]


async def test_the_inbox_shows_the_host_session_and_its_button_clears_the_taint(
    tmp_path: Path,
) -> None:
    setup = await _setup(tmp_path)
    *_, held = await _calls(setup, "echo", "write_note", "send_mail")
    assert held.startswith("PENDING_APPROVAL")
    inbox = start_inbox(Path(setup.database))
    try:
        with inbox.authorized() as client:
            (shown,) = client.get("/api/approvals").json()["approvals"]
        session = shown["clear_taint"]
        assert session.startswith("stdio-") and shown["host_session"] == session
        assert session in shown["reason"]
        page = {"Authorization": f"Bearer {inbox.token}", "Origin": inbox.base.rstrip("/")}
        body = {"session": session, "by": "alice", "note": "reviewed"}
        with inbox.client(**page) as client:
            # Without the page's CSRF token nothing is cleared.
            refused = client.post("/api/taint/clear", json=body)
            assert refused.status_code == 403
            assert _cleared(Path(setup.database)) == []
            headers = {"X-CSRF-Token": inbox.session()["csrf"]}
            answer = client.post("/api/taint/clear", json=body, headers=headers)
            assert answer.status_code == 200, answer.text
            assert answer.json() == {"session": session, "labels": ["private", "untrusted"]}
            again = client.post("/api/taint/clear", json=body, headers=headers)
            assert again.status_code == 409 and "holds no taint" in again.json()["error"]
            wrong = client.post("/api/taint/clear", json={"session": 3}, headers=headers)
            assert wrong.status_code == 400
    finally:
        inbox.stop()
    (event,) = _cleared(Path(setup.database))
    assert event == {
        "session": session,
        "labels": ["private", "untrusted"],
        "by": "alice",
        "note": "reviewed",
    }
