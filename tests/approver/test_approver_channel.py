"""The signed approver channel over real HTTP (uvicorn, httpx2): what it answers and refuses.

Every refusal is checked to have changed nothing but the audit log's one
`approver_refused` event: the approval still waits, the chain and the state verify.
"""

from __future__ import annotations

import json
import socket
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2 as httpx
import pytest
from approver_support import SECRET, Waiting, waiting_run

from agentrt.approver import ChannelLimits, sign, signed_request
from agentrt.approver._serve import running_approver
from agentrt.inbox import Listener
from agentrt.store import ApprovalStatus, RunStatus, Store, open_store

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

BODY_MARKER = "a-note-that-must-never-reach-the-log"


@asynccontextmanager
async def channel(
    store: Store, limits: ChannelLimits | None = None
) -> AsyncIterator[tuple[str, httpx.AsyncClient]]:
    async with (
        running_approver(store, SECRET, Listener("127.0.0.1", 0), limits) as base,
        httpx.AsyncClient(timeout=10.0, trust_env=False) as client,
    ):
        yield base, client


def _decision(waiting: Waiting, **changes: str) -> dict[str, str]:
    body = {
        "run_id": waiting.run_id,
        "approval_id": waiting.approval_id,
        "hash": waiting.approval_hash,
        "by": "alice",
        "note": BODY_MARKER,
    }
    body.update(changes)
    return body


def _path(waiting: Waiting, verb: str = "") -> str:
    tail = f"/{verb}" if verb else ""
    return f"/runs/{waiting.run_id}/approvals/{waiting.approval_id}{tail}"


def _refusals(store: Store) -> list[dict[str, Any]]:
    return [
        event.payload
        for event in store.events_after(0, limit=10_000)
        if event.type == "approver_refused"
    ]


def _unchanged(store: Store, waiting: Waiting, events_before: int) -> None:
    """Nothing but `approver_refused` events was written since `events_before`."""
    assert store.get_approval(waiting.approval_id).status is ApprovalStatus.PENDING
    assert store.get_run(waiting.run_id).status is RunStatus.WAITING_FOR_APPROVAL
    later = store.events_after(events_before, limit=10_000)
    assert {event.type for event in later} <= {"approver_refused"}
    assert all(BODY_MARKER not in json.dumps(event.payload) for event in later)
    assert store.verify_chain().ok and store.verify_state().ok


async def test_a_signed_client_lists_shows_and_approves(database: str | Path) -> None:
    with open_store(database) as store:
        waiting = await waiting_run(store)
        other = await waiting_run(store)
        async with channel(store) as (base, client):
            url = f"{base}/runs/{waiting.run_id}/approvals"
            listed = await client.send(signed_request("GET", url, secret=SECRET))
            assert listed.status_code == 200
            approvals = listed.json()["approvals"]
            assert [item["approval_id"] for item in approvals] == [waiting.approval_id]
            assert approvals[0]["hash"] == waiting.approval_hash
            text = await client.send(
                signed_request(
                    "GET", base + _path(waiting), secret=SECRET, headers={"Accept": "text/plain"}
                )
            )
            assert text.status_code == 200 and text.headers["content-type"].startswith("text/plain")
            assert waiting.approval_hash in text.text
            approved = await client.send(
                signed_request(
                    "POST", base + _path(waiting, "approve"), secret=SECRET,
                    json=_decision(waiting, note="fine"),
                )
            )  # fmt: skip
            assert approved.status_code == 202, approved.text
            assert approved.json()["status"] == "approved"
            rejected = await client.send(
                signed_request(
                    "POST", base + _path(other, "reject"), secret=SECRET,
                    json=_decision(other, note="not that"),
                )
            )  # fmt: skip
            assert rejected.status_code == 200 and rejected.json()["status"] == "rejected"
        approval = store.get_approval(waiting.approval_id)
        assert (approval.status, approval.decided_by, approval.note) == (
            ApprovalStatus.APPROVED,
            "alice",
            "fine",
        )
        assert store.get_run(other.run_id).status is RunStatus.CANCELLED
        assert _refusals(store) == []
        assert store.verify_chain().ok and store.verify_state().ok


async def test_cancel_ends_the_run_and_a_second_cancel_is_refused(database: str | Path) -> None:
    with open_store(database) as store:
        waiting = await waiting_run(store)
        async with channel(store) as (base, client):
            url = f"{base}/runs/{waiting.run_id}/cancel"
            body = {"run_id": waiting.run_id, "by": "carol"}
            first = await client.send(signed_request("POST", url, secret=SECRET, json=body))
            assert first.status_code == 200 and first.json()["status"] == "cancelled"
            second = await client.send(signed_request("POST", url, secret=SECRET, json=body))
            assert second.status_code == 409 and second.json()["code"] == "run_finished"
        assert store.get_run(waiting.run_id).status is RunStatus.CANCELLED


async def test_unsigned_badly_signed_and_stale_requests_are_refused_and_change_nothing(
    database: str | Path,
) -> None:
    with open_store(database) as store:
        waiting = await waiting_run(store)
        before = store.head_seq()
        async with channel(store) as (base, client):
            url = base + _path(waiting, "approve")
            body = _decision(waiting)
            unsigned = await client.post(url, json=body)
            assert unsigned.status_code == 401
            assert unsigned.json()["code"] == "bad_signature"
            forged = await client.send(signed_request("POST", url, secret=b"x" * 40, json=body))
            assert (forged.status_code, forged.json()["code"]) == (401, "bad_signature")
            stale = await client.send(
                signed_request("POST", url, secret=SECRET, json=body, now=time.time() - 301)
            )
            assert (stale.status_code, stale.json()["code"]) == (401, "stale_timestamp")
            future = await client.send(
                signed_request("POST", url, secret=SECRET, json=body, now=time.time() + 301)
            )
            assert (future.status_code, future.json()["code"]) == (401, "stale_timestamp")
            # Signed for another path (the reject of the same approval): refused.
            moved = signed_request("POST", base + _path(waiting, "reject"), secret=SECRET,
                                   json=body)  # fmt: skip
            moved.url = httpx.URL(url)
            replayed_elsewhere = await client.send(moved)
            assert replayed_elsewhere.status_code == 401
            long_nonce = signed_request("POST", url, secret=SECRET, json=body)
            nonce = "n" * 65
            stamp = long_nonce.headers["X-Approval-Timestamp"]
            long_nonce.headers["X-Approval-Nonce"] = nonce
            long_nonce.headers["X-Approval-Signature"] = sign(
                SECRET, stamp, nonce, "POST", _path(waiting, "approve"), long_nonce.content
            )
            assert (await client.send(long_nonce)).status_code == 401
        _unchanged(store, waiting, before)
        refusals = _refusals(store)
        assert [refusal["status"] for refusal in refusals] == [401] * 6
        assert all(refusal["verified"] is False for refusal in refusals)
        assert refusals[0]["path"] == _path(waiting, "approve")
        assert {event.run_id for event in store.events_after(before)} == {""}


async def test_a_replayed_request_is_refused(database: str | Path) -> None:
    with open_store(database) as store:
        waiting = await waiting_run(store)
        async with channel(store) as (base, client):
            listing = signed_request(
                "GET", f"{base}/runs/{waiting.run_id}/approvals", secret=SECRET
            )
            assert (await client.send(listing)).status_code == 200
            again = await client.send(listing)
            assert (again.status_code, again.json()["code"]) == (401, "replayed")
            reject = signed_request(
                "POST", base + _path(waiting, "reject"), secret=SECRET, json=_decision(waiting)
            )
            before = store.head_seq()
            stored = reject.content
            # The decision signed once and sent twice: the copy is a replay, refused.
            first = await client.send(reject)
            assert first.status_code == 200
            copy = httpx.Request("POST", reject.url, content=stored, headers=reject.headers)
            second = await client.send(copy)
            assert (second.status_code, second.json()["code"]) == (401, "replayed")
            assert [event.type for event in store.events_after(before)].count(
                "approval_rejected"
            ) == 1


async def test_an_oversized_body_is_refused_before_it_is_read(database: str | Path) -> None:
    with open_store(database) as store:
        waiting = await waiting_run(store)
        before = store.head_seq()
        async with channel(store) as (base, client):
            url = base + _path(waiting, "approve")
            big = _decision(waiting, note="x" * 17_000)
            declared = await client.send(signed_request("POST", url, secret=SECRET, json=big))
            assert (declared.status_code, declared.json()["code"]) == (413, "too_large")
            # Without a Content-Length (chunked): refused once the bound is passed.
            request = signed_request("POST", url, secret=SECRET, json=big)

            async def chunks() -> AsyncIterator[bytes]:
                for start in range(0, len(request.content), 4096):
                    yield request.content[start : start + 4096]

            streamed = await client.send(
                httpx.Request(
                    "POST",
                    url,
                    content=chunks(),
                    headers={
                        name: value
                        for name, value in request.headers.items()
                        if name.lower() != "content-length"
                    },
                )
            )
            assert (streamed.status_code, streamed.json()["code"]) == (413, "too_large")
        _unchanged(store, waiting, before)
        assert [refusal["status"] for refusal in _refusals(store)] == [413, 413]


def _raw_request_answer(base: str, head: bytes, timeout: float) -> bytes:
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(head)
        return sock.recv(4096)


async def test_a_burst_over_the_rate_is_refused_before_the_body_is_read(
    database: str | Path,
) -> None:
    with open_store(database) as store:
        waiting = await waiting_run(store)
        before = store.head_seq()
        limits = ChannelLimits(rate=0.1, burst=5)
        async with channel(store, limits) as (base, client):
            url = f"{base}/runs/{waiting.run_id}/approvals"
            answers = [
                (await client.send(signed_request("GET", url, secret=SECRET))).status_code
                for _ in range(8)
            ]
            assert answers[:5] == [200] * 5 and answers[5:] == [429] * 3
            # A request that declares a body and never sends it is answered at once:
            # the limit is applied before a byte of the body is awaited.
            head = (
                f"POST {_path(waiting, 'approve')} HTTP/1.1\r\nHost: x\r\n"
                "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
            ).encode()
            started = time.monotonic()
            answer = await anyio.to_thread.run_sync(_raw_request_answer, base, head, 5.0)
            assert answer.startswith(b"HTTP/1.1 429"), answer[:80]
            assert time.monotonic() - started < 2.0
        _unchanged(store, waiting, before)
        # Refusals by the rate limit are recorded at most once a second, counted.
        refused = [refusal for refusal in _refusals(store) if refusal["status"] == 429]
        assert 1 <= len(refused) <= 2


async def test_decisions_that_name_another_run_or_hash_or_a_decided_approval_are_refused(
    database: str | Path,
) -> None:
    with open_store(database) as store:
        waiting = await waiting_run(store)
        other = await waiting_run(store)
        decided = await waiting_run(store)
        before = store.head_seq()
        async with channel(store) as (base, client):

            async def post(path: str, body: dict[str, str]) -> httpx.Response:
                return await client.send(
                    signed_request("POST", base + path, secret=SECRET, json=body)
                )

            named_other = await post(
                _path(waiting, "approve"), _decision(waiting, run_id=other.run_id)
            )
            assert (named_other.status_code, named_other.json()["code"]) == (400, "bad_request")
            other_under_this = await post(
                f"/runs/{waiting.run_id}/approvals/{other.approval_id}/approve",
                _decision(other, run_id=waiting.run_id),
            )
            assert (other_under_this.status_code, other_under_this.json()["code"]) == (
                404,
                "not_found",
            )
            wrong_hash = await post(_path(waiting, "approve"), _decision(waiting, hash="0" * 64))
            assert (wrong_hash.status_code, wrong_hash.json()["code"]) == (409, "approval_hash")
            extra = await post(_path(waiting, "approve"), {**_decision(waiting), "grant": "1h"})
            assert extra.status_code == 400
            not_json = await client.send(
                signed_request("POST", base + _path(waiting, "approve"), secret=SECRET,
                               content=b"{not json")
            )  # fmt: skip
            assert not_json.status_code == 400
            nowhere = await client.send(
                signed_request("GET", f"{base}/runs/{waiting.run_id}/elsewhere", secret=SECRET)
            )
            assert (nowhere.status_code, nowhere.json()["code"]) == (404, "not_found")
            wrong_method = await client.send(
                signed_request("DELETE", base + _path(waiting), secret=SECRET)
            )
            assert (wrong_method.status_code, wrong_method.json()["code"]) == (
                405,
                "method_not_allowed",
            )
            _unchanged(store, waiting, before)
            _unchanged(store, other, before)
            first = await post(_path(decided, "approve"), _decision(decided))
            assert first.status_code == 202
            twice = await post(_path(decided, "reject"), _decision(decided))
            assert (twice.status_code, twice.json()["code"]) == (409, "not_pending")
        assert store.get_approval(decided.approval_id).status is ApprovalStatus.APPROVED
        codes = [(refusal["status"], refusal["code"]) for refusal in _refusals(store)]
        assert codes == [
            (400, "bad_request"),
            (404, "not_found"),
            (409, "approval_hash"),
            (400, "bad_request"),
            (400, "bad_request"),
            (404, "not_found"),
            (405, "method_not_allowed"),
            (409, "not_pending"),
        ]
        assert store.verify_chain().ok and store.verify_state().ok


async def test_a_decision_on_an_expired_approval_is_gone(database: str | Path) -> None:
    with open_store(database) as store:
        waiting = await waiting_run(store, approval_ttl=0.5)
        await anyio.sleep(0.8)
        async with channel(store) as (base, client):
            answer = await client.send(
                signed_request(
                    "POST", base + _path(waiting, "approve"), secret=SECRET,
                    json=_decision(waiting),
                )
            )  # fmt: skip
            assert (answer.status_code, answer.json()["code"]) == (410, "expired")
        assert store.get_approval(waiting.approval_id).status is ApprovalStatus.EXPIRED
        assert store.verify_chain().ok and store.verify_state().ok


async def test_the_example_client_polls_shows_the_text_and_decides(tmp_path: Path) -> None:
    from approver_support import secret_file

    example = Path(__file__).resolve().parents[2] / "examples" / "approver_client.py"
    with open_store(tmp_path / "runs.db") as store:
        waiting = await waiting_run(store, content="\u202eevil")
        async with channel(store) as (base, _client):
            finished = await anyio.run_process(
                [sys.executable, str(example), base, waiting.run_id, "--secret-file",
                 str(secret_file(tmp_path)), "--decide", "approve", "--once", "--interval",
                 "0.2", "--by", "bot"],
                check=False,
            )  # fmt: skip
        output = finished.stdout.decode()
        assert finished.returncode == 0, finished.stderr.decode()
        assert "A call waits for approval: write" in output and "\u202e" not in output
        assert "approve: 202" in output
        approval = store.get_approval(waiting.approval_id)
        assert (approval.status, approval.decided_by) == (ApprovalStatus.APPROVED, "bot")
