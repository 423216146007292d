"""`agentrt export` and the library `Follower`: events after a cursor, and the chain a consumer
verifies from the lines it received."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest
from export_support import AGENTRT, append_filler, produce_runs

from agentrt.export import (
    DEFAULT_BATCH,
    Cursor,
    CursorError,
    Follower,
    export_line,
    read_cursor,
    verify_lines,
    write_cursor,
)
from agentrt.store import GENESIS_HASH, open_store


def agentrt(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(AGENTRT), *args], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
    )


@pytest.fixture
def database(tmp_path: Path) -> Path:
    return produce_runs(tmp_path / "runs.db", tmp_path / "sandbox").database


def test_export_prints_every_event_once_and_a_second_run_prints_nothing(
    database: Path, tmp_path: Path
) -> None:
    cursor = tmp_path / "export.cursor"
    first = agentrt("--db", str(database), "export", "--cursor", str(cursor))
    assert first.returncode == 0, first.stderr
    lines = first.stdout.splitlines()
    verified = agentrt("--db", str(database), "verify")
    assert f"intact: {len(lines)} events" in verified.stdout
    assert [json.loads(line)["seq"] for line in lines] == list(range(1, len(lines) + 1))
    record = json.loads(lines[0])
    assert set(record) == {"seq", "run_id", "type", "payload", "created_at", "hash", "prev_hash"}
    assert record["type"] == "run_started" and record["prev_hash"] == GENESIS_HASH
    assert stat.S_IMODE(os.stat(cursor).st_mode) == 0o600
    assert read_cursor(cursor) == Cursor(len(lines), json.loads(lines[-1])["hash"])

    second = agentrt("--db", str(database), "export", "--cursor", str(cursor))
    assert second.returncode == 0 and second.stdout == ""

    append_filler(database, 3)
    third = agentrt("--db", str(database), "export", "--cursor", str(cursor))
    assert [json.loads(line)["seq"] for line in third.stdout.splitlines()] == [
        len(lines) + 1,
        len(lines) + 2,
        len(lines) + 3,
    ]


def test_a_consumer_verifies_the_chain_from_the_exported_lines(database: Path) -> None:
    append_filler(database, 5)  # payloads with non-ASCII text, escaped on the line
    exported = agentrt("--db", str(database), "export").stdout.splitlines()
    report = verify_lines(exported, prev_hash=GENESIS_HASH)
    assert report.ok, report.reason
    with open_store(database, read_only=True) as store:
        chain = store.verify_chain()
    assert (report.checked, report.head_seq, report.head_hash) == (
        chain.checked,
        chain.head_seq,
        chain.head_hash,
    )
    # A later slice chains to the hash its consumer kept from the earlier one.
    assert verify_lines(exported[5:], prev_hash=json.loads(exported[4])["hash"]).ok


def test_a_tampered_exported_line_fails_the_consumers_check(database: Path) -> None:
    exported = agentrt("--db", str(database), "export").stdout.splitlines()
    record = json.loads(exported[2])
    record["payload"]["step"] = 7
    tampered = [*exported[:2], json.dumps(record), *exported[3:]]
    report = verify_lines(tampered, prev_hash=GENESIS_HASH)
    assert not report.ok and report.first_bad_line == 3
    assert "does not match its hash" in report.reason

    dropped = verify_lines([*exported[:2], *exported[3:]], prev_hash=GENESIS_HASH)
    assert not dropped.ok and dropped.first_bad_line == 3
    assert "where event 3 was due" in dropped.reason

    record = json.loads(exported[0])
    record["hash"] = "f" * 64
    forged_head = verify_lines([json.dumps(record)], prev_hash=GENESIS_HASH)
    assert not forged_head.ok and forged_head.first_bad_line == 1

    wrong_anchor = verify_lines(exported, prev_hash="a" * 64)
    assert not wrong_anchor.ok and "does not chain" in wrong_anchor.reason


def test_from_starts_at_an_event_and_is_refused_beside_an_existing_cursor(
    database: Path, tmp_path: Path
) -> None:
    cursor = tmp_path / "c"
    started = agentrt("--db", str(database), "export", "--from", "4", "--cursor", str(cursor))
    lines = started.stdout.splitlines()
    assert json.loads(lines[0])["seq"] == 4
    with open_store(database, read_only=True) as store:
        third = store.event_at(3)
    assert third is not None and verify_lines(lines, prev_hash=third.hash).ok
    refused = agentrt("--db", str(database), "export", "--from", "2", "--cursor", str(cursor))
    assert refused.returncode == 1
    assert "already stands at event" in refused.stderr and refused.stdout == ""


def test_a_cursor_of_another_database_is_refused(database: Path, tmp_path: Path) -> None:
    cursor = tmp_path / "c"
    write_cursor(cursor, Cursor(3, "e" * 64))
    refused = agentrt("--db", str(database), "export", "--cursor", str(cursor))
    assert refused.returncode == 1 and refused.stdout == ""
    assert "another database's cursor, or the chain was rewritten" in refused.stderr
    assert read_cursor(cursor) == Cursor(3, "e" * 64)


def test_a_cursor_others_can_write_is_refused(database: Path, tmp_path: Path) -> None:
    cursor = tmp_path / "c"
    write_cursor(cursor, Cursor(0, GENESIS_HASH))
    os.chmod(cursor, 0o622)
    refused = agentrt("--db", str(database), "export", "--cursor", str(cursor))
    assert refused.returncode == 1 and refused.stdout == ""
    assert "writable by group or others" in refused.stderr
    link = tmp_path / "link"
    link.symlink_to(cursor)
    with pytest.raises(CursorError, match="symbolic link"):
        read_cursor(link)


def test_a_follower_that_never_advanced_delivers_the_same_batch_again(
    database: Path, tmp_path: Path
) -> None:
    cursor = tmp_path / "c"
    with open_store(database, read_only=True) as store:
        first = Follower(store, cursor_path=cursor, batch=4)
        batch = next(first.batches())
        first.advance(batch)
        undelivered = next(first.batches())  # the process "dies" before advancing
        again = Follower(store, cursor_path=cursor, batch=4)
        redelivered = next(again.batches())
        assert [e.seq for e in redelivered] == [e.seq for e in undelivered] == [5, 6, 7, 8]
        # One follower never yields a batch twice, advanced or not; drained, it stops.
        rest = [event.seq for batch in again.batches() for event in batch]
        assert rest == list(range(5, store.head_seq() + 1))


def _lines_of(path: Path) -> list[str]:
    """The complete lines of a file a killed exporter wrote (a cut last line was not delivered)."""
    text = path.read_text()
    complete, _, _partial = text.rpartition("\n")
    return complete.splitlines() if complete else []


def _wait_for_lines(path: Path, count: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while len(_lines_of(path)) < count:
        assert process.poll() is None, "the exporter exited early"
        assert time.monotonic() < deadline, "the exporter printed too little"
        time.sleep(0.05)


@pytest.mark.slow
def test_export_across_a_killed_exporter_repeats_at_most_one_batch_and_loses_nothing(
    database: Path, tmp_path: Path
) -> None:
    append_filler(database, 3 * DEFAULT_BATCH)
    cursor = tmp_path / "c"
    outputs: list[Path] = []
    for attempt in range(3):
        output = tmp_path / f"out{attempt}.jsonl"
        outputs.append(output)
        with output.open("wb") as sink:
            exporter = subprocess.Popen(
                [
                    str(AGENTRT),
                    "--db",
                    str(database),
                    "export",
                    "--cursor",
                    str(cursor),
                    "--follow",
                ],
                stdout=sink,
                stdin=subprocess.DEVNULL,
            )
        try:
            # New events arrive while it follows; it is killed mid-stream.
            append_filler(database, DEFAULT_BATCH + 37, run_id=f"writer{attempt}")
            _wait_for_lines(output, 1, exporter)
        finally:
            exporter.send_signal(signal.SIGKILL)
            exporter.wait()
    final = tmp_path / "final.jsonl"
    outputs.append(final)
    final.write_text(agentrt("--db", str(database), "export", "--cursor", str(cursor)).stdout)

    with open_store(database, read_only=True) as store:
        head = store.head_seq()
    seen: set[int] = set()
    for output in outputs:
        lines = _lines_of(output)
        assert verify_lines(lines).ok
        seqs = [json.loads(line)["seq"] for line in lines]
        repeated = [seq for seq in seqs if seq in seen]
        # Only the batch a kill cut off before its cursor was written comes again: a run of
        # lines at the start of the next output, no longer than one batch.
        assert repeated == seqs[: len(repeated)] and len(repeated) <= DEFAULT_BATCH
        seen.update(seqs)
    assert seen == set(range(1, head + 1))


@pytest.mark.slow
@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT])
def test_a_signalled_exporter_stops_cleanly_and_repeats_nothing(
    database: Path, tmp_path: Path, stop_signal: signal.Signals
) -> None:
    cursor = tmp_path / "c"
    output = tmp_path / "out.jsonl"
    with output.open("wb") as sink:
        exporter = subprocess.Popen(
            [str(AGENTRT), "--db", str(database), "export", "--cursor", str(cursor), "--follow"],
            stdout=sink,
            stdin=subprocess.DEVNULL,
        )
    try:
        _wait_for_lines(output, 1, exporter)
        append_filler(database, 10)
        with open_store(database, read_only=True) as store:
            head = store.head_seq()
        _wait_for_lines(output, head, exporter)
        exporter.send_signal(stop_signal)
        assert exporter.wait(timeout=30) == 0
    finally:
        if exporter.poll() is None:
            exporter.kill()
            exporter.wait()
    assert read_cursor(cursor) == Cursor(head, json.loads(_lines_of(output)[-1])["hash"])
    append_filler(database, 2)
    after = agentrt("--db", str(database), "export", "--cursor", str(cursor)).stdout.splitlines()
    assert [json.loads(line)["seq"] for line in after] == [head + 1, head + 2]


@pytest.mark.slow
def test_a_closed_stdout_stops_the_exporter_with_the_cursor_at_what_was_written(
    database: Path, tmp_path: Path
) -> None:
    cursor = tmp_path / "c"
    exporter = subprocess.Popen(
        [str(AGENTRT), "--db", str(database), "export", "--cursor", str(cursor), "--follow",
         "--poll", "0.1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        with open_store(database, read_only=True) as store:
            head = store.head_seq()
        assert exporter.stdout is not None
        received = [exporter.stdout.readline() for _ in range(head)]
        exporter.stdout.close()  # the reader goes away
        append_filler(database, 5)
        assert exporter.wait(timeout=30) == 1
    finally:
        if exporter.poll() is None:
            exporter.kill()
            exporter.wait()
    assert exporter.stderr is not None
    stderr = exporter.stderr.read().decode()
    assert f"stdout was closed by its reader; the cursor stays at event {head}" in stderr
    assert "Traceback" not in stderr
    assert read_cursor(cursor) == Cursor(head, json.loads(received[-1])["hash"])
    rest = agentrt("--db", str(database), "export", "--cursor", str(cursor)).stdout.splitlines()
    assert [json.loads(line)["seq"] for line in rest] == list(range(head + 1, head + 6))


def test_export_line_is_the_events_json_line(database: Path) -> None:
    with open_store(database, read_only=True) as store:
        event = store.event_at(1)
    assert event is not None
    assert json.loads(export_line(event))["hash"] == event.hash


def test_lines_whose_cursor_was_not_written_are_printed_again(
    database: Path, tmp_path: Path
) -> None:
    # The cursor's directory is missing, so its replacement fails after the lines are
    # flushed: exactly the window a kill between the two would open.
    cursor = tmp_path / "not-yet" / "c"
    failed = agentrt("--db", str(database), "export", "--cursor", str(cursor))
    assert failed.returncode == 1
    assert "cannot be written" in failed.stderr and "will be printed again" in failed.stderr
    printed = failed.stdout.splitlines()
    assert printed and not cursor.exists()
    cursor.parent.mkdir()
    again = agentrt("--db", str(database), "export", "--cursor", str(cursor))
    assert again.returncode == 0 and again.stdout.splitlines() == printed


def test_lines_exported_to_a_file_are_on_disk_before_the_cursor_moves(
    database: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `export --cursor C >> events.jsonl`: the cursor is fsynced, so after a power cut it
    # survives; the lines must be too, or the events between them are never printed again.
    import io
    import sys

    from agentrt.cli import cli

    output = tmp_path / "events.jsonl"
    cursor = tmp_path / "cursor"
    order: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(descriptor: int) -> None:
        if os.fstat(descriptor).st_ino == output.stat().st_ino:
            order.append("lines on disk")
        real_fsync(descriptor)

    def replace(source: str, target: str) -> None:
        if Path(target) == cursor:
            order.append("cursor moved")
        real_replace(source, target)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    with output.open("wb") as sink:
        monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(sink, write_through=True))
        cli.main(["--db", str(database), "export", "--cursor", str(cursor)], standalone_mode=False)
    assert order == ["lines on disk", "cursor moved"]
    assert read_cursor(cursor) is not None
    assert len(_lines_of(output)) == read_cursor(cursor).seq  # type: ignore[union-attr]
