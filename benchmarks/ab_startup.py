"""Start-up of two source trees of agentrt, paired: `python -m agentrt.proxy` from each
(by `PYTHONPATH`) behind the instant server, against that server spawned directly, in
interleaved rounds (the order rotated each round), for both host eras as benchmark 12
opens them.  Per tree and era: the median of each round's time to the `tools/list`
answer minus the direct server's in the same round, and the proxy's CPU to that answer;
then the first `tools/call`'s own time, sent at once after the listing and 0.2 s later.

    .venv/bin/python benchmarks/ab_startup.py BEFORE_SRC AFTER_SRC [--rounds 11]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import cpu_seconds
from bench_startup import Host, _setup_instant


def _host(command: list[str], cwd: Path, source: str | None) -> Host:
    """A `Host` over `command`, with `source` first on the proxy's `PYTHONPATH`."""
    environment = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp")}
    if source is not None:
        environment["PYTHONPATH"] = source
    host = Host.__new__(Host)
    host.began = time.perf_counter()
    host.process = subprocess.Popen(
        command, cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, env=environment,
    )  # fmt: skip
    host.next_id = 0
    return host


def _ready(host: Host, era_2026: bool) -> float:
    try:
        seconds, _ = host.ready_2026() if era_2026 else host.ready()
        return seconds
    finally:
        host.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("before", help="the first tree's src directory")
    parser.add_argument("after", help="the second tree's src directory")
    parser.add_argument("--rounds", type=int, default=11)
    options = parser.parse_args()
    trees = {"before": options.before, "after": options.after}
    with tempfile.TemporaryDirectory(prefix="agentrt-ab-startup-") as directory:
        root = Path(directory)
        server, configs = None, {}
        for name in trees:
            server, configs[name] = _setup_instant(root / name)
        assert server is not None
        proxy = {
            name: [sys.executable, "-m", "agentrt.proxy", "--config", str(config)]
            for name, config in configs.items()
        }
        for name, source in trees.items():  # each first start creates its database
            _ready(_host(proxy[name], root / name, source), era_2026=False)
        for era_2026 in (False, True):
            deltas: dict[str, list[float]] = {name: [] for name in trees}
            cpu: dict[str, list[float]] = {name: [] for name in trees}
            direct: list[float] = []
            order = ["direct", *trees]
            for round_index in range(options.rounds):
                turn = order[round_index % 3 :] + order[: round_index % 3]
                seconds: dict[str, float] = {}
                for name in turn:
                    if name == "direct":
                        seconds[name] = _ready(_host(server, root, None), era_2026=False)
                        continue
                    host = _host(proxy[name], root / name, trees[name])
                    try:
                        seconds[name], _ = host.ready_2026() if era_2026 else host.ready()
                        cpu[name].append(cpu_seconds(host.process.pid))
                    finally:
                        host.close()
                direct.append(seconds["direct"])
                for name in trees:
                    deltas[name].append(seconds[name] - seconds["direct"])
            era = "2026-07-28 host" if era_2026 else "handshake-era host"
            print(f"{era}: direct p50 {statistics.median(direct):.3f} s")
            for name, source in trees.items():
                print(
                    f"  {name:6} {source}: +{statistics.median(deltas[name]):.3f} s "
                    f"(CPU to ready {statistics.median(cpu[name]):.3f} s)  "
                    f"deltas {' '.join(f'{value:+.3f}' for value in deltas[name])}"
                )
        _first_calls(proxy, root, trees, options.rounds)


def _first_calls(
    proxy: dict[str, list[str]], root: Path, trees: dict[str, str], rounds: int
) -> None:
    """The median time of the first call (handshake era), sent `pause` after the listing:
    at once it may find the call path still to import (decision 0066)."""
    for pause in (0.0, 0.2):
        seconds: dict[str, list[float]] = {name: [] for name in trees}
        for round_index in range(rounds):
            names = list(trees) if round_index % 2 == 0 else list(reversed(trees))
            for name in names:
                host = _host(proxy[name], root / name, trees[name])
                try:
                    host.ready()
                    time.sleep(pause)
                    began = time.perf_counter()
                    answer = host.request(
                        "tools/call", {"name": "instant_echo", "arguments": {"text": "x"}}
                    )
                    seconds[name].append(time.perf_counter() - began)
                    if answer.get("isError"):
                        raise RuntimeError(f"the first call failed: {answer}")
                finally:
                    host.close()
        medians = "  ".join(
            f"{name} {statistics.median(values) * 1000:.1f} ms" for name, values in seconds.items()
        )
        print(f"first call, {pause:.1f} s after the listing: {medians}")


if __name__ == "__main__":
    main()
