"""Fixtures for the operator command's tests: a produced database and an in-process runner."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_support import Produced, produce
from click.testing import CliRunner, Result

from agentrt.cli import cli


@pytest.fixture
def produced(tmp_path: Path) -> Produced:
    return produce(tmp_path / "runs.db", tmp_path / "sandbox")


@pytest.fixture
def run_cli(produced: Produced):  # type: ignore[no-untyped-def]
    """Invoke `agentrt --db <produced> ...` in-process; standard input is not a terminal."""

    def invoke(*args: str, database: Path | None = None, input: str | None = None) -> Result:
        runner = CliRunner()
        path = database if database is not None else produced.database
        return runner.invoke(cli, ["--db", str(path), *args], input=input)

    return invoke
