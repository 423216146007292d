"""The proxy's call index: does a lookup cost more as identical calls pile up?

A host that asks the same read-only question all day leaves one settled row
per call under one key.  Each decision must still read only the rows its
rules need, so the p50 of `CallIndex.decide` is measured on a real database
file after 10, 1,000 and 10,000 earlier identical calls, and reported as a
ratio to the 10-call baseline of the same run.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from _common import Result, log, ratio, summary

from agentrt.proxy._index import CallIndex, Settled, call_key
from agentrt.store import open_store

SESSION = "bench"
TOOL = "up_read"


def _history(index: CallIndex, key: str, count: int) -> None:
    """`count` earlier identical read-only calls, settled, as the proxy leaves them."""
    now = time.time()
    with index.store.transaction() as connection:
        connection.executemany(
            "INSERT INTO proxy_calls (run_id, session, call_key, tool, mutating, created_at,"
            " settled, outcome, settled_at) VALUES (?, ?, ?, ?, 0, ?, 1, ?, ?)",
            [
                (f"{SESSION}.h{number:08d}", SESSION, key, TOOL, now - count + number,
                 str(Settled.RESULT), now - count + number)
                for number in range(count)
            ],
        )  # fmt: skip


HISTORIES = (10, 1_000, 10_000)


def lookups(histories: tuple[int, ...], samples: int) -> dict[int, list[float]]:
    """Decide times per history size, taken in turn so the machine's load falls on all alike."""
    timings: dict[int, list[float]] = {history: [] for history in histories}
    with tempfile.TemporaryDirectory() as directory:
        stores = [open_store(Path(directory) / f"index-{history}.db") for history in histories]
        try:
            key = call_key(TOOL, '{"q":"same"}')
            indexes = []
            for store, history in zip(stores, histories, strict=True):
                index = CallIndex(store, SESSION, "proxy:bench", 30.0)
                _history(index, key, history)
                indexes.append(index)
            for number in range(samples):
                for index, history in zip(indexes, histories, strict=True):
                    started = time.perf_counter()
                    with index.store.transaction() as connection:
                        verdict = index.decide_in(
                            connection, run_id=f"{SESSION}.s{number:08d}", key=key, tool=TOOL,
                            mutating=False, repeat_window=600.0, may_need_approval=False,
                            max_pending=5, token=f"t{number}",
                        )  # fmt: skip
                    timings[history].append(time.perf_counter() - started)
                    assert verdict.row is not None
                    index.settle(verdict.row.run_id, Settled.RESULT)
        finally:
            for store in stores:
                store.close()
    return timings


def run(quick: bool = False) -> Result:
    samples = 40 if quick else 300
    log(f"index: decide after {', '.join(map(str, HISTORIES))} earlier identical calls")
    timings = lookups(HISTORIES, samples)
    baseline = summary(timings[HISTORIES[0]])
    rows = []
    for history in HISTORIES:
        measured = summary(timings[history])
        rows.append(
            {
                "history": history,
                "p50_s": measured["p50"],
                "p99_s": measured["p99"],
                "ratio_p50": ratio(measured["p50"], baseline["p50"]),
            }
        )
    return {"samples": samples, "rows": rows}


if __name__ == "__main__":
    for row in run()["rows"]:
        print(
            f"{row['history']:>6} earlier identical calls: p50 {row['p50_s'] * 1000:.3f} ms "
            f"({row['ratio_p50']:.2f}x the 10-call p50)"
        )
