"""`agentrt approve` and `agentrt inbox` with no arguments: the database of the configuration
`agentrt init` wrote (or AGENTRT_DB), what waits listed, and decided at a real terminal."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_support import Produced

from agentrt.store import ApprovalStatus, open_store

AGENTRT = Path(sys.executable).with_name("agentrt")

pytestmark = pytest.mark.timeout(60)


def _environment(config_home: Path, **extra: str) -> dict[str, str]:
    environment = {k: v for k, v in os.environ.items() if k != "AGENTRT_DB"}
    return {**environment, "XDG_CONFIG_HOME": str(config_home), "TERM": "dumb", **extra}


def _init_wrote(config_home: Path, database: Path | str) -> Path:
    """A configuration where `agentrt init` writes it, naming `database`."""
    directory = config_home / "agentrt"
    directory.mkdir(parents=True, mode=0o700)
    document = {
        "database": str(database),
        "session": "desk",
        "servers": [
            {
                "name": "notes",
                "command": ["node", "server.js"],
                "manifest": "notes.manifest.json",
                "rules": {"write_note": {"side_effect": "local_mutation"}},
            }
        ],
    }
    path = directory / "proxy.json"
    path.write_text(json.dumps(document))
    path.chmod(0o600)
    return path


def _status(produced: Produced) -> ApprovalStatus:
    with open_store(produced.database, read_only=True, create=False) as store:
        return store.get_approval(produced.approval_id).status


class _Terminal:
    """`agentrt` with a pseudo-terminal as its standard input, output and error."""

    def __init__(self, environment: dict[str, str], *args: str) -> None:
        self.primary, secondary = pty.openpty()
        self.process = subprocess.Popen(
            [str(AGENTRT), *args], stdin=secondary, stdout=secondary, stderr=secondary,
            close_fds=True, env=environment,
        )  # fmt: skip
        os.close(secondary)
        self.seen = b""

    def read_until(self, text: bytes, timeout: float = 20.0) -> None:
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


def test_approve_with_no_arguments_finds_the_database_init_wrote_and_decides_at_a_terminal(
    produced: Produced, tmp_path: Path
) -> None:
    config_home = tmp_path / "config"
    _init_wrote(config_home, produced.database)
    terminal = _Terminal(_environment(config_home), "approve")
    terminal.read_until(f"1. approval {produced.approval_id}: write_note".encode())
    terminal.read_until(b"approve, reject or skip?")
    terminal.answer("a\n")
    terminal.read_until(f"Approve approval {produced.approval_id}? [y/N]: ".encode())
    terminal.answer("y\n")
    assert terminal.finish() == 0, terminal.seen
    assert f"approved {produced.approval_id}".encode() in terminal.seen
    assert _status(produced) is ApprovalStatus.APPROVED


def test_approve_with_no_arguments_and_no_terminal_lists_and_names_the_command(
    produced: Produced, tmp_path: Path
) -> None:
    listed = subprocess.run(
        [str(AGENTRT), "approve"], capture_output=True, text=True, timeout=30,
        env=_environment(tmp_path / "empty", AGENTRT_DB=str(produced.database)),
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert listed.returncode == 1
    assert f"1. approval {produced.approval_id}: write_note" in listed.stdout
    assert "name one: agentrt approve RUN --approval ID" in listed.stderr
    assert _status(produced) is ApprovalStatus.PENDING


def test_with_no_database_anywhere_the_command_says_how_to_give_one(tmp_path: Path) -> None:
    result = subprocess.run(
        [str(AGENTRT), "approve"], capture_output=True, text=True, timeout=30,
        env=_environment(tmp_path / "empty"), stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert result.returncode == 2
    assert "pass --db PATH, set AGENTRT_DB, or run agentrt init" in result.stderr


def test_a_configuration_others_can_write_is_refused_not_followed(
    produced: Produced, tmp_path: Path
) -> None:
    config_home = tmp_path / "config"
    _init_wrote(config_home, produced.database).chmod(0o666)
    result = subprocess.run(
        [str(AGENTRT), "approve"], capture_output=True, text=True, timeout=30,
        env=_environment(config_home), stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert result.returncode == 2
    assert "the configuration agentrt init wrote cannot be read" in result.stderr
    assert _status(produced) is ApprovalStatus.PENDING


def test_inbox_with_no_arguments_serves_the_database_init_wrote(
    produced: Produced, tmp_path: Path
) -> None:
    config_home = tmp_path / "config"
    _init_wrote(config_home, produced.database)
    environment = _environment(config_home)
    process = subprocess.Popen(
        [str(AGENTRT), "inbox", "--listen", "127.0.0.1:0"], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env=environment,
    )  # fmt: skip
    try:
        assert process.stdout is not None and process.stderr is not None
        first = process.stdout.readline()
        serving = process.stderr.readline()
    finally:
        process.terminate()
        process.wait(timeout=20)
    assert first.startswith("inbox: http://127.0.0.1:")
    assert f"serving {produced.database}" in serving
