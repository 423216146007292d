"""`verify`: the hash chain of a database the real Gate wrote, intact and tampered."""

from __future__ import annotations

import json
import re
import shutil
import sqlite3

from cli_support import Produced

from agentrt import cancel, open_store
from agentrt.store import GENESIS_HASH, event_hash


def _head(output: str) -> tuple[int, str]:
    match = re.search(r"head (\d+):([0-9a-f]{64})", output)
    assert match, output
    return int(match.group(1)), match.group(2)


def _event_count(produced: Produced) -> int:
    with sqlite3.connect(produced.database) as connection:
        return int(connection.execute("SELECT COUNT(*) FROM events").fetchone()[0])


def _alter_payload(produced: Produced, seq: int) -> None:
    with sqlite3.connect(produced.database) as connection:
        (payload,) = connection.execute(
            "SELECT payload FROM events WHERE seq = ?", (seq,)
        ).fetchone()
        document = json.loads(payload)
        document["forged"] = True
        connection.execute(
            "UPDATE events SET payload = ? WHERE seq = ?", (json.dumps(document), seq)
        )


def _rewrite_chain(produced: Produced) -> None:
    """What a forger with write access does: recompute every hash after an edit."""
    with sqlite3.connect(produced.database) as connection:
        rows = connection.execute(
            "SELECT seq, run_id, type, payload, created_at FROM events ORDER BY seq"
        ).fetchall()
        prev_hash = GENESIS_HASH
        for seq, run_id, type_, payload, created_at in rows:
            digest = event_hash(prev_hash, seq, run_id, type_, payload, created_at)
            connection.execute(
                "UPDATE events SET prev_hash = ?, hash = ? WHERE seq = ?", (prev_hash, digest, seq)
            )
            prev_hash = digest


def test_verify_reports_an_intact_chain_and_its_head(produced: Produced, run_cli) -> None:
    result = run_cli("verify")
    assert result.exit_code == 0, result.output
    count = _event_count(produced)
    assert result.output.startswith(f"intact: {count} events checked, head {count}:")


def test_verify_json_reports_an_intact_chain(produced: Produced, run_cli) -> None:
    result = run_cli("--json", "verify")
    assert result.exit_code == 0, result.output
    (line,) = result.output.splitlines()
    report = json.loads(line)
    count = _event_count(produced)
    assert report == {
        "record": "verify",
        "ok": True,
        "checked": count,
        "head_seq": count,
        "head_hash": report["head_hash"],
        "first_bad_seq": None,
        "anchor_seq": count,
        "anchor_hash": report["head_hash"],
        "first_bad_row": None,
        "reason": "intact",
    }
    assert _head(run_cli("verify").output) == (count, report["head_hash"])


def test_verify_names_the_first_event_whose_payload_was_altered(
    produced: Produced, run_cli
) -> None:
    _alter_payload(produced, 5)
    _alter_payload(produced, 9)
    result = run_cli("verify")
    assert result.exit_code == 1
    assert "the chain is broken at event 5: event 5 does not match its hash" in result.output
    assert "intact" not in result.output


def test_verify_json_names_the_first_bad_event(produced: Produced, run_cli) -> None:
    _alter_payload(produced, 3)
    result = run_cli("--json", "verify")
    assert result.exit_code == 1
    report = json.loads(result.output.splitlines()[0])
    assert report["record"] == "verify" and report["ok"] is False
    assert report["first_bad_seq"] == 3 and report["head_seq"] == 2


def test_verify_names_a_deleted_event(produced: Produced, run_cli) -> None:
    with sqlite3.connect(produced.database) as connection:
        connection.execute("DELETE FROM events WHERE seq = 4")
    result = run_cli("verify")
    assert result.exit_code == 1
    assert "broken at event 4: event 4 is missing" in result.output


def test_verify_from_and_to_check_only_that_range(produced: Produced, run_cli) -> None:
    _alter_payload(produced, 6)
    assert run_cli("verify", "--to", "5").exit_code == 0
    assert run_cli("verify", "--from", "7").exit_code == 0
    inside = run_cli("verify", "--from", "4", "--to", "8")
    assert inside.exit_code == 1 and "broken at event 6" in inside.output


def test_verify_head_passes_while_the_chain_still_reaches_it(produced: Produced, run_cli) -> None:
    seq, digest = _head(run_cli("verify", "--to", "7").output)
    assert seq == 7
    result = run_cli("verify", "--head", f"{seq}:{digest}")
    assert result.exit_code == 0, result.output


def test_verify_head_fails_after_the_chain_was_rewritten_wholesale(
    produced: Produced, run_cli
) -> None:
    seq, digest = _head(run_cli("verify").output)
    _alter_payload(produced, 2)
    _rewrite_chain(produced)
    # The forgery is self-consistent: only a remembered head exposes it (the
    # anchor beside the database is one, `--head` another).
    replaced = run_cli("verify")
    assert replaced.exit_code == 1 and "the chain was replaced" in replaced.output
    result = run_cli("verify", "--head", f"{seq}:{digest}")
    assert result.exit_code == 1
    assert f"event {seq} no longer has hash {digest}" in result.output


def test_verify_head_fails_when_the_chain_was_cut_short(produced: Produced, run_cli) -> None:
    seq, digest = _head(run_cli("verify").output)
    with sqlite3.connect(produced.database) as connection:
        connection.execute("DELETE FROM events WHERE seq > ?", (seq - 3,))
    cut = run_cli("verify")
    assert cut.exit_code == 1
    assert f"ends at event {seq - 3}" in cut.output
    assert f"anchor records event {seq}" in cut.output
    result = run_cli("verify", "--head", f"{seq}:{digest}")
    assert result.exit_code == 1
    assert f"no longer reaches event {seq}: it ends at event {seq - 3}" in result.output


def test_verify_head_must_be_seq_colon_hash(run_cli) -> None:
    for bad in ("7", "x:" + "a" * 64, "7:" + "A" * 64, "0:" + "a" * 64, "7:abc"):
        result = run_cli("verify", "--head", bad)
        assert result.exit_code == 2, bad
        assert "expected SEQ:HASH" in result.output


def test_verify_from_after_to_is_bad_usage(run_cli) -> None:
    result = run_cli("verify", "--from", "9", "--to", "3")
    assert result.exit_code == 2


def test_verify_names_an_approval_approved_by_hand(produced: Produced, run_cli) -> None:
    assert run_cli("verify").exit_code == 0
    with sqlite3.connect(produced.database) as connection:
        connection.execute(
            "UPDATE approvals SET status = 'approved' WHERE approval_id = ?",
            (produced.approval_id,),
        )
    result = run_cli("verify")
    assert result.exit_code == 1
    assert (
        f"the tables disagree with the events at approval {produced.approval_id}: "
        f"approval {produced.approval_id} is approved but its latest state event"
    ) in result.output
    report = json.loads(run_cli("--json", "verify").output.splitlines()[0])
    assert report["ok"] is False and report["first_bad_row"] == f"approval {produced.approval_id}"


def test_verify_names_both_heads_when_an_older_copy_was_restored(
    produced: Produced, run_cli
) -> None:
    backup = produced.database.with_name("backup.db")
    shutil.copy2(produced.database, backup)
    old_head = _head(run_cli("verify").output)
    with open_store(produced.database) as store:
        cancel(store, produced.waiting_run)
        new_head = store.head()
    shutil.copy2(backup, produced.database)
    result = run_cli("verify")
    assert result.exit_code == 1
    assert f"ends at event {old_head[0]} ({old_head[1][:16]})" in result.output
    assert f"anchor records event {new_head[0]} ({new_head[1][:16]})" in result.output
    # Deciding on it is refused the same way: the cancelled run would wake again.
    decided = run_cli("cancel", produced.waiting_run)
    assert decided.exit_code != 0 and "committed events were lost" in decided.output
