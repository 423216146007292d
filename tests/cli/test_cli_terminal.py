"""The installed `agentrt` as a real process: at a real terminal (a pty), and without one."""

from __future__ import annotations

import os
import pty
import select
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_support import Produced

from agentrt.canonical import parse_json
from agentrt.store import ApprovalStatus, approval_hash, open_store

AGENTRT = Path(sys.executable).with_name("agentrt")


class Terminal:
    """`agentrt` running with a pseudo-terminal as its standard input, output and error."""

    def __init__(self, *args: str) -> None:
        self.primary, secondary = pty.openpty()
        self.process = subprocess.Popen(
            [str(AGENTRT), *args],
            stdin=secondary,
            stdout=secondary,
            stderr=secondary,
            close_fds=True,
            env={**os.environ, "TERM": "dumb", "COLUMNS": "200"},
        )
        os.close(secondary)
        self.seen = b""

    def read_until(self, text: bytes, timeout: float = 20.0) -> bytes:
        deadline = time.monotonic() + timeout
        while text not in self.seen:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"never saw {text!r}; saw {self.seen!r}"
            ready, _, _ = select.select([self.primary], [], [], remaining)
            if ready:
                try:
                    chunk = os.read(self.primary, 4096)
                except OSError:
                    chunk = b""
                assert chunk, f"the terminal closed before {text!r}; saw {self.seen!r}"
                self.seen += chunk
        return self.seen

    def answer(self, text: str) -> None:
        os.write(self.primary, text.encode())

    def finish(self, timeout: float = 20.0) -> int:
        code = self.process.wait(timeout=timeout)
        try:
            while chunk := os.read(self.primary, 4096):
                self.seen += chunk
        except OSError:
            pass
        os.close(self.primary)
        return code


def _status(produced: Produced) -> ApprovalStatus:
    with open_store(produced.database, read_only=True, create=False) as store:
        return store.get_approval(produced.approval_id).status


@pytest.mark.timeout(60)
def test_approve_at_a_terminal_asks_and_records_a_yes(produced: Produced) -> None:
    terminal = Terminal("--db", str(produced.database), "approve", produced.waiting_run)
    terminal.read_until(f"Approve approval {produced.approval_id}? [y/N]: ".encode())
    terminal.answer("y\n")
    assert terminal.finish() == 0, terminal.seen
    assert f"approved {produced.approval_id}".encode() in terminal.seen
    assert _status(produced) is ApprovalStatus.APPROVED


@pytest.mark.timeout(60)
def test_answering_no_at_the_terminal_decides_nothing(produced: Produced) -> None:
    terminal = Terminal("--db", str(produced.database), "reject", produced.waiting_run)
    terminal.read_until(b"[y/N]: ")
    terminal.answer("n\n")
    assert terminal.finish() == 1
    assert _status(produced) is ApprovalStatus.PENDING


@pytest.mark.timeout(60)
def test_a_request_replaced_while_the_operator_reads_it_is_refused(produced: Produced) -> None:
    terminal = Terminal("--db", str(produced.database), "approve", produced.waiting_run)
    terminal.read_until(b"[y/N]: ")
    # While the operator reads, someone rewrites the request and, to pass the
    # tamper check, its stored hash too: only the hash of what was printed catches it.
    with sqlite3.connect(produced.database) as connection:
        kind, capability, presentation, tool = connection.execute(
            "SELECT kind, capability, presentation, tool FROM approvals WHERE approval_id = ?",
            (produced.approval_id,),
        ).fetchone()
        swapped_args = '{"path": "done.txt", "content": "rm -rf ~\\n"}'
        connection.execute(
            "UPDATE approvals SET args = ?, approval_hash = ? WHERE approval_id = ?",
            (
                swapped_args,
                approval_hash(
                    kind, parse_json(capability), parse_json(presentation), tool, swapped_args
                ),
                produced.approval_id,
            ),
        )
    terminal.answer("y\n")
    assert terminal.finish() == 1, terminal.seen
    assert b"is not the request that was shown" in terminal.seen
    assert _status(produced) is ApprovalStatus.PENDING


@pytest.mark.timeout(60)
def test_installed_command_without_a_terminal_refuses_to_approve(produced: Produced) -> None:
    completed = subprocess.run(
        [str(AGENTRT), "--db", str(produced.database), "approve", produced.waiting_run],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert completed.returncode == 1
    assert completed.stderr.startswith("agentrt: no terminal to ask at")
    assert produced.approval_id in completed.stdout
    assert _status(produced) is ApprovalStatus.PENDING


@pytest.mark.timeout(60)
def test_installed_command_verifies_and_refuses_a_world_writable_copy(
    tmp_path: Path, produced: Produced
) -> None:
    ok = subprocess.run(
        [str(AGENTRT), "--db", str(produced.database), "verify"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("intact: ")
    shared = tmp_path / "shared.db"
    shared.write_bytes(produced.database.read_bytes())
    os.chmod(shared, 0o666)
    refused = subprocess.run(
        [str(AGENTRT), "--json", "verify"],
        capture_output=True, text=True, timeout=30,
        env={**os.environ, "AGENTRT_DB": str(shared)},
    )  # fmt: skip
    assert refused.returncode == 2
    assert refused.stdout == ""
    assert refused.stderr.count("\n") == 1 and "writable by group or others" in refused.stderr
