"""A run's principal (issue 35) in every view of the trail: `runs`, `show`, `events`, the
export and the inbox's approval card; and nowhere for a run without one."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
from cli_support import POLICY, WriteNote
from click.testing import CliRunner

from agentrt import Decision
from agentrt.cli import cli
from agentrt.export import export_line
from agentrt.gate import Gate
from agentrt.inbox._views import approval_view
from agentrt.principals import Principal
from agentrt.store import open_store

ALICE = Principal(
    issuer="https://id.example/", subject="alice", client_id="claude-code",
    jti="jti-1", scopes=("mcp:tools",), groups=("release",),
)  # fmt: skip


def _database(tmp_path: Path) -> tuple[Path, str, str]:
    """A run waiting for approval with a principal, and one without."""
    database = tmp_path / "runs.db"
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir()

    async def produce() -> tuple[str, str]:
        store = open_store(database)
        try:
            gate = Gate(store, [WriteNote(sandbox)], policy=POLICY)
            asked = await gate.start("for alice", principal=ALICE)
            await gate.step(asked, Decision.tool_call("write_note", '{"path":"a","content":"x"}'))
            plain = await gate.start("for nobody")
            await gate.step(plain, Decision.complete("done"))
            return asked, plain
        finally:
            store.close()

    asked, plain = anyio.run(produce)
    return database, asked, plain


def _cli(database: Path, *args: str) -> str:
    result = CliRunner().invoke(cli, ["--db", str(database), *args])
    assert result.exit_code == 0, result.output
    return result.output


def test_runs_show_and_events_show_the_principal(tmp_path: Path) -> None:
    database, asked, plain = _database(tmp_path)
    listing = _cli(database, "runs").splitlines()
    assert listing[0].split()[:3] == ["RUN", "PRINCIPAL", "STATUS"]
    row_of = {line.split()[0]: line for line in listing[1:] if line.strip()}
    assert "alice via claude-code" in row_of[asked]
    assert row_of[plain].split()[1] == "-"
    records = [json.loads(line) for line in _cli(database, "--json", "runs").splitlines()]
    by_run = {record.get("run_id"): record for record in records}
    assert by_run[asked]["principal"]["subject"] == "alice"
    assert "principal" not in by_run[plain]
    shown = _cli(database, "show", asked)
    for expected in ("alice", "https://id.example/", "claude-code", "jti-1", "release"):
        assert expected in shown
    assert "principal" not in _cli(database, "show", plain)
    shown_json = [json.loads(line) for line in _cli(database, "--json", "show", asked).splitlines()]
    assert shown_json[0]["principal"]["client_id"] == "claude-code"
    events = _cli(database, "events", asked)
    assert "principal=" in events.splitlines()[0]


def test_a_database_without_principals_lists_runs_as_before(tmp_path: Path) -> None:
    database, _asked, plain = _database(tmp_path)
    with open_store(database) as store:
        assert store.principal_of_run(plain) is None
    # A page with no run that has a principal keeps its old columns.
    listing = _cli(database, "runs", "--offset", "1").splitlines()
    assert listing[0].split()[:2] == ["RUN", "STATUS"]


def test_the_export_and_the_inbox_show_the_principal(tmp_path: Path) -> None:
    database, asked, _plain = _database(tmp_path)
    with open_store(database) as store:
        started = store.list_events(asked)[0]
        line = json.loads(export_line(started))
        approval = store.waiting_approval(asked)
        assert approval is not None
        card = approval_view(store, approval, {})
    assert line["type"] == "run_started"
    assert line["payload"]["principal"]["subject"] == "alice"
    assert card["principal"] == "alice via claude-code"
