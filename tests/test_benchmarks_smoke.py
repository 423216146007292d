"""`make bench` keeps working as the code changes: its quickest pass runs to the end.

Nothing here asserts a time; the benchmarks print ratios, and this only checks
that the gate benchmark still runs against the current API.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(180)
def test_the_gate_benchmark_runs_and_reports_a_ratio(tmp_path: Path) -> None:
    # Its JSON goes to a temporary directory: a developer's latest `make bench` stays.
    kept = sorted((ROOT / "benchmarks" / "results").glob("*.json"))
    finished = subprocess.run(
        [sys.executable, "benchmarks/run.py", "--quick", "--only", "gate", "--no-peers",
         "--results", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=170,
    )  # fmt: skip
    assert finished.returncode == 0, finished.stdout[-2000:] + finished.stderr[-2000:]
    assert "1 gate step, runs of 10" in finished.stdout
    latest = json.loads((tmp_path / "latest.json").read_text())
    assert latest["gate"]["rows"] and latest["gate"]["commits_per_step"] == 2
    assert sorted((ROOT / "benchmarks" / "results").glob("*.json")) == kept
