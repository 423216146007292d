"""Retention at size (issue 34): a database of N proxied calls on SQLite and PostgreSQL —
bytes per call, `verify` events per second, `verify --since-checkpoint` over the last 1 %,
a checkpoint, archiving 90 % (events per second, the database's size before and after),
and one run's evidence.  The target: the daily operations take time proportional to the
day, not the history.

    python benchmarks/bench_retention.py [--calls N] [--backends sqlite,postgresql]

The calls are written through the store's own transitions (`ledger.start_run`,
`record_step`, `record_result`: the six events and the rows of a proxied read whose
result ends its run), a thousand calls per transaction, not through a real proxy, so a
million calls build in minutes; their events and rows are what the proxy writes, bar
its call index.  `make bench` runs it at 10,000 calls (`--calls` for the issue's
1,000,000).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from _common import REPO, Result, log

from agentrt.retention import (
    archive_before,
    build_evidence,
    check_checkpoints,
    load_private_key,
    load_public_key,
    verify_evidence,
    write_checkpoint,
)
from agentrt.store import Store, ledger, open_store, utc_now

sys.path.insert(0, str(REPO / "tests"))

_CONTENT = json.dumps({"text": "a line of a file the host asked to read\n" * 8})
_BATCH = 1000


def _calls(store: Store, first: int, count: int) -> None:
    """`count` proxied reads, each run started, its step allowed, its result ending it."""
    number = first
    while number < first + count:
        with store.transaction() as connection:
            for _ in range(min(_BATCH, first + count - number)):
                run_id = f"bench{number:010d}"
                now = utc_now()
                _, token = ledger.start_run(
                    store, connection, run_id, "fs_read_file", ["fs_read_file"],
                    {"proxy_session": "bench", "call_key": f"{number:032x}"}, now, None,
                    ledger.NewLease("proxy:bench", 30.0, now),
                )  # fmt: skip
                args = json.dumps({"path": f"/srv/notes/{number}.txt"})
                ledger.record_step(
                    store, connection, run_id, 1, "fs_read_file", args, now,
                    {"outcome": "allow", "reason": "read_only", "policy_id": "bench-policy"},
                    executing=True,
                )  # fmt: skip
                assert token is not None
                ledger.record_result(
                    store, connection,
                    ledger.CallResult(run_id, 1, "fs_read_file", True, False, _CONTENT, "read"),
                    token,
                )  # fmt: skip
                number += 1
        store.take_committed_events()  # (what telemetry would drain; kept, they pile up)


def _size(store: Store) -> int:
    if store.backend == "postgresql":
        return int(store.query("SELECT pg_database_size(current_database())")[0][0])
    store.query("PRAGMA wal_checkpoint(TRUNCATE)")
    return sum(
        os.path.getsize(store.path + suffix)
        for suffix in ("", "-wal")
        if os.path.exists(store.path + suffix)
    )


def _timed(function: Any, *args: Any, **kwargs: Any) -> tuple[Any, float]:
    began = time.perf_counter()
    value = function(*args, **kwargs)
    return value, time.perf_counter() - began


def _keys(directory: Path) -> tuple[Path, Path]:
    private, public = directory / "operator.key", directory / "operator.pub"
    subprocess.run(
        ["openssl", "genpkey", "-algorithm", "ed25519", "-out", str(private)],
        check=True, capture_output=True,
    )  # fmt: skip
    private.chmod(0o600)
    subprocess.run(
        ["openssl", "pkey", "-in", str(private), "-pubout", "-out", str(public)],
        check=True, capture_output=True,
    )  # fmt: skip
    return private, public


def measure(target: str, directory: Path, calls: int) -> dict[str, Any]:
    """The figures for one database of `calls` proxied calls at `target`."""
    private_path, public_path = _keys(directory)
    key, public = load_private_key(str(private_path)), load_public_key(str(public_path))
    log_path, archive_dir = str(directory / "checkpoints.log"), directory / "archive"
    archive_dir.mkdir(mode=0o700)
    store = open_store(target)
    try:
        tail = max(1, calls // 100)
        log(f"retention: writing {calls - tail} calls")
        _, build_s = _timed(_calls, store, 0, calls - tail)
        _, checkpoint_s = _timed(write_checkpoint, store, key, log_path)
        log(f"retention: writing the last {tail} calls")
        _calls(store, calls - tail, tail)
        head = store.head_seq()
        size_before = _size(store)

        def since_checkpoint() -> int:
            check = check_checkpoints(store, [public], log_path, since=True)
            assert check.last is not None
            report = store.verify_chain(check.last.seq + 1)
            assert report.ok, report
            return report.checked

        since_events, since_s = _timed(since_checkpoint)
        log("retention: verifying the whole chain")
        whole, verify_s = _timed(store.verify_chain)
        assert whole.ok, whole
        state, state_s = _timed(store.verify_state)
        assert state.ok, state
        write_checkpoint(store, key, log_path)
        ninety = store.event_at(int(head * 0.9))
        assert ninety is not None
        log("retention: archiving 90 %")
        result, archive_s = _timed(
            archive_before, store, key, log_path, str(archive_dir),
            ninety.created_at + "~", time.time() + 1,
        )  # fmt: skip
        assert result.manifest is not None, result.reason
        archived = int(result.manifest["statement"]["count"])
        size_after = _size(store)
        since_after, since_after_s = _timed(since_checkpoint)
        _calls(store, calls, 1)  # one more call, then its evidence after a checkpoint
        write_checkpoint(store, key, log_path)
        document, evidence_s = _timed(
            build_evidence, store, log_path, public, run_id=f"bench{calls:010d}"
        )
        verify_evidence(json.dumps(document).encode())
        segment_bytes = sum(path.stat().st_size for path in archive_dir.iterdir())
        return {
            "calls": calls,
            "events": head,
            "build_s": build_s,
            "bytes_per_call": size_before / calls,
            "size_before": size_before,
            "size_after_archiving_90": size_after,
            "segment_bytes": segment_bytes,
            "verify_events_per_s": whole.checked / verify_s,
            "verify_s": verify_s,
            "verify_state_s": state_s,
            "checkpoint_s": checkpoint_s,
            "since_checkpoint_events": since_events,
            "since_checkpoint_s": since_s,
            "since_checkpoint_after_archive_s": since_after_s,
            "since_checkpoint_after_archive_events": since_after,
            "archived_events": archived,
            "archive_s": archive_s,
            "archive_events_per_s": archived / archive_s,
            "evidence_s": evidence_s,
        }
    finally:
        store.close()


@contextmanager
def _anchors_in(directory: str) -> Iterator[None]:
    previous = os.environ.get("AGENTRT_ANCHOR_DIR")
    os.environ["AGENTRT_ANCHOR_DIR"] = directory
    try:
        yield
    finally:
        if previous is None:
            del os.environ["AGENTRT_ANCHOR_DIR"]
        else:
            os.environ["AGENTRT_ANCHOR_DIR"] = previous


def run(
    quick: bool = False, calls: int | None = None, backends: str = "sqlite,postgresql"
) -> Result:
    count = calls if calls is not None else (2_000 if quick else 10_000)
    results: dict[str, Any] = {"calls": count}
    with tempfile.TemporaryDirectory(prefix="agentrt-bench-retention-") as name:
        workdir = Path(name)
        if "sqlite" in backends:
            (workdir / "sqlite").mkdir()
            results["sqlite"] = measure(
                str(workdir / "sqlite" / "runs.db"), workdir / "sqlite", count
            )
        if "postgresql" in backends:
            import _postgres

            binaries = _postgres.find_binaries()
            if binaries is None:
                results["postgresql"] = {"skipped": "PostgreSQL is not installed"}
            else:
                server = _postgres.PostgresServer(binaries)
                try:
                    (workdir / "postgresql").mkdir()
                    with _anchors_in(str(workdir / "anchors")):
                        results["postgresql"] = measure(
                            server.database(), workdir / "postgresql", count
                        )
                finally:
                    server.stop()
    return results


def rows(results: dict[str, Any]) -> list[list[str]]:
    """The rows `run.py` prints."""
    table: list[list[str]] = []
    for backend in ("sqlite", "postgresql"):
        figures = results.get(backend)
        if not isinstance(figures, dict) or "calls" not in figures:
            continue
        day = figures["since_checkpoint_s"] / max(figures["verify_s"], 1e-9)
        table += [
            [
                f"13 {backend}: {figures['calls']} calls, bytes per call",
                f"{figures['bytes_per_call']:.0f} B",
                "",
                "",
                "",
                f"{figures['events']} events, {figures['size_before'] / 1e6:.0f} MB",
            ],
            [
                f"13 {backend}: verify, events/s",
                f"{figures['verify_events_per_s']:.0f}",
                "",
                "",
                "",
                f"{figures['verify_s']:.1f} s whole chain",
            ],
            [
                f"13 {backend}: verify --since-checkpoint (last 1 %) / whole verify",
                f"{day:.3f}x",
                f"{figures['since_checkpoint_s'] * 1000:.0f} ms",
                "~0.01x",
                "met" if day <= 0.05 else "MISSED",
                f"{figures['since_checkpoint_events']} events",
            ],
            [
                f"13 {backend}: archive 90 %, events/s",
                f"{figures['archive_events_per_s']:.0f}",
                "",
                "",
                "",
                f"{figures['archived_events']} events in {figures['archive_s']:.1f} s",
            ],
            [
                f"13 {backend}: database size after archiving 90 % / before",
                f"{figures['size_after_archiving_90'] / figures['size_before']:.2f}x",
                "",
                "",
                "",
                f"{figures['size_before'] / 1e6:.0f} MB -> "
                f"{figures['size_after_archiving_90'] / 1e6:.0f} MB; segments "
                f"{figures['segment_bytes'] / 1e6:.0f} MB",
            ],
            [
                f"13 {backend}: one run's evidence",
                f"{figures['evidence_s'] * 1000:.0f} ms",
                "",
                "",
                "",
                "",
            ],
        ]
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=10_000)
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--output", type=Path)
    options = parser.parse_args()
    results = run(calls=options.calls, backends=options.backends)
    text = json.dumps(results, indent=1)
    if options.output is not None:
        options.output.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
