"""A real store with runs waiting for approval, written by the real Gate."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from core.helpers import RecordingTool, approval_policy

from agentrt import Decision, Gate, Limits, SideEffect, Store

SECRET = b"0123456789abcdef0123456789abcdef-test-secret"


@dataclass(frozen=True)
class Waiting:
    """A run waiting on one approval: its ids and the hash it was shown under."""

    run_id: str
    approval_id: str
    approval_hash: str


async def waiting_run(
    store: Store, *, content: str = "hello", approval_ttl: float | None = None
) -> Waiting:
    """Start a run and ask for one write, which the policy holds for approval."""
    write = RecordingTool("write", SideEffect.LOCAL_MUTATION)
    limits = Limits(approval_ttl=approval_ttl) if approval_ttl is not None else None
    gate = Gate(store, [write], policy=approval_policy(), limits=limits, owner="test")
    run_id = await gate.start("write a note")
    outcome = await gate.step(
        run_id,
        Decision.tool_call("write", json.dumps({"path": "notes.txt", "content": content})),
    )
    assert outcome.approval is not None
    return Waiting(run_id, outcome.approval.approval_id, outcome.approval.approval_hash)


def secret_file(
    directory: Path, secret: bytes = SECRET, mode: int = 0o600, name: str = "approver.secret"
) -> Path:
    """The secret written as an operator would (with a trailing newline), `mode` its mode."""
    path = directory / name
    path.write_bytes(secret + b"\n")
    os.chmod(path, mode)
    return path
