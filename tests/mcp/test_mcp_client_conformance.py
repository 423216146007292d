"""The official MCP conformance suite's client scenarios `initialize`, `tools_call`,
`elicitation-sep1034-client-defaults` and `sse-retry` against agentrt's upstream client
(the command in tests/oauth/clients/conformance_client.py: it connects as `agentrt pin`
and the proxy do, lists the tools and calls the first, a test host answering the
server's elicitation).  Every one passes with no failed check and no warning; the table
is in docs/proxy.md.  The suite is the one tests/npm-conformance installs, run by the
Node installed beside it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "tests/npm-conformance/node_modules/.bin/conformance"
CLIENT = ROOT / "tests/oauth/clients/conformance_client.py"
_PASSED = re.compile(r"^Passed: (\d+)/(\d+), (\d+) failed, (\d+) warnings", re.MULTILINE)

SCENARIOS = ("initialize", "tools_call", "elicitation-sep1034-client-defaults", "sse-retry")


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_conformance_suites_client_scenario_passes(scenario: str) -> None:
    if not SUITE.exists():
        pytest.skip("the conformance suite is not installed (npm ci in tests/npm-conformance)")
    environment = {**os.environ, "PATH": f"{SUITE.parent}{os.pathsep}{os.environ['PATH']}"}
    finished = subprocess.run(
        [str(SUITE), "client", "--command", f"{sys.executable} {CLIENT}",
         "--scenario", scenario, "--timeout", "60000"],
        capture_output=True, text=True, timeout=150, cwd=SUITE.parents[2],
        stdin=subprocess.DEVNULL, env=environment,
    )  # fmt: skip
    output = finished.stdout + finished.stderr
    counts = _PASSED.search(output)
    assert counts is not None, output[-2000:]
    assert (counts.group(3), counts.group(4)) == ("0", "0"), output[-2000:]
    assert int(counts.group(1)) >= 1
    assert "OVERALL: PASSED" in output
