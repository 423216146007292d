"""`agentrt proxy` as a real process in front of a real stdio server, and an approval
decided with `agentrt approve` while a host waits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

AGENTRT = Path(sys.executable).with_name("agentrt")
SERVER_SCRIPT = Path(__file__).with_name("cli_mcp_server.py")

pytestmark = pytest.mark.timeout(120)


class Host:
    """A minimal MCP host: newline-delimited JSON-RPC over the proxy's stdin and stdout."""

    def __init__(self, config: Path) -> None:
        self.process = subprocess.Popen(
            [str(AGENTRT), "proxy", "--config", str(config)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.next_id = 0

    def request(self, method: str, params: dict[str, Any]) -> Any:
        assert self.process.stdin and self.process.stdout
        self.next_id += 1
        message = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()
        while True:
            line = self.process.stdout.readline()
            assert line, self.process.stderr.read() if self.process.stderr else ""
            answer = json.loads(line)
            if answer.get("id") == self.next_id:
                return answer["result"]

    def notify(self, method: str) -> None:
        assert self.process.stdin
        self.process.stdin.write(json.dumps({"jsonrpc": "2.0", "method": method}) + "\n")
        self.process.stdin.flush()

    def close(self) -> tuple[int, str]:
        assert self.process.stdin and self.process.stderr
        self.process.stdin.close()
        try:
            code = self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        return code, self.process.stderr.read()


def agentrt(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(AGENTRT), *args], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
    )


def test_a_call_held_by_the_proxy_runs_once_approved_with_the_command(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    config = tmp_path / "proxy.json"
    config.write_text(
        json.dumps(
            {
                "database": "runs.db",
                "session": "cli",
                "hold": "100ms",
                "policy": {"read_only": "allow", "local_mutation": "require_approval"},
                "servers": [
                    {
                        "name": "things",
                        "command": [sys.executable, str(SERVER_SCRIPT), str(marks)],
                        "manifest": "things.manifest.json",
                        "connect_timeout": "60s",
                        "rules": {
                            "write_thing": {
                                "side_effect": "local_mutation",
                                "timeout": "5s",
                                "allow_hint_mismatch": True,
                            }
                        },
                    }
                ],
            }
        )
    )
    os.chmod(config, 0o600)
    database = tmp_path / "runs.db"
    pinned = agentrt("pin", "--config", str(config))
    assert pinned.returncode == 0, pinned.stderr

    host = Host(config)
    try:
        host.request(
            "initialize",
            {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "cli-test-host", "version": "1"},
            },
        )
        host.notify("notifications/initialized")
        names = [tool["name"] for tool in host.request("tools/list", {})["tools"]]
        assert "things_write_thing" in names
        call = {"name": "things_write_thing", "arguments": {"id": "a", "text": "hello"}}
        first = host.request("tools/call", call)
        assert first["content"][0]["text"].startswith("PENDING_APPROVAL")
        assert not (marks / "calls").exists()

        listing = [
            json.loads(line)
            for line in agentrt("--db", str(database), "--json", "runs").stdout.splitlines()
        ]
        waiting = [
            record for record in listing if record["record"] == "run" and record["waiting_approval"]
        ]
        assert len(waiting) == 1
        run_id, approval_id = waiting[0]["run_id"], waiting[0]["waiting_approval"]
        approved = agentrt("--db", str(database), "approve", run_id, "--approval", approval_id)
        assert approved.returncode == 0, approved.stderr

        second = host.request("tools/call", call)
        for _ in range(20):
            # A host told IN_PROGRESS calls again; anything else is the answer.
            if not second["content"][0]["text"].startswith("IN_PROGRESS"):
                break
            time.sleep(0.25)
            second = host.request("tools/call", call)
        assert second.get("isError") is not True, second
        assert second["content"][0]["text"] == "done", second
        calls = (marks / "calls").read_text().splitlines()
        assert [json.loads(line)["arguments"] for line in calls] == [{"id": "a", "text": "hello"}]
    except Exception as failure:
        # What the proxy logged is what explains a failure here; keep it.
        _, stderr = host.close()
        raise AssertionError(f"{failure!r}\n--- proxy stderr ---\n{stderr}") from failure
    code, stderr = host.close()
    assert code == 0, stderr
    # The line the proxy writes for the operator is the command that decided it.
    assert f"agentrt --db {database} approve {run_id} --approval {approval_id}" in stderr
    verified = agentrt("--db", str(database), "verify")
    assert verified.returncode == 0 and verified.stdout.startswith("intact: ")
