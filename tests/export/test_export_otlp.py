"""`agentrt export --otlp URL --cursor FILE`: every span of the log sent once across restarts
of the command, to a real OTLP/HTTP receiver on loopback."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import anyio
import pytest
from export_support import AGENTRT, POLICY, approved_write_run, produce_runs, tools
from otlp_receiver import ReceivedSpan, Receiver, otlp_receiver

from agentrt import Decision
from agentrt.approvals import approve
from agentrt.export import Follower
from agentrt.gate import Gate
from agentrt.store import Store, open_store
from agentrt.telemetry import SpansNotDelivered, TelemetrySettings, TraceBuilder, TraceExporter


def agentrt(
    *args: str, timeout: float = 60, environment: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(AGENTRT), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        env=None if environment is None else {**os.environ, **environment},
    )


def spans_to(database: Path, url: str, cursor: Path) -> subprocess.CompletedProcess[str]:
    return agentrt("--db", str(database), "export", "--otlp", url, "--cursor", str(cursor))


def _every_span_id(database: Path) -> list[str]:
    """The spans the whole log makes, built in one pass: what the receiver must end up with."""
    builder = TraceBuilder()
    with open_store(database, read_only=True) as store:
        events = store.events_after(0, 100_000)
    return sorted(f"{span.span_id:016x}" for event in events for span in builder.add(event))


def _received(receiver: Receiver) -> list[str]:
    return sorted(span.span_id for span in receiver.snapshot())


def _orphans(spans: list[ReceivedSpan]) -> set[str]:
    ids = {span.span_id for span in spans}
    return {span.parent_span_id for span in spans if span.parent_span_id} - ids


def _dead_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_every_span_is_sent_once_across_runs_of_the_command(tmp_path: Path) -> None:
    database = produce_runs(tmp_path / "runs.db", tmp_path / "sandbox").database
    cursor = tmp_path / "spans.cursor"
    with otlp_receiver() as receiver:
        first = agentrt(
            "--db", str(database), "export", "--otlp", receiver.url, "--cursor", str(cursor)
        )
        assert first.returncode == 0, first.stderr
        sent = len(receiver.snapshot())
        assert sent > 0 and f"{sent} span(s) sent" in first.stderr
        again = agentrt(
            "--db", str(database), "export", "--otlp", receiver.url, "--cursor", str(cursor)
        )
        assert again.returncode == 0 and len(receiver.snapshot()) == sent

        produce_runs(database, tmp_path / "sandbox", count=1)
        third = agentrt(
            "--db", str(database), "export", "--otlp", receiver.url, "--cursor", str(cursor)
        )
        assert third.returncode == 0, third.stderr
        spans = receiver.snapshot()
    assert len(spans) > sent
    # None lost, none twice: exactly the spans one pass over the whole log makes.
    assert _received(receiver) == _every_span_id(database)
    assert not _orphans(spans)


def test_a_run_that_straddles_the_cursor_keeps_its_parents(tmp_path: Path) -> None:
    database = tmp_path / "runs.db"
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir()
    cursor = tmp_path / "spans.cursor"

    async def begin() -> str:
        # A run that reads, then waits for a person's approval of its write.
        with open_store(database) as store:
            gate = Gate(store, tools(sandbox), policy=POLICY)
            run_id = await gate.start("read, then write once approved")
            await gate.step(run_id, Decision.tool_call("read_note", '{"path": "a.txt"}'))
            held = await gate.step(
                run_id, Decision.tool_call("write_note", '{"path": "b.txt", "content": "x"}')
            )
            assert held.approval is not None
            return run_id

    async def finish(run_id: str) -> None:
        # Approved after the first export: the run's later spans come after the cursor.
        with open_store(database) as store:
            waiting = store.waiting_approval(run_id)
            assert waiting is not None
            approve(store, run_id, approval_hash=waiting.approval_hash, by="tester")
            gate = Gate(store, tools(sandbox), policy=POLICY)
            await gate.resume(run_id)
            await gate.step(run_id, Decision.complete("wrote it"))
            await approved_write_run(gate)

    run_id = anyio.run(begin)
    with otlp_receiver() as receiver:
        first = agentrt(
            "--db", str(database), "export", "--otlp", receiver.url, "--cursor", str(cursor)
        )
        assert first.returncode == 0, first.stderr
        anyio.run(finish, run_id)
        second = agentrt(
            "--db", str(database), "export", "--otlp", receiver.url, "--cursor", str(cursor)
        )
        assert second.returncode == 0, second.stderr
        spans = receiver.snapshot()
    assert _received(receiver) == _every_span_id(database)
    assert not _orphans(spans)
    assert any(span.name == "invoke_agent agentrt" for span in spans)


def test_a_follower_stopped_and_started_again_loses_nothing_and_repeats_nothing(
    tmp_path: Path,
) -> None:
    database = produce_runs(tmp_path / "runs.db", tmp_path / "sandbox").database
    cursor = tmp_path / "spans.cursor"
    with otlp_receiver() as receiver:
        command = [str(AGENTRT), "--db", str(database), "export", "--otlp", receiver.url,
                   "--cursor", str(cursor), "--follow", "--poll", "0.1"]  # fmt: skip
        follower = subprocess.Popen(command, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            while not receiver.snapshot() and time.monotonic() < deadline:
                time.sleep(0.05)
            produce_runs(database, tmp_path / "sandbox", count=2)
            time.sleep(0.5)
            follower.send_signal(signal.SIGTERM)
            assert follower.wait(30) == 0
        finally:
            follower.kill()
            follower.wait()
        produce_runs(database, tmp_path / "sandbox", count=1)
        restarted = agentrt(
            "--db", str(database), "export", "--otlp", receiver.url, "--cursor", str(cursor)
        )
        assert restarted.returncode == 0, restarted.stderr
        spans = receiver.snapshot()
    assert _received(receiver) == _every_span_id(database)
    assert not _orphans(spans)


def test_a_collector_that_is_down_moves_no_cursor_and_gets_everything_later(
    tmp_path: Path,
) -> None:
    database = produce_runs(tmp_path / "runs.db", tmp_path / "sandbox").database
    cursor = tmp_path / "spans.cursor"
    down = f"http://127.0.0.1:{_dead_port()}"
    # Sent twice (one pause of 0.5 s, not the default five), each export given up when its
    # 0.5 s are out: a refused connection is not waited out with the SDK's own backoff.
    failed = agentrt(
        "--db", str(database), "export", "--otlp", down, "--cursor", str(cursor), "--retries", "1",
        environment={"OTEL_EXPORTER_OTLP_TIMEOUT": "0.5"},
    )  # fmt: skip
    assert failed.returncode != 0
    assert f"could not be sent to {down}/v1/traces; trying again" in failed.stderr
    assert f"spans could not be sent to {down}/v1/traces; the cursor stays at the start" in (
        failed.stderr
    )
    assert not cursor.exists()
    with otlp_receiver() as receiver:
        later = agentrt(
            "--db", str(database), "export", "--otlp", receiver.url, "--cursor", str(cursor)
        )
        assert later.returncode == 0, later.stderr
    assert _received(receiver) == _every_span_id(database)


class _PausesRecorded(Follower):
    """A follower whose pauses between attempts are written down, not waited out."""

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self.pauses: list[float] = []

    def wait_stopped(self, seconds: float) -> bool:
        self.pauses.append(seconds)
        return False


def test_without_follow_a_refused_batch_is_tried_after_each_pause_of_the_schedule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    database = produce_runs(tmp_path / "runs.db", tmp_path / "sandbox", count=1).database
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "0.5")
    settings = TelemetrySettings(f"http://127.0.0.1:{_dead_port()}/v1/traces")
    for retries, pauses in (
        (None, [0.5, 1.0, 2.0, 5.0, 10.0]),  # the default: the command's five pauses
        (7, [0.5, 1.0, 2.0, 5.0, 10.0, 10.0, 10.0]),  # --retries 7: the last one repeats
        (0, []),  # --retries 0: one attempt
    ):
        with open_store(database, read_only=True) as store:
            follower = _PausesRecorded(store)
            exporter = TraceExporter(database, settings, log=io.StringIO())
            with pytest.raises(SpansNotDelivered):
                exporter.follow_cursor(store, follower, retries=retries)
            assert follower.position.seq == 0
        assert follower.pauses == pauses
        assert exporter.sent == 0


def test_bad_otlp_options_are_refused_in_one_sentence_and_nothing_is_written(
    tmp_path: Path,
) -> None:
    database = produce_runs(tmp_path / "runs.db", tmp_path / "sandbox", count=1).database
    before = database.read_bytes()
    cursor = tmp_path / "spans.cursor"
    for args, said in (
        (("--otlp", "ftp://collector:4318"), "--otlp takes an http:// or https:// base URL"),
        (("--otlp", "not a url"), "--otlp takes an http:// or https:// base URL"),
        (("--content",), "--content goes with --otlp"),
        (("--retries", "1"), "--retries goes with --otlp"),
        (
            ("--otlp", "http://127.0.0.1:4318", "--retries", "1", "--follow"),
            "--retries goes without --follow",
        ),
    ):
        refused = agentrt("--db", str(database), "export", "--cursor", str(cursor), *args)
        assert refused.returncode != 0
        assert said in refused.stderr
        assert refused.stdout == ""
        assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert not cursor.exists()
    assert database.read_bytes() == before


def test_the_cursor_is_the_same_file_the_json_lines_export_keeps(tmp_path: Path) -> None:
    database = produce_runs(tmp_path / "runs.db", tmp_path / "sandbox", count=1).database
    cursor = tmp_path / "spans.cursor"
    with otlp_receiver() as receiver:
        done = agentrt(
            "--db", str(database), "export", "--otlp", receiver.url, "--cursor", str(cursor)
        )
        assert done.returncode == 0, done.stderr
    saved = json.loads(cursor.read_text())
    with open_store(database, read_only=True) as store:
        head = store.head_seq()
        assert saved == {"seq": head, "hash": store.event_at(head).hash}  # type: ignore[union-attr]
    assert oct(os.stat(cursor).st_mode & 0o777) == "0o600"
