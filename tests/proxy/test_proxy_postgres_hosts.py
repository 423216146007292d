"""Many machines, one queue and one trail: four proxy processes, each with its own upstream
and its own host, on one PostgreSQL database and one session.

Each proxy stands for a machine: its own configuration directory, its own
upstream server (and log of what that server executed), its own host
client.  Only the database is shared, as it would be across hosts.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, Final

import anyio
import pytest
from proxy_helpers import (
    AGENTRT,
    RULES,
    ProxySetup,
    RawHost,
    build_setup,
    host,
    proxy_pid_from_lease,
    text_of,
    until,
)

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.timeout(120)]

_SLOW_RULES: dict[str, Any] = {
    **RULES,
    "write_note": {"side_effect": "local_mutation", "timeout": "30s"},
}


async def _machines(root: Path, url: str, count: int = 4) -> list[ProxySetup]:
    return [
        await build_setup(root / f"machine-{number}", rules=_SLOW_RULES, database=url)
        for number in range(count)
    ]


def _executions(machines: list[ProxySetup]) -> list[str]:
    return [line for machine in machines for line in machine.executions()]


def _started(machines: list[ProxySetup]) -> list[str]:
    return [line for machine in machines for line in machine.started()]


def _verify(url: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(AGENTRT), "--db", url, "verify"], capture_output=True, text=True, cwd=cwd,
        check=False, timeout=60,
    )  # fmt: skip


async def test_the_same_write_sent_to_four_proxies_at_once_runs_once(
    tmp_path: Path, postgres_server: Any
) -> None:
    url = postgres_server.database()
    machines = await _machines(tmp_path, url)
    arguments = {"note": "once across machines", "seconds": 1.5}
    answers: list[str] = []
    async with AsyncExitStack() as stack:
        sessions = [await stack.enter_async_context(host(machine)) for machine in machines]

        async def call(session: Any) -> None:
            answers.append(text_of(await session.call_tool("up_write_note", arguments)))

        async with anyio.create_task_group() as group:
            for session in sessions:
                group.start_soon(call, session)
        retries = [
            text_of(await session.call_tool("up_write_note", arguments)) for session in sessions
        ]
    assert sorted(answer.split(":")[0] for answer in answers) == [
        "IN_PROGRESS", "IN_PROGRESS", "IN_PROGRESS", "noted once across machines",
    ]  # fmt: skip
    assert all(retry.startswith("DUPLICATE: ") for retry in retries), retries
    assert _executions(machines) == ["write_note once across machines"]
    verified = _verify(url, tmp_path)
    assert verified.returncode == 0 and "intact" in verified.stdout


async def test_an_approval_granted_on_another_machine_is_collected_by_whichever_proxy_is_called(
    tmp_path: Path, postgres_server: Any
) -> None:
    url = postgres_server.database()
    machines = await _machines(tmp_path, url)
    arguments = {"to": "team@example.org", "body": "deploy"}
    async with AsyncExitStack() as stack:
        sessions = [await stack.enter_async_context(host(machine)) for machine in machines]
        asked = text_of(await sessions[0].call_tool("up_send_mail", arguments))
        assert asked.startswith("PENDING_APPROVAL: ")
        # Asked again through another machine: the same waiting call, not a second one.
        again = text_of(await sessions[1].call_tool("up_send_mail", arguments))
        assert again.startswith("PENDING_APPROVAL: ")
        # The operator approves on a machine of their own: another process, another
        # working directory, only the database URL in common.
        operator = tmp_path / "operator"
        operator.mkdir()
        approved = subprocess.run(
            [*machines[0].operator_command("approve")[:1], "--db", url,
             *machines[0].operator_command("approve")[3:], "--yes"],
            capture_output=True, text=True, cwd=operator, check=False, timeout=60,
        )  # fmt: skip
        assert approved.returncode == 0, approved.stdout + approved.stderr
        collected = text_of(await sessions[2].call_tool("up_send_mail", arguments))
        assert collected == "sent to team@example.org"
        third = [
            text_of(await sessions[number].call_tool("up_send_mail", arguments))
            for number in (0, 3)
        ]
    assert all(answer.startswith("DUPLICATE: ") for answer in third), third
    # It ran once, on the machine whose proxy collected it.
    assert [machine.executions() for machine in machines] == [
        [], [], ["send_mail team@example.org"], [],
    ]  # fmt: skip
    assert len({command for machine in machines for command in machine.waiting_commands()}) == 1
    verified = _verify(url, operator)
    assert verified.returncode == 0 and "intact" in verified.stdout


async def test_proxies_killed_at_random_never_run_a_call_twice(
    tmp_path: Path, postgres_server: Any
) -> None:
    url = postgres_server.database()
    machines = await _machines(tmp_path, url)
    arguments = {"note": "survives kills", "seconds": 3}
    chosen = random.Random(os.getpid())
    async with AsyncExitStack() as stack:
        raws = [await stack.enter_async_context(RawHost.start(machine)) for machine in machines]
        for raw in raws:
            await raw.call("up_write_note", arguments)
        await until(lambda: len(_started(machines)) == 1)
        # The proxy executing the call dies, and with it one or two others at random.
        executing = proxy_pid_from_lease(url)
        victims = {executing} | {
            raw.process.pid for raw in chosen.sample(raws, chosen.randint(1, 2))
        }
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        for raw in raws:
            if raw.process.pid in victims:
                await raw.process.wait()
    # Holds and leases (2s) lapse with the dead; every machine's proxy is started
    # afresh and asked again: nothing runs a second time without an approval.
    await anyio.sleep(2.5)
    async with AsyncExitStack() as stack:
        sessions = [await stack.enter_async_context(host(machine)) for machine in machines]
        answers = [
            text_of(await session.call_tool("up_write_note", arguments)) for session in sessions
        ]
    assert len(_started(machines)) == 1, _started(machines)
    # The call may have taken effect: each proxy says so and waits for an approval.
    assert all(answer.startswith("INTERRUPTED: ") for answer in answers), answers
    assert len({command for machine in machines for command in machine.waiting_commands()}) == 1
    verified = _verify(url, tmp_path)
    assert verified.returncode == 0 and "intact" in verified.stdout


async def test_a_proxy_rides_out_a_database_restart_without_running_a_call_it_could_not_record(
    tmp_path: Path, private_postgres: Any
) -> None:
    url = private_postgres.database()
    (machine,) = await _machines(tmp_path, url, count=1)
    async with host(machine) as session:
        before = await session.call_tool("up_echo", {"text": "before"})
        private_postgres.halt()
        # While the database is down nothing can be recorded, so nothing runs.
        during = await session.call_tool("up_write_note", {"note": "while down"})
        private_postgres.start()
        after = await session.call_tool("up_write_note", {"note": "after"})
        again = await session.call_tool("up_echo", {"text": "again"})
    assert text_of(before) == "before" and text_of(again) == "again"
    # The model is told nothing ran (and no database is named to it); the operator's
    # log says why.
    assert during.is_error
    assert text_of(during) == "UNAVAILABLE: the gate could not complete this call. Nothing ran."
    assert "cannot be reached" in machine.stderr()
    assert text_of(after) == "noted after"
    assert machine.executions("write_note") == ["write_note after"]
    verified = _verify(url, tmp_path)
    assert verified.returncode == 0, verified.stdout + verified.stderr


async def test_a_call_whose_result_the_database_lost_is_not_called_in_progress_afterwards(
    tmp_path: Path, private_postgres: Any
) -> None:
    url = private_postgres.database()
    # A hold of 30 s, so nothing lapses during the test: only the proxy's own
    # knowledge can tell that nothing works on the call any more.
    machine = await build_setup(
        tmp_path / "machine", rules=_SLOW_RULES, database=url, lease_ttl="30s"
    )
    arguments = {"note": "cut", "seconds": 1.5}
    async with host(machine) as session:
        async with anyio.create_task_group() as group:
            answers: list[Any] = []

            async def call() -> None:
                answers.append(await session.call_tool("up_write_note", arguments))

            group.start_soon(call)
            await until(lambda: len(machine.started()) == 1)
            private_postgres.halt()  # the result's commit cannot be made
        private_postgres.start()
        again = await session.call_tool("up_write_note", arguments)
    (first,) = answers
    assert text_of(first).startswith("UNKNOWN_OUTCOME: "), text_of(first)
    # Not "already running": the proxy that ran it knows it ended, outcome unknown,
    # and a person decides whether it runs again.
    assert text_of(again).startswith("INTERRUPTED: "), text_of(again)
    assert machine.executions("write_note") == ["write_note cut"]


# A host whose clock is an hour slow: every `time.time` and `time.time_ns` of its
# proxy process, from before agentrt is imported.
_SLOW_CLOCK = """
import time
_time, _time_ns = time.time, time.time_ns
time.time = lambda: _time() - 3600.0
time.time_ns = lambda: _time_ns() - 3_600_000_000_000
"""


async def test_a_proxy_holding_a_call_judges_its_approvals_life_on_the_servers_clock(
    tmp_path: Path, postgres_server: Any
) -> None:
    # The approval lives 2 s on the database's clock; the proxy holds the call up to 8 s.
    # A proxy judging expiry on its own clock, an hour slow, would see ten minutes of
    # margin left and answer "still waiting" when the hold ends.
    machine = await build_setup(
        tmp_path / "machine", database=postgres_server.database(), approval_ttl="2s", hold="8s"
    )
    clock = tmp_path / "slow-clock"
    clock.mkdir()
    (clock / "sitecustomize.py").write_text(_SLOW_CLOCK)
    environment = machine.environment()
    machine.environment = lambda: {**environment, "PYTHONPATH": str(clock)}  # type: ignore[method-assign]
    async with host(machine) as session:
        began = anyio.current_time()
        answer = text_of(
            await session.call_tool("up_send_mail", {"to": "a@example.org", "body": "b"})
        )
        waited = anyio.current_time() - began
    assert answer.startswith("EXPIRED: "), answer
    assert 2.0 <= waited < 8.0, waited
    assert machine.executions() == []


@pytest.mark.parametrize("sessions", ["team", "each"])
async def test_four_proxies_write_and_read_at_once_into_one_verified_chain(
    tmp_path: Path, postgres_server: Any, sessions: str
) -> None:
    """Four machines' proxies, serving one team session (as docs/postgresql.md sets a team
    up) or a session each, their calls scoped writes that run beside one another on the
    database (decision 0065): forty writes and forty reads sent at once across them each
    run once, each answered with its own result, and the one chain they all extended
    verifies, its state with it."""
    url = postgres_server.database()
    machines = [
        await build_setup(
            tmp_path / f"machine-{number}",
            rules=_SLOW_RULES,
            database=url,
            session="team" if sessions == "team" else f"team-{number}",
        )
        for number in range(4)
    ]
    answers: dict[str, str] = {}
    async with AsyncExitStack() as stack:
        hosts = [await stack.enter_async_context(host(machine)) for machine in machines]

        async def call(session: Any, tool: str, arguments: dict[str, Any], name: str) -> None:
            answers[name] = text_of(await session.call_tool(tool, arguments))

        async with anyio.create_task_group() as group:
            for number in range(10):
                for index, session in enumerate(hosts):
                    note = f"note {index}-{number}"
                    group.start_soon(call, session, "up_write_note", {"note": note}, note)
                    text = f"text {index}-{number}"
                    group.start_soon(call, session, "up_echo", {"text": text, "seconds": 0}, text)
    assert len(answers) == 80
    assert all(
        answer == (f"noted {name}" if name.startswith("note") else name)
        for name, answer in answers.items()
    ), answers
    for index, machine in enumerate(machines):
        assert sorted(machine.executions("write_note")) == sorted(
            f"write_note note {index}-{number}" for number in range(10)
        )
        assert sorted(machine.executions("echo")) == sorted(
            f"echo text {index}-{number}" for number in range(10)
        )
    verified = _verify(url, tmp_path)
    assert verified.returncode == 0 and "intact" in verified.stdout, verified.stdout


# How each proxy's operator classified `echo` (the server hints it is read-only): a rule
# that says it mutates (allowed without a person, so its calls are scoped to the tool,
# not the session), or one that agrees with the server (scoped to each request).
_ECHO_AS: dict[str, dict[str, Any]] = {
    "read_only": {"side_effect": "read_only"},
    "local_mutation": {
        "side_effect": "local_mutation", "outcome": "allow", "allow_hint_mismatch": True,
    },
}  # fmt: skip

# An advisory lock of the test's own (one 64-bit key nothing of agentrt uses), and a
# trigger that makes the first commit of the call whose arguments name "held" wait for
# it, inside its scoped write: its scope's locks taken, its step being written.
_HOLD: Final = 0x74657374686F6C64  # "testhold"
_HOLD_THE_HELD_CALL: Final = (
    f"""
    CREATE FUNCTION test_hold_the_held_call() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM pg_advisory_xact_lock_shared({_HOLD});
        RETURN NEW;
    END
    $$
    """,
    "CREATE TRIGGER test_hold_the_held_call BEFORE INSERT ON steps FOR EACH ROW"
    """ WHEN (NEW.args LIKE '%"held"%') EXECUTE FUNCTION test_hold_the_held_call()""",
)


def _waiting_for(admin: Any, lock: tuple[int, int, int]) -> bool:
    """Whether a session waits for the advisory lock `lock`, as pg_locks names one:
    (classid, objid, objsubid), the key's two unsigned halves and 1 for the one-key form,
    the two keys and 2 for the two-key form."""
    row = admin.execute(
        "SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        " AND classid = %s::bigint::oid AND objid = %s::bigint::oid AND objsubid = %s",
        lock,
    ).fetchone()
    return int(row[0]) > 0


def _committed_calls(admin: Any) -> list[str]:
    """The echoed text of each committed call, in the chain's order of their runs."""
    rows = admin.execute(
        "SELECT s.args FROM events e JOIN steps s ON s.run_id = e.run_id AND s.step = 1"
        " WHERE e.type = 'run_started' ORDER BY e.seq"
    ).fetchall()
    return [json.loads(row[0])["text"] for row in rows]


@pytest.mark.parametrize(
    ("held_as", "other_as", "excluded"),
    [
        ("local_mutation", "read_only", True),
        ("read_only", "local_mutation", True),
        ("read_only", "read_only", False),  # so the test can tell the difference
    ],
)
async def test_two_proxies_that_disagree_on_whether_a_tool_mutates_exclude_each_other_on_it(
    tmp_path: Path, postgres_server: Any, held_as: str, other_as: str, excluded: bool
) -> None:
    """Decision 0065: two proxies of one team session whose rules disagree on whether a
    tool mutates still exclude each other on it (one takes the tool's lock exclusive, the
    other shared).  One proxy's call is held inside its first commit, its scope's locks
    taken; the other proxy's call of the same tool, another request, waits on the tool's
    lock, runs nothing and commits nothing until the first commits, then follows it in
    the one chain, which verifies.  Two proxies that agree the tool is read-only do not
    wait on each other: the second call commits, runs and is answered meanwhile."""
    import psycopg

    from agentrt.store._postgres import KEY_SPACE

    url = postgres_server.database()
    held, other = [
        await build_setup(
            tmp_path / name, rules={"echo": _ECHO_AS[kind]}, database=url, session="team"
        )
        for name, kind in (("held", held_as), ("other", other_as))
    ]
    answers: dict[str, str] = {}

    async def call(session: Any, text: str) -> None:
        arguments = {"text": text, "seconds": 0}
        answers[text] = text_of(await session.call_tool("up_echo", arguments))

    with psycopg.connect(url, autocommit=True) as admin:
        async with host(held) as held_host, host(other) as other_host:
            for statement in _HOLD_THE_HELD_CALL:  # once the proxies made the schema
                admin.execute(statement)
            admin.execute("SELECT pg_advisory_lock(%s)", (_HOLD,))
            hold = (_HOLD >> 32, _HOLD & 0xFFFFFFFF, 1)
            (tool_key,) = admin.execute("SELECT hashtext('team/up_echo')").fetchall()[0]
            tool = (KEY_SPACE, tool_key & 0xFFFFFFFF, 2)  # the team session's lock on echo
            async with anyio.create_task_group() as group:
                group.start_soon(call, held_host, "held")
                await until(lambda: _waiting_for(admin, hold))
                group.start_soon(call, other_host, "beside")
                await until(lambda: "beside" in answers or _waiting_for(admin, tool))
                if excluded:
                    await anyio.sleep(0.5)  # (time to commit, run and answer, were it free)
                    assert answers == {} and _waiting_for(admin, tool)
                    assert _committed_calls(admin) == [] and other.executions() == []
                else:
                    assert _committed_calls(admin) == ["beside"]
                    assert other.executions() == ["echo beside"]
                assert _waiting_for(admin, hold) and held.executions() == []
                admin.execute("SELECT pg_advisory_unlock(%s)", (_HOLD,))
        admin.execute("DROP TRIGGER test_hold_the_held_call ON steps")
        committed = _committed_calls(admin)
    assert answers == {"held": "held", "beside": "beside"}
    assert committed == (["held", "beside"] if excluded else ["beside", "held"])
    assert held.executions() == ["echo held"] and other.executions() == ["echo beside"]
    verified = _verify(url, tmp_path)
    assert verified.returncode == 0 and "intact" in verified.stdout, verified.stdout
