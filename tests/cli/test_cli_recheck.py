"""`agentrt recheck` and the library `recheck`: recorded decisions replayed through a policy
as it is now, over a real SQLite file, with the command as a real subprocess."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from agentrt import Gate, Outcome, PolicyDecision, RunView, ToolRequest, open_store
from agentrt.agent import Decision
from agentrt.proxy._calls import proxy_policy
from agentrt.proxy.config import load_config
from agentrt.recheck import recheck
from agentrt.tools import SideEffect, ToolCall, ToolResult, ToolSpec

AGENTRT = Path(sys.executable).with_name("agentrt")

pytestmark = pytest.mark.timeout(120)


class Write:
    """A local tool the gate runs; the recheck must never run it."""

    def __init__(self, name: str) -> None:
        self.calls = 0
        self._spec = ToolSpec(
            name, "write", {"type": "object"}, SideEffect.LOCAL_MUTATION, 5.0, terminal=True
        )

    @property
    def spec(self) -> ToolSpec:
        return self._spec

    async def call(self, call: ToolCall) -> ToolResult:
        self.calls += 1
        return ToolResult('"written"')


def _config(directory: Path, when: list[dict[str, Any]] | None, policy: str) -> Path:
    rule: dict[str, Any] = {"side_effect": "local_mutation"}
    if when is not None:
        rule["when"] = when
    document = {
        "database": "proxy.db",
        "session": "sess",
        "policy": {"read_only": "allow", "local_mutation": policy},
        "servers": [
            {"name": "srv", "command": ["true"], "manifest": "m.json", "rules": {"write": rule}}
        ],
    }
    path = directory / "proxy.json"
    path.write_text(json.dumps(document))
    path.chmod(0o600)
    return path


def _record(config_path: Path, calls: list[tuple[str, dict[str, Any]]]) -> None:
    """Run each (session, arguments) call through a gate under the configuration's policy."""

    async def scenario() -> None:
        config = load_config(config_path)
        with open_store(config.database) as store:
            gate = Gate(store, [Write("srv_write")], policy=proxy_policy(config, store))
            for position, (session, arguments) in enumerate(calls):
                run_id = f"{session}.{position}"
                await gate.start("call", run_id=run_id, metadata={"proxy_session": session})
                await gate.step(run_id, Decision.tool_call("srv_write", json.dumps(arguments)))

    anyio.run(scenario)


def _digests(directory: Path) -> dict[str, str]:
    """Every file's digest, but SQLite's shared-memory index, which a read-only reader of a
    WAL database may create; a write-ahead log must hold no frame (be empty) if present."""
    digests = {}
    for path in sorted(directory.iterdir()):
        if path.name.endswith("-shm"):
            continue
        if path.name.endswith("-wal"):
            assert path.stat().st_size == 0, "the recheck wrote to the write-ahead log"
            continue
        digests[path.name] = hashlib.sha256(path.read_bytes()).hexdigest()
    return digests


def test_recheck_names_the_denied_call_that_would_now_run_and_only_that_session(
    tmp_path: Path,
) -> None:
    config_path = _config(
        tmp_path, [{"if": "args.n > 10", "outcome": "deny", "reason": "too many"}], "allow"
    )
    _record(config_path, [("sess", {"n": 11}), ("sess", {"n": 2}), ("other", {"n": 12})])
    _config(tmp_path, None, "allow")
    before = _digests(tmp_path)
    finished = subprocess.run(
        [str(AGENTRT), "recheck", "--config", str(config_path)],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert finished.returncode == 0, finished.stderr
    lines = finished.stdout.splitlines()
    assert lines == [
        "run sess.0 step 1 srv_write: was denied, would run (local_mutation is allowed)",
        "1 of 2 recorded decisions would differ",
    ]
    other = subprocess.run(
        [str(AGENTRT), "recheck", "--config", str(config_path), "--session", "other", "--json"],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    records = [json.loads(line) for line in other.stdout.splitlines()]
    assert [record["run_id"] for record in records if record["record"] == "difference"] == [
        "other.2"
    ]
    assert _digests(tmp_path) == before


def test_recheck_of_a_missing_database_is_refused_and_creates_nothing(tmp_path: Path) -> None:
    config_path = _config(tmp_path, None, "allow")
    finished = subprocess.run(
        [str(AGENTRT), "recheck", "--config", str(config_path)],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert finished.returncode == 2
    assert finished.stderr.startswith("agentrt: ")
    assert not (tmp_path / "proxy.db").exists()


class Versioned:
    """A library policy that declares its identity."""

    def __init__(self, id: str, outcome: Outcome) -> None:
        self.id = id
        self.outcome = outcome

    async def evaluate(self, request: ToolRequest, run: RunView) -> PolicyDecision:
        if self.outcome is Outcome.DENY:
            return PolicyDecision.deny("v2 denies writes")
        return PolicyDecision.allow("v1 allows writes")


def test_library_recheck_replays_through_a_declared_policy_without_running_anything(
    tmp_path: Path,
) -> None:
    tool = Write("write")

    async def scenario() -> Any:
        with open_store(tmp_path / "lib.db") as store:
            gate = Gate(store, [tool], policy=Versioned("v1", Outcome.ALLOW))
            await gate.start("call", run_id="r1")
            await gate.step("r1", Decision.tool_call("write", "{}"))
            decided = [e.payload for e in store.list_events("r1") if e.type == "policy_decided"]
            result = await recheck(store, Versioned("v2", Outcome.DENY), [tool.spec])
            return decided, result

    decided, result = anyio.run(scenario)
    assert decided[0]["policy_id"] == "v1"
    assert tool.calls == 1
    assert result.checked == 1
    [difference] = result.differences
    assert (difference.was, difference.would) == (Outcome.ALLOW, Outcome.DENY)
    assert (difference.was_policy_id, difference.would_policy_id) == ("v1", "v2")
