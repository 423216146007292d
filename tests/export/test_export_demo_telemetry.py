"""`agentrt demo` with the standard OTLP variables: its spans reach a real receiver."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest
from export_support import AGENTRT
from otlp_receiver import otlp_receiver

from agentrt.demo import _SANDBOX_README, summary_of
from agentrt.store import open_store

DEMO_SERVER = (
    Path(__file__).parents[2]
    / "examples/filesystem/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js"
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(180),
    pytest.mark.skipif(
        shutil.which("node") is None or not DEMO_SERVER.exists(),
        reason="the demo's filesystem server is not installed (make demo installs it)",
    ),
]


def _demo(state: Path, endpoint: str) -> subprocess.CompletedProcess[str]:
    environment = {
        **os.environ,
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_SERVICE_NAME": "demo-under-test",
    }
    return subprocess.run(
        [str(AGENTRT), "demo", "--state-dir", str(state)],
        capture_output=True,
        text=True,
        timeout=150,
        stdin=subprocess.DEVNULL,
        env=environment,
    )


def test_the_demo_delivers_spans_for_its_run_steps_and_approval_wait(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with otlp_receiver() as receiver:
        finished = _demo(state, receiver.url)
        spans = receiver.snapshot()
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert f"telemetry: spans of this run go to {receiver.url}/v1/traces" in finished.stdout
    with open_store(state / "agentrt.db", read_only=True) as store:
        (run,) = store.list_runs()
    (root,) = [span for span in spans if span.name == "invoke_agent agentrt"]
    assert root.attributes["agentrt.run.id"] == run.run_id
    assert root.attributes["agentrt.outcome"] == "completed"
    assert {span.service_name for span in spans} == {"demo-under-test"}
    assert {span.trace_id for span in spans} == {root.trace_id}
    steps = [span for span in spans if span.parent_span_id == root.span_id]
    assert {step.name for step in steps} == {"step fs_read_text_file", "step fs_write_file"}
    (write,) = [step for step in steps if step.name == "step fs_write_file"]
    assert write.attributes["agentrt.side_effect"] == "local_mutation"
    (wait,) = [span for span in spans if span.name == "agentrt.approval_wait"]
    assert wait.parent_span_id == write.span_id
    assert wait.attributes["agentrt.outcome"] == "granted"
    tools = [s for s in spans if s.attributes.get("gen_ai.operation.name") == "execute_tool"]
    assert {tool.attributes["gen_ai.tool.name"] for tool in tools} == {
        "fs_read_text_file",
        "fs_write_file",
    }
    # Neither the file the agent read nor the one it wrote is in any span.
    texts = [line for line in _SANDBOX_README.splitlines() if len(line) > 12]
    texts += [line for line in summary_of(_SANDBOX_README).splitlines() if len(line) > 12]
    for span in spans:
        for value in [span.name, *map(str, span.attributes.values())]:
            for text in texts:
                assert text not in value, (span.name, text)


def test_the_demo_completes_with_a_dead_endpoint(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{probe.getsockname()[1]}"
    finished = _demo(tmp_path / "state", dead)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert "chain intact" in finished.stdout
    assert "could not be sent" in finished.stderr and "runs are not affected" in finished.stderr
