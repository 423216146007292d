"""`agentrt inbox` as a real process, spoken to over real HTTP: who it answers, and how."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import ssl
import stat
import subprocess
from pathlib import Path

import pytest
from cli_support import Produced
from inbox_support import AGENTRT, Inbox, start_inbox

from agentrt.inbox import CSP
from agentrt.store import ApprovalStatus, RunStatus, open_store

pytestmark = pytest.mark.timeout(90)


def _state(produced: Produced) -> tuple[str, str, int]:
    with open_store(produced.database, read_only=True, create=False) as store:
        approval = store.get_approval(produced.approval_id)
        run = store.get_run(produced.waiting_run)
        return str(approval.status), str(run.status), store.count_events(produced.waiting_run)


def _decision(inbox: Inbox, produced: Produced, verdict: str = "approve") -> dict[str, str]:
    with inbox.authorized() as client:
        shown = client.get("/api/approvals").json()["approvals"][0]
    return {
        "verdict": verdict,
        "run_id": shown["decide"]["run_id"],
        "approval_id": shown["decide"]["approval_id"],
        "approval_hash": shown["approval_hash"],
        "by": "alice",
        "note": "looks right",
    }


def _page_headers(inbox: Inbox, **extra: str) -> dict[str, str]:
    return {
        "Authorization": f"Bearer {inbox.token}",
        "Origin": inbox.base.rstrip("/"),
        "X-CSRF-Token": inbox.session()["csrf"],
        **extra,
    }


def test_first_line_is_the_address_with_a_fresh_token_each_start(produced: Produced) -> None:
    first = start_inbox(produced.database)
    second = start_inbox(produced.database)
    try:
        for running in (first, second):
            host, _, rest = running.first_line.removeprefix("inbox: http://").partition("/")
            assert host.startswith("127.0.0.1:") and int(host.split(":")[1]) > 0
            assert rest.startswith("#token=") and len(running.token) >= 40
        assert first.token != second.token
        assert first.token not in first.stderr_path.read_text()
    finally:
        first.stop()
        second.stop()


def test_a_request_without_the_token_is_refused_401(inbox: Inbox) -> None:
    with inbox.client() as client:
        for path in ("/", "/api/session", "/api/approvals", "/api/runs", "/api/verify"):
            assert client.get(path).status_code == 401, path
        assert client.get("/api/stream").status_code == 401
    with inbox.client(Authorization="Bearer " + "x" * len(inbox.token)) as client:
        assert client.get("/api/approvals").status_code == 401
    with inbox.client(Authorization=inbox.token) as client:
        assert client.get("/api/approvals").status_code == 401
    # The token in a query string is not a token: it would land in logs and history.
    with inbox.client() as client:
        assert client.get(f"/api/approvals?token={inbox.token}").status_code == 401


def test_the_shell_page_holds_no_data_and_every_answer_carries_the_csp(
    inbox: Inbox, produced: Produced
) -> None:
    with inbox.client() as client:
        shell = client.get("/")
        script = client.get("/static/inbox.js")
    assert shell.status_code == 401 and "<title>agentrt inbox</title>" in shell.text
    assert produced.approval_id not in shell.text and "write_note" not in shell.text
    assert script.status_code == 200
    for sink in (".innerHTML", ".outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in script.text, sink
    with inbox.authorized() as client:
        data = client.get("/api/approvals")
    for answer in (shell, script, data):
        assert answer.headers["content-security-policy"] == CSP
        assert answer.headers["x-content-type-options"] == "nosniff"
        assert answer.headers["cache-control"] == "no-store"


def test_a_foreign_host_is_refused_before_the_token_is_looked_at(inbox: Inbox) -> None:
    with inbox.authorized() as client:
        answer = client.get("/api/approvals", headers={"Host": "attacker.example:80"})
    assert answer.status_code == 403
    assert "Host" in answer.json()["error"]


def test_a_post_without_the_csrf_token_is_refused_and_changes_nothing(
    inbox: Inbox, produced: Produced
) -> None:
    before = _state(produced)
    body = _decision(inbox, produced)
    headers = _page_headers(inbox)
    del headers["X-CSRF-Token"]
    answer = inbox.post_decision(body, **headers)
    assert answer.status_code == 403 and "CSRF" in answer.json()["error"]
    wrong = inbox.post_decision(body, **{**headers, "X-CSRF-Token": "not-the-token"})
    assert wrong.status_code == 403
    assert _state(produced) == before


def test_a_post_without_the_token_is_refused_and_changes_nothing(
    inbox: Inbox, produced: Produced
) -> None:
    before = _state(produced)
    headers = _page_headers(inbox)
    del headers["Authorization"]
    answer = inbox.post_decision(_decision(inbox, produced), **headers)
    assert answer.status_code == 401
    assert _state(produced) == before


def test_a_post_with_a_foreign_origin_is_refused_and_changes_nothing(
    inbox: Inbox, produced: Produced
) -> None:
    before = _state(produced)
    body = _decision(inbox, produced)
    for origin in ("http://attacker.example", "null", ""):
        headers = _page_headers(inbox, Origin=origin)
        if not origin:
            del headers["Origin"]
        answer = inbox.post_decision(body, **headers)
        assert answer.status_code == 403, origin
    assert _state(produced) == before


def test_a_decision_as_a_form_post_is_refused(inbox: Inbox, produced: Produced) -> None:
    before = _state(produced)
    with inbox.client(**_page_headers(inbox)) as client:
        answer = client.post("/api/decide", data=_decision(inbox, produced))
    assert answer.status_code == 415
    assert _state(produced) == before


def test_approve_through_the_api_grants_against_the_shown_hash(
    inbox: Inbox, produced: Produced
) -> None:
    body = _decision(inbox, produced)
    answer = inbox.post_decision(body, **_page_headers(inbox))
    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] == "approved"
    with open_store(produced.database, read_only=True, create=False) as store:
        approval = store.get_approval(produced.approval_id)
        granted = store.list_events(produced.waiting_run)[-1]
    assert (approval.status, approval.decided_by, approval.note) == (
        ApprovalStatus.APPROVED, "alice", "looks right",
    )  # fmt: skip
    assert granted.type == "approval_granted"
    assert granted.payload["approval_hash"] == body["approval_hash"] == produced.approval_hash


def test_an_approval_changed_since_it_was_shown_is_refused_as_the_command_refuses_it(
    inbox: Inbox, produced: Produced
) -> None:
    body = _decision(inbox, produced)
    with sqlite3.connect(produced.database) as connection:
        connection.execute(
            "UPDATE approvals SET args = ? WHERE approval_id = ?",
            ('{"path": "../../.bashrc", "content": "evil"}', produced.approval_id),
        )
    answer = inbox.post_decision(body, **_page_headers(inbox))
    assert answer.status_code == 409
    assert "no longer matches its hash" in answer.json()["error"]
    assert _state(produced)[0] == "pending"


def test_a_stale_hash_is_refused_with_the_commands_message(
    inbox: Inbox, produced: Produced
) -> None:
    body = {**_decision(inbox, produced), "approval_hash": "0" * 64}
    answer = inbox.post_decision(body, **_page_headers(inbox))
    assert answer.status_code == 409
    assert "is not the request that was shown (the hash differs)" in answer.json()["error"]
    assert _state(produced)[0] == "pending"


def test_a_decision_with_a_repeated_key_is_refused_and_the_approval_stays_pending(
    inbox: Inbox, produced: Produced
) -> None:
    before = _state(produced)
    fields = _decision(inbox, produced)
    del fields["verdict"]
    # A reader keeping the first key sees a rejection, one keeping the last an approval.
    body = '{"verdict": "reject", ' + json.dumps(fields)[1:-1] + ', "verdict": "approve"}'
    with inbox.client(**_page_headers(inbox)) as client:
        answer = client.post(
            "/api/decide", content=body, headers={"Content-Type": "application/json"}
        )
    assert answer.status_code == 400
    assert answer.json()["error"] == (
        'the decision is refused: the key "verdict" is repeated in one object'
    )
    assert _state(produced) == before
    assert before[0] == "pending"


def test_reject_through_the_api_cancels_the_run_with_the_note(
    inbox: Inbox, produced: Produced
) -> None:
    body = {**_decision(inbox, produced, "reject"), "note": "not today"}
    answer = inbox.post_decision(body, **_page_headers(inbox))
    assert answer.status_code == 200, answer.text
    with open_store(produced.database, read_only=True, create=False) as store:
        run = store.get_run(produced.waiting_run)
        approval = store.get_approval(produced.approval_id)
    assert (run.status, run.reason) == (RunStatus.CANCELLED, "approval_rejected")
    assert approval.note == "not today"


def test_runs_a_run_and_the_chain_are_served(inbox: Inbox, produced: Produced) -> None:
    with inbox.authorized() as client:
        runs = client.get("/api/runs").json()
        detail = client.get(f"/api/runs/{produced.waiting_run}").json()
        chain = client.get("/api/verify").json()
        missing = client.get("/api/runs/no-such-run")
    assert runs["total"] == 3
    assert runs["runs"][0]["run_id"] == produced.waiting_run  # waiting first
    assert runs["runs"][0]["approval"] == produced.approval_id
    assert [step["tool"] for step in detail["steps"]] == ["read_note", "write_note"]
    assert detail["events"][0]["type"] == "run_started"
    assert detail["approval"]["approval_id"] == produced.approval_id
    assert chain["ok"] is True and chain["head_seq"] > 0 and len(chain["head_hash"]) == 64
    assert missing.status_code == 404


def test_the_stream_reports_a_change_when_a_decision_lands(
    inbox: Inbox, produced: Produced
) -> None:
    with inbox.authorized() as client, client.stream("GET", "/api/stream") as stream:
        assert stream.headers["content-type"].startswith("text/event-stream")
        lines = stream.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        assert '"pending": 1' in first
        with open_store(produced.database, create=False) as store:
            from agentrt.approvals import approve

            approve(store, produced.waiting_run, approval_hash=produced.approval_hash)
        second = next(line for line in lines if line.startswith("data: "))
        assert '"pending": 0' in second


def test_a_remote_listener_without_allow_remote_is_refused(produced: Produced) -> None:
    refused = subprocess.run(
        [str(AGENTRT), "--db", str(produced.database), "inbox", "--listen", "0.0.0.0:0"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert refused.returncode == 2
    assert refused.stdout == ""
    assert "is not a loopback address" in refused.stderr and "--allow-remote" in refused.stderr


def test_a_remote_listener_without_tls_is_refused(produced: Produced) -> None:
    refused = subprocess.run(
        [str(AGENTRT), "--db", str(produced.database), "inbox", "--listen", "0.0.0.0:0",
         "--allow-remote"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert refused.returncode == 2
    assert refused.stdout == ""
    assert "needs --tls-cert and --tls-key" in refused.stderr


def test_token_file_keeps_one_token_owner_only(produced: Produced, tmp_path: Path) -> None:
    token_file = tmp_path / "inbox.token"
    first = start_inbox(produced.database, "--token-file", str(token_file))
    first.stop()
    assert stat.S_IMODE(os.stat(token_file).st_mode) == 0o600
    second = start_inbox(produced.database, "--token-file", str(token_file))
    try:
        assert first.token == second.token == token_file.read_text().strip()
        assert second.session()["csrf"]
    finally:
        second.stop()


def test_a_token_file_others_can_read_is_refused(produced: Produced, tmp_path: Path) -> None:
    token_file = tmp_path / "inbox.token"
    token_file.write_text("a" * 43 + "\n")
    token_file.chmod(0o644)
    refused = subprocess.run(
        [str(AGENTRT), "--db", str(produced.database), "inbox", "--token-file", str(token_file)],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert refused.returncode == 2
    assert "can be read or written by others" in refused.stderr
    assert refused.stdout == ""


def test_a_port_in_use_is_one_clear_sentence(produced: Produced) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        refused = subprocess.run(
            [str(AGENTRT), "--db", str(produced.database), "inbox", "--listen",
             f"127.0.0.1:{port}"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
    assert refused.returncode == 1
    assert refused.stderr.startswith(f"agentrt: cannot listen on 127.0.0.1:{port}")
    assert refused.stderr.count("\n") == 1


def test_a_remote_listener_with_allow_remote_and_tls_serves_https_only(
    produced: Produced, tmp_path: Path
) -> None:
    import httpx2

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    process = subprocess.Popen(
        [str(AGENTRT), "--db", str(produced.database), "inbox", "--listen", "0.0.0.0:0",
         "--allow-remote", "--tls-cert", str(cert), "--tls-key", str(key)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        first = process.stdout.readline().strip()
        assert first.startswith("inbox: https://"), first
        address, _, token = first.removeprefix("inbox: ").partition("#token=")
        port = int(address.rstrip("/").rpartition(":")[2])
        base = f"https://127.0.0.1:{port}"
        trusted = ssl.create_default_context(cafile=str(cert))
        with httpx2.Client(base_url=base, verify=trusted, trust_env=False) as client:
            assert client.get("/api/approvals").status_code == 401
            answer = client.get("/api/approvals", headers={"Authorization": f"Bearer {token}"})
            assert answer.status_code == 200
            assert answer.json()["approvals"][0]["approval_id"] == produced.approval_id
        with (
            pytest.raises(httpx2.HTTPError),
            httpx2.Client(base_url=f"http://127.0.0.1:{port}", trust_env=False) as plain,
        ):
            plain.get("/api/approvals", headers={"Authorization": f"Bearer {token}"})
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_content_past_the_page_bound_is_cut_and_says_how_many_lines(tmp_path: Path) -> None:
    from cli_support import produce

    from agentrt.inbox._views import MAX_SHOWN_LINES

    content = "".join(f"{number}\n" for number in range(1, MAX_SHOWN_LINES + 6))
    produced = produce(tmp_path / "huge.db", tmp_path / "sandbox", long_content=content)
    running = start_inbox(produced.database)
    try:
        with running.authorized() as client:
            write = client.get("/api/approvals").json()["approvals"][0]["writes"][0]
    finally:
        running.stop()
    assert (write["line_count"], write["omitted"]) == (MAX_SHOWN_LINES + 5, 5)
    assert len(write["lines"]) == MAX_SHOWN_LINES and write["lines"][-1] == str(MAX_SHOWN_LINES)


def test_a_tls_certificate_that_cannot_be_used_is_one_clear_sentence(
    produced: Produced, tmp_path: Path
) -> None:
    missing = tmp_path / "missing.pem"
    refused = subprocess.run(
        [str(AGENTRT), "--db", str(produced.database), "inbox", "--listen", "0.0.0.0:0",
         "--allow-remote", "--tls-cert", str(missing), "--tls-key", str(missing)],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert refused.returncode == 1
    assert refused.stderr.startswith(f"agentrt: cannot use the TLS certificate {missing}")
    assert refused.stderr.count("\n") == 1 and refused.stdout == ""
