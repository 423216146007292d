"""Shared helpers: percentiles, ratios, RSS from /proc, paths."""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

HERE: Final = Path(__file__).resolve().parent
REPO: Final = HERE.parent
BENCH_SERVER: Final = HERE / "bench_server.py"
PYTHON: Final = sys.executable


def percentile(samples: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile (fraction in [0, 1]) of the samples."""
    ordered = sorted(samples)
    if not ordered:
        return float("nan")
    rank = max(0, min(len(ordered) - 1, round(fraction * len(ordered) + 0.5) - 1))
    return ordered[rank]


def summary(samples: Sequence[float]) -> dict[str, float]:
    """p50, p99, mean and count of latencies in seconds."""
    return {
        "p50": percentile(samples, 0.50),
        "p99": percentile(samples, 0.99),
        "mean": statistics.fmean(samples) if samples else float("nan"),
        "count": float(len(samples)),
    }


def ratio(value: float, baseline: float) -> float:
    return value / baseline if baseline > 0 else float("nan")


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.3f} ms"


def rss_kib(pid: int) -> dict[str, int]:
    """Current (VmRSS) and peak (VmHWM) resident set of a process, in KiB."""
    values: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                values[key] = int(rest.split()[0])
    return values


def cpu_seconds(pid: int) -> float:
    """User and system CPU a process has used (its threads, not its children), from /proc."""
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main_thread_cpu_seconds(pid: int) -> float:
    """User and system CPU of a process's main thread alone (its thread id is its pid), from
    /proc: beside `cpu_seconds`, what its other threads (agentrt's store writer) took."""
    with open(f"/proc/{pid}/task/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_of(pid: int) -> list[int]:
    """Direct children of a process, from /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(entry))
    return found


def descendants_of(pid: int) -> list[int]:
    """Every process below pid (children, their children, ...), from /proc."""
    found: list[int] = []
    queue = [pid]
    while queue:
        children = children_of(queue.pop())
        found.extend(children)
        queue.extend(children)
    return found


def cpu_of(pids: list[int]) -> float:
    """The CPU seconds of these processes; one that has ended has its time lost, not guessed."""
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):
            total += cpu_seconds(pid)
    return total


def cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return [part.decode(errors="replace") for part in handle.read().split(b"\0") if part]
    except OSError:
        return []


def find_descendant(root_pid: int, needle: str) -> int | None:
    """The first descendant of root_pid whose command line contains needle."""
    queue = [root_pid]
    while queue:
        pid = queue.pop(0)
        for child in children_of(pid):
            if any(needle in part for part in cmdline(child)):
                return child
            queue.append(child)
    return None


def table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(cell).ljust(width) for cell, width in zip(header, widths, strict=True))]
    lines.append("  ".join("-" * width for width in widths))
    for row in rows:
        lines.append("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)))
    return "\n".join(lines)


def private_file(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o600)
    return path


Result = dict[str, Any]


_STARTED = time.perf_counter()


def log(message: str) -> None:
    """A progress line on stderr, with seconds since the benchmarks started."""
    print(f"[{time.perf_counter() - _STARTED:7.1f}s] {message}", file=sys.stderr, flush=True)
