"""The official MCP conformance suite's client `auth/*` scenarios against agentrt's upstream
client (`clients/conformance_client.py`: it connects as `agentrt pin`/`check` do and runs
`agentrt login`'s flow when the server asks for one).

Every scenario passes except those in `CANNOT_PASS` (and `CANNOT_PASS_IN` the installed
version), each with its reason (docs/oauth.md has the table).  The suite is the one
tests/npm-conformance installs, run by a Node installed beside it when there is one.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "tests/npm-conformance/node_modules/.bin/conformance"
CLIENT = Path(__file__).parent / "clients" / "conformance_client.py"
SIDE_BY_SIDE = 2
_PASSED = re.compile(r"^Passed: (\d+)/(\d+), (\d+) failed, (\d+) warnings", re.MULTILINE)

_ISSUER = (
    "the metadata names an issuer other than the one it was found for; the SDK refuses it "
    "(RFC 8414 section 3.3, the mix-up defence), and so does agentrt"
)
# Scenarios agentrt's client does not pass whatever the suite's version, and why.
CANNOT_PASS: dict[str, str] = {}
# And those of one version: 0.1.12 serves `http://host` as the issuer of the metadata of
# `http://host/tenant1`; 0.1.16's 2025-03-26 back-compat serves `http://host/oauth` at the
# origin's well-known path.
CANNOT_PASS_IN = {
    "0.1.12": {"auth/metadata-var2": _ISSUER, "auth/metadata-var3": _ISSUER},
    "0.1.16": {"auth/2025-03-26-oauth-metadata-backcompat": _ISSUER},
}


def _version() -> str:
    package = SUITE.parents[1] / "@modelcontextprotocol" / "conformance" / "package.json"
    return str(json.loads(package.read_text())["version"])


def _environment() -> dict[str, str]:
    """This environment with the suite's own `.bin` first on PATH: a Node installed beside
    the suite as an npm dependency (`node@22`) runs it instead of the system's."""
    return {**os.environ, "PATH": f"{SUITE.parent}{os.pathsep}{os.environ.get('PATH', '')}"}


def _scenarios() -> list[str]:
    listed = subprocess.run(
        [str(SUITE), "list"], capture_output=True, text=True, timeout=60, cwd=SUITE.parents[2],
        env=_environment(),
    )  # fmt: skip
    return sorted(set(re.findall(r"- (auth/[a-z0-9.-]+)", listed.stdout + listed.stderr)))


def _outcome(scenario: str) -> str:
    """How the suite's run of `scenario` against the client went: passed (no check failed,
    no warning) or failed."""
    finished = subprocess.run(
        [str(SUITE), "client", "--command", f"{sys.executable} {CLIENT}",
         "--scenario", scenario, "--timeout", "90000"],
        capture_output=True, text=True, timeout=150, cwd=SUITE.parents[2],
        stdin=subprocess.DEVNULL, env=_environment(),
    )  # fmt: skip
    counts = _PASSED.search(finished.stdout + finished.stderr)
    passed = (
        counts is not None
        and counts.group(3) == "0"
        and counts.group(4) == "0"
        and "OVERALL: PASSED" in finished.stdout + finished.stderr
    )
    return "passed" if passed else "failed"


def test_the_conformance_suites_auth_client_scenarios_pass_but_the_listed_ones() -> None:
    if not SUITE.exists():
        pytest.skip("the conformance suite is not installed (npm ci in tests/npm-conformance)")
    scenarios = _scenarios()
    assert len(scenarios) >= 15, scenarios
    # Each scenario is a suite process of its own with its own servers on ports of their
    # own, as `--suite auth` runs them side by side.  Two at a time keep two cores busy
    # (three took no less on this 2-core machine) without crowding the other worker.
    with ThreadPoolExecutor(max_workers=SIDE_BY_SIDE) as pool:
        outcomes = dict(zip(scenarios, pool.map(_outcome, scenarios), strict=True))
    cannot = CANNOT_PASS | CANNOT_PASS_IN.get(_version(), {})
    expected = {scenario: "failed" if scenario in cannot else "passed" for scenario in scenarios}
    assert outcomes == expected
