"""The window a precondition leaves open: from the moment its re-read answers to the
moment the approved call reaches the tool (`docs/approvals.md` quotes it).

Another writer that changes the state inside this window is not seen; everything it
changes before the re-read is.  Run: `python benchmarks/precondition_window.py
[--runs N] [--postgres URL]`.  Each run asks, is approved, and resumes on a store of
its own backend; the window is measured with `time.perf_counter` in the same process.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import anyio

from agentrt import Decision, Gate, SideEffect, StateRead, ToolCall, ToolResult, ToolSpec
from agentrt.approvals import approve
from agentrt.policy import ClassPolicy, Outcome
from agentrt.store import open_store

_SCHEMA = {"type": "object"}


class _TimedWrite:
    """A write whose fingerprint notes when its read answered, and whose call notes when
    it was reached."""

    def __init__(self) -> None:
        self.spec = ToolSpec("write", "a write", _SCHEMA, SideEffect.LOCAL_MUTATION, 10.0)
        self.read_at = 0.0
        self.windows: list[float] = []

    async def fingerprint(self, call: ToolCall) -> StateRead:
        self.read_at = time.perf_counter()
        return StateRead("the same text", "read", "{}")

    async def call(self, call: ToolCall) -> ToolResult:
        self.windows.append(time.perf_counter() - self.read_at)
        return ToolResult('{"ok":true}')


async def _measure(database: str | Path, runs: int) -> list[float]:
    store = open_store(database)
    tool = _TimedWrite()
    policy = ClassPolicy({SideEffect.LOCAL_MUTATION: Outcome.REQUIRE_APPROVAL})
    gate = Gate(store, [tool], policy=policy)
    try:
        for _ in range(runs):
            run_id = await gate.start("measure")
            outcome = await gate.step(run_id, Decision.tool_call("write", "{}"))
            assert outcome.approval is not None
            approve(store, run_id, approval_hash=outcome.approval.approval_hash, by="bench")
            await gate.resume(run_id)
    finally:
        store.close()
    return tool.windows


def _report(label: str, windows: list[float]) -> None:
    ordered = sorted(windows)
    p99 = ordered[max(0, int(len(ordered) * 0.99) - 1)]
    print(
        f"{label}: {len(ordered)} resumes, re-read -> call: median "
        f"{statistics.median(ordered) * 1000:.2f} ms, p99 {p99 * 1000:.2f} ms, "
        f"max {ordered[-1] * 1000:.2f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--postgres", help="a PostgreSQL URL to measure as well")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        windows = anyio.run(_measure, Path(directory) / "window.db", options.runs)
    _report("SQLite", windows)
    if options.postgres:
        _report("PostgreSQL", anyio.run(_measure, options.postgres, options.runs))


if __name__ == "__main__":
    main()
