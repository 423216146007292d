"""What an allowed proxied call costs the disk: two commits, both writing, and no third.

The index row, the run, the step, the decision and the `executing` mark go in
the first commit; the result, the run's end and the row's settlement in the
second (ADR 0002).  The settlement clears the call's hold in that same commit,
so the proxy then only stops renewing it: a release written after it would be
a third transaction that changes nothing.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from proxy_helpers import RawHost, build_setup

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

# The benchmark's own counting proxy ("commits per proxied call"), so both count alike.
COUNTING = Path(__file__).resolve().parents[2] / "benchmarks" / "_traced_proxy.py"


def _totals(count_file: Path) -> tuple[int, int]:
    commits, writing = count_file.read_text().split()
    return int(commits), int(writing)


def _text(response: dict[str, Any]) -> str:
    return "".join(block.get("text", "") for block in response["result"]["content"])


async def test_an_allowed_proxied_call_makes_two_writing_commits_and_no_other(
    tmp_path: Path,
) -> None:
    setup = await build_setup(tmp_path)
    count_file = tmp_path / "commits"
    environment = setup.environment()
    setup.environment = lambda: {**environment, "BENCH_COMMIT_COUNT": str(count_file)}  # type: ignore[method-assign]
    setup.command = lambda: [  # type: ignore[method-assign]
        sys.executable, str(COUNTING), "--config", str(setup.config_path),
    ]  # fmt: skip
    async with RawHost.start(setup) as raw:
        # The first call of each tool after start-up may repair or migrate; count
        # from a settled state.
        first = await raw.request("tools/call", {"name": "up_echo", "arguments": {"text": "a"}})
        assert _text(first) == "a"
        for tool, arguments, expected in [
            ("up_echo", {"text": "b"}, "b"),
            ("up_write_note", {"note": "n1"}, "noted n1"),
            ("up_echo", {"text": "c"}, "c"),
        ]:
            before = _totals(count_file)
            response = await raw.request("tools/call", {"name": tool, "arguments": arguments})
            assert response["result"].get("isError") is not True, response
            assert _text(response) == expected
            after = _totals(count_file)
            assert (after[0] - before[0], after[1] - before[1]) == (2, 2), (tool, before, after)
    notes = setup.upstream_log.read_text().splitlines()
    assert [line for line in notes if line.startswith("write_note")] == ["write_note n1"]
