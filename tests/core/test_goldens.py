"""Golden scenarios: what the gate, the approvals and the proxy's call path write, fixed.

Each scenario runs through the public API (`Gate`, `open_store`, `approve`, `reject`;
the proxy's in-process call path through `_proxy_calls`, the one place that imports
private modules) with the clock and the random draws frozen, and is compared with a
file recorded from the code as it was before the store and the gate were reshaped
(tests/core/goldens/, issue 28): the chain head (seq, hash) it leaves, the ordered SQL
trace of every statement sent to the database (parameters included), and what each
public call returned.  `AGENTRT_RECORD_GOLDENS=1` writes the files anew.

Frozen, on the standard library's (and psycopg's) module attributes, never on
agentrt's, so the freeze survives modules moving: `time.time` and `time.time_ns` (a
clock that moves only when a scenario advances it), `uuid.uuid4` and
`secrets.token_hex` (counters, so the same draws give the same ids: an approval id,
a run id, a lease token, a proxy run id or hold token); owners are passed explicitly
(the default label names the host and the pid).  `time.monotonic` is left alone:
it only bounds waits, and never reaches the database.

The trace is taken where the database receives it, so it does not depend on which
Python function sends a statement: on SQLite every connection `sqlite3.connect` opens
gets `set_trace_callback`, which on Python 3.11 hands over each statement with its
parameters expanded (SQLite prints a real with 15 significant digits, so the frozen
clock stays on quarter seconds, which print exactly); on PostgreSQL the store's
store sends each statement with its parameters bound on the server (prepared after a
few uses, decision 0060), so the trace is taken at `Cursor.execute`/`executemany` and
written as a `ClientCursor` on the same connection would have sent it, literals bound
(`mogrify`): the text a client-side binding sends, which is what the goldens recorded
before the store bound on the server — the same statements with the same values.  Statements
are numbered by connection in the order connections were opened (`c0`, `c1`, ...).

Normalised, because it is truly not the test's to fix: on PostgreSQL the server's
clock, which judges leases and holds (`Store.write_time`): a number or an ISO
timestamp in a statement within two days of the real time when the test started is
written `<server clock>` (the frozen clock is in 2001, so nothing of the test's is
mistaken for it).  Temporary paths never reach a statement, so nothing else is.
Scenarios whose outcome needs the clock that judges a lease or a grant to move
(grant expiry, take-over after a dead lease, an interrupted side effect) run on
SQLite only: on PostgreSQL that clock is the server's, which the test cannot move.

The writer thread commits concurrent `write` units in one group; every scenario awaits
one call at a time, so each unit is a batch of its own and the order is fixed.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import json
import os
import re
import secrets
import sqlite3
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from itertools import zip_longest
from pathlib import Path
from typing import Any

import pytest

from agentrt import (
    ClassPolicy,
    Decision,
    DefaultPolicy,
    Gate,
    Limits,
    Outcome,
    SideEffect,
    StateRead,
    StepOutcome,
    Store,
    ToolCall,
    ToolResult,
    ToolSpec,
    approve,
    open_store,
    reject,
)
from agentrt.grants import GrantRequest, grant_scope, list_grants, revoke
from agentrt.store import ledger

from .helpers import RecordingTool, approval_policy

pytestmark = pytest.mark.anyio

GOLDENS = Path(__file__).parent / "goldens"
RECORD = os.environ.get("AGENTRT_RECORD_GOLDENS") == "1"
# 2001-09-09T01:46:40Z: far from any real "now", so the server's clock is told apart.
FROZEN_EPOCH = 1_000_000_000.0
WRITE_ARGS = '{"path": "notes.txt", "content": "line one\\nline two\\n"}'
_SERVER_CLOCK_WINDOW = 2 * 86_400.0


# -- the frozen world ----------------------------------------------------------


class FrozenWorld:
    """The clock and the random draws a scenario sees; the clock moves only on `advance`."""

    def __init__(self) -> None:
        self.nanoseconds = int(FROZEN_EPOCH) * 1_000_000_000
        self.uuids = 0
        self.tokens = 0
        # Added to the high half of each uuid: an approval id is its first 16 hex digits, so a
        # scenario asking a second approval raises it first (0 leaves every other id as it was).
        self.uuid_era = 0

    def advance(self, seconds: float) -> None:
        # Quarter seconds only: SQLite's trace prints reals with 15 significant digits.
        assert float(seconds * 4).is_integer(), seconds
        self.nanoseconds += int(seconds * 1_000_000_000)

    def time(self) -> float:
        return self.nanoseconds / 1_000_000_000

    def time_ns(self) -> int:
        return self.nanoseconds

    def uuid4(self) -> uuid.UUID:
        self.uuids += 1
        return uuid.UUID(int=self.uuids + (self.uuid_era << 96), version=4)

    def token_hex(self, nbytes: int | None = None) -> str:
        self.tokens += 1
        width = 2 * (32 if nbytes is None else nbytes)
        return f"{self.tokens:0{width}x}"[-width:]

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(time, "time", self.time)
        monkeypatch.setattr(time, "time_ns", self.time_ns)
        monkeypatch.setattr(uuid, "uuid4", self.uuid4)
        monkeypatch.setattr(secrets, "token_hex", self.token_hex)


# -- the SQL trace ------------------------------------------------------------


@dataclass
class SqlTrace:
    """Statements as the database received them, grouped under the action that sent them."""

    real_now: float
    actions: list[dict[str, Any]] = field(default_factory=list)
    # Every connection opened, in order (held, so that no two ever share an identity).
    connections: list[object] = field(default_factory=list)
    recording: bool = True

    def action(self, name: str) -> None:
        self.actions.append({"action": name, "sql": [], "returned": []})

    def returned(self, value: str) -> None:
        self.actions[-1]["returned"].append(value)

    def opened(self, connection: object) -> object:
        self.connections.append(connection)
        return connection

    def statement(self, connection: object, text: str) -> None:
        if not self.recording:
            return
        number = next(
            (index for index, known in enumerate(self.connections) if known is connection), None
        )
        assert number is not None, "a statement on a connection opened outside the trace"
        self.actions[-1]["sql"].append(f"c{number}: {text}")

    def server_clock(self, text: str) -> str:
        """`text` with every value of the PostgreSQL server's clock written `<server clock>`."""

        def number(match: re.Match[str]) -> str:
            value = float(match.group(0))
            return "<server clock>" if self._near_now(value) else match.group(0)

        def timestamp(match: re.Match[str]) -> str:
            value = datetime.fromisoformat(match.group(1).replace("Z", "+00:00")).timestamp()
            return "'<server clock>'" if self._near_now(value) else match.group(0)

        text = re.sub(r"'(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z)'", timestamp, text)
        return re.sub(r"(?<![\w.'])\d{9,10}\.\d+(?![\w.'])", number, text)

    def _near_now(self, value: float) -> bool:
        return abs(value - self.real_now) < _SERVER_CLOCK_WINDOW

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        real_connect = sqlite3.connect

        def traced_connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
            connection = real_connect(*args, **kwargs)
            self.opened(connection)
            connection.set_trace_callback(
                lambda text, connection=connection: self.statement(connection, text)
            )
            return connection

        monkeypatch.setattr(sqlite3, "connect", traced_connect)
        try:
            import psycopg
        except ImportError:
            return
        real_open = psycopg.connect

        def traced_open(*args: Any, **kwargs: Any) -> Any:
            return self.opened(real_open(*args, **kwargs))

        real_execute = psycopg.Cursor.execute
        real_executemany = psycopg.Cursor.executemany

        def bound(cursor: Any, query: Any, params: Any) -> str:
            text: str = psycopg.ClientCursor(cursor.connection).mogrify(query, params)
            return self.server_clock(text)

        def execute(cursor: Any, query: Any, params: Any = None, **kwargs: Any) -> Any:
            self.statement(cursor.connection, bound(cursor, query, params))
            return real_execute(cursor, query, params, **kwargs)

        def executemany(cursor: Any, query: Any, params_seq: Any, **kwargs: Any) -> Any:
            rows = list(params_seq)
            for params in rows:
                self.statement(cursor.connection, bound(cursor, query, params))
            return real_executemany(cursor, query, rows, **kwargs)

        monkeypatch.setattr(psycopg, "connect", traced_open)
        monkeypatch.setattr(psycopg.Cursor, "execute", execute)
        monkeypatch.setattr(psycopg.Cursor, "executemany", executemany)


@dataclass
class Scenario:
    """What a scenario is handed: where its database is, the world and the trace, and a
    directory of its own for the files it writes (the test's tmp_path)."""

    database: str | Path
    world: FrozenWorld
    trace: SqlTrace
    directory: Path
    stores: list[Store] = field(default_factory=list)

    def open(self, action: str = "open_store") -> Store:
        self.trace.action(action)
        store = open_store(self.database)
        self.stores.append(store)
        return store

    async def call(self, action: str, work: Awaitable[StepOutcome]) -> StepOutcome:
        self.trace.action(action)
        outcome = await work
        observation = outcome.observation
        self.trace.returned(
            f"{outcome.status} {outcome.reason}"
            + (f" observation={observation.kind}" if observation is not None else "")
            + (f" approval={outcome.approval.kind}" if outcome.approval is not None else "")
        )
        return outcome


# -- the proxy's call path (the one place that reaches into private modules) --------


def _import_the_proxy() -> None:
    import agentrt.proxy._calls
    import agentrt.proxy._index  # noqa: F401


def _proxy_calls(
    store: Store, tools: list[Any], *, owner: str, session: str, flows: Any = None
) -> Any:
    """The proxy's in-process call path as `agentrt proxy` builds it (proxy/_proxy.py),
    over `tools`: `handle(tool, arguments)` answers one host `tools/call`.  `flows`: a
    `FlowJudge` for labelled tools."""
    from agentrt.proxy._calls import Calls, ProxyPolicy, WatchedTool
    from agentrt.proxy._index import CallIndex

    index = CallIndex(store, session, owner, 30.0)
    cut_off: set[tuple[str, int]] = set()
    sent: set[str] = set()
    policy = ProxyPolicy(
        ClassPolicy(
            {SideEffect.READ_ONLY: Outcome.ALLOW, SideEffect.LOCAL_MUTATION: Outcome.ALLOW}
        ),
        store,
        identity="golden-policy",
        flows=flows,
    )
    gate = Gate(
        store,
        [WatchedTool(tool, cut_off, sent) for tool in tools],
        policy=policy,
        limits=Limits(),
        owner=owner,
        lease_ttl=30.0,
    )
    return Calls(
        gate=gate, index=index, policy=policy, cut_off=cut_off, sent=sent, session=session,
        database=str(store.path), hold=0.0, repeat_window=3_600.0, max_pending=10,
        log=io.StringIO(),
    )  # fmt: skip


async def _proxy_call(
    scenario: Scenario, calls: Any, tool: str, arguments: Any, host_session: str | None = None
) -> None:
    scenario.trace.action(f"proxy call {tool}")
    answer = await calls.handle(tool, arguments, host_session=host_session)
    scenario.trace.returned(f"{answer.prefix or 'RESULT'} is_error={answer.is_error}")


# -- the scenarios ------------------------------------------------------------


async def allow(scenario: Scenario) -> None:
    store = scenario.open()
    gate = Gate(store, [RecordingTool("read", SideEffect.READ_ONLY)], owner="gate-a")
    scenario.trace.action("start")
    run_id = await gate.start("read a file")
    await scenario.call("step read", gate.step(run_id, Decision.tool_call("read", '{"path": "a"}')))
    await scenario.call("step complete", gate.step(run_id, Decision.complete("done")))


async def deny(scenario: Scenario) -> None:
    store = scenario.open()
    destroy = RecordingTool("destroy", SideEffect.DESTRUCTIVE)
    gate = Gate(store, [destroy], policy=DefaultPolicy(), owner="gate-a")
    scenario.trace.action("start")
    run_id = await gate.start("destroy")
    await scenario.call(
        "step destroy", gate.step(run_id, Decision.tool_call("destroy", '{"path": "/"}'))
    )
    assert destroy.calls == []


async def invalid(scenario: Scenario) -> None:
    store = scenario.open()
    read = RecordingTool("read", SideEffect.READ_ONLY)
    gate = Gate(store, [read], owner="gate-a")
    scenario.trace.action("start")
    run_id = await gate.start("read")
    await scenario.call(
        "step bad type", gate.step(run_id, Decision.tool_call("read", '{"path": 1}'))
    )
    await scenario.call("step bad json", gate.step(run_id, Decision.tool_call("read", "{not json")))
    await scenario.call("step unknown tool", gate.step(run_id, Decision.tool_call("rm_rf", "{}")))
    assert read.calls == []


async def _waiting(scenario: Scenario, limits: Limits | None = None) -> tuple[Gate, str, str]:
    store = scenario.open()
    write = RecordingTool("write", SideEffect.LOCAL_MUTATION)
    gate = Gate(store, [write], policy=approval_policy(), limits=limits, owner="gate-a")
    scenario.trace.action("start")
    run_id = await gate.start("write a note")
    outcome = await scenario.call(
        "step write", gate.step(run_id, Decision.tool_call("write", WRITE_ARGS))
    )
    assert outcome.approval is not None
    return gate, run_id, outcome.approval.approval_hash


async def approve_and_resume(scenario: Scenario) -> None:
    gate, run_id, shown = await _waiting(scenario)
    scenario.world.advance(5)
    scenario.trace.action("approve")
    approve(gate.store, run_id, approval_hash=shown, by="alice", note="fine")
    scenario.world.advance(1)
    await scenario.call("resume", gate.resume(run_id))


async def reject_(scenario: Scenario) -> None:
    gate, run_id, shown = await _waiting(scenario)
    scenario.world.advance(5)
    scenario.trace.action("reject")
    reject(gate.store, run_id, approval_hash=shown, by="bob", note="not that file")


async def grant_expiry(scenario: Scenario) -> None:
    gate, run_id, shown = await _waiting(scenario, Limits(grant_ttl=60.0))
    scenario.world.advance(5)
    scenario.trace.action("approve")
    approve(gate.store, run_id, approval_hash=shown, by="alice")
    scenario.world.advance(60.25)
    outcome = await scenario.call("resume after the grant lapsed", gate.resume(run_id))
    assert outcome.reason == "grant_expired"


async def take_over_after_a_dead_lease(scenario: Scenario) -> None:
    store = scenario.open()
    read = RecordingTool("read", SideEffect.READ_ONLY)
    dead = Gate(store, [read], owner="gate-dead", lease_ttl=30.0)
    scenario.trace.action("start")
    run_id = await dead.start("read, then die")
    await scenario.call("step read", dead.step(run_id, Decision.tool_call("read", '{"path": "a"}')))
    # The first process is gone; its lease runs out.
    scenario.world.advance(30.25)
    heir = Gate(store, [read], owner="gate-heir", lease_ttl=30.0)
    outcome = await scenario.call("resume by the heir", heir.resume(run_id))
    assert outcome.reason == "taken_over"
    await scenario.call(
        "step read again", heir.step(run_id, Decision.tool_call("read", '{"path": "b"}'))
    )


class _DiesMidCall:
    """A mutating tool during whose call its process is taken for dead and the run taken over."""

    def __init__(self) -> None:
        self.spec = ToolSpec("write", "the write tool", {"type": "object"},
                             SideEffect.LOCAL_MUTATION, 20.0)  # fmt: skip
        self.during: Callable[[], Awaitable[None]] | None = None
        self.calls: list[ToolCall] = []

    async def call(self, call: ToolCall) -> ToolResult:
        self.calls.append(call)
        if self.during is not None:
            during, self.during = self.during, None
            await during()
        return ToolResult('{"ok":true}', "written")


async def interrupted_side_effect(scenario: Scenario) -> None:
    from agentrt.errors import ResultNotRecorded

    store = scenario.open()
    tool = _DiesMidCall()
    allow_all = ClassPolicy({SideEffect.LOCAL_MUTATION: Outcome.ALLOW})
    dying = Gate(store, [tool], policy=allow_all, owner="gate-dying", lease_ttl=30.0)
    heir = Gate(store, [tool], policy=allow_all, owner="gate-heir", lease_ttl=30.0)
    scenario.trace.action("start")
    run_id = await dying.start("write while dying")
    taken: list[StepOutcome] = []

    async def lapse_and_take_over() -> None:
        scenario.world.advance(30.25)
        taken.append(await scenario.call("resume by the heir mid-call", heir.resume(run_id)))
        scenario.trace.action("the dead call's result")

    scenario.trace.action("step write")
    tool.during = lapse_and_take_over
    with pytest.raises(ResultNotRecorded):
        await dying.step(run_id, Decision.tool_call("write", "{}"))
    approval = taken[0].approval
    assert approval is not None and approval.kind == "interrupted_side_effect"
    scenario.world.advance(5)
    scenario.trace.action("approve")
    approve(store, run_id, approval_hash=approval.approval_hash, by="alice")
    await scenario.call("resume by the heir", heir.resume(run_id))
    assert len(tool.calls) == 2


async def reconciled_after_a_crash(scenario: Scenario) -> None:
    from agentrt.errors import ResultNotRecorded
    from agentrt.gate import Interrupted, Reconciliation

    store = scenario.open()
    tool = _DiesMidCall()
    allow_all = ClassPolicy({SideEffect.LOCAL_MUTATION: Outcome.ALLOW})

    async def it_ran(call: Interrupted) -> Reconciliation:
        return Reconciliation.ran(ToolResult('{"ok":true}', "found written"), "the file is there")

    dying = Gate(store, [tool], policy=allow_all, owner="gate-dying", lease_ttl=30.0)
    heir = Gate(store, [tool], policy=allow_all, owner="gate-heir", lease_ttl=30.0,
                reconcile=it_ran)  # fmt: skip
    scenario.trace.action("start")
    run_id = await dying.start("write while dying")
    taken: list[StepOutcome] = []

    async def lapse_and_take_over() -> None:
        scenario.world.advance(30.25)
        taken.append(await scenario.call("resume by the heir mid-call", heir.resume(run_id)))
        scenario.trace.action("the dead call's result")

    scenario.trace.action("step write")
    tool.during = lapse_and_take_over
    with pytest.raises(ResultNotRecorded):
        await dying.step(run_id, Decision.tool_call("write", "{}"))
    assert taken[0].reason == "reconciled"
    assert len(tool.calls) == 1


async def proxied_call(scenario: Scenario) -> None:
    store = scenario.open()
    read = RecordingTool("files_read", SideEffect.READ_ONLY, content='{"text":"hello"}')
    calls = _proxy_calls(store, [read], owner="proxy:golden", session="session-1")
    await _proxy_call(scenario, calls, "files_read", {"path": "a"})
    assert len(read.calls) == 1


async def proxied_duplicate(scenario: Scenario) -> None:
    store = scenario.open()
    write = RecordingTool("files_write", SideEffect.LOCAL_MUTATION)
    calls = _proxy_calls(store, [write], owner="proxy:golden", session="session-1")
    arguments = {"path": "notes.txt", "content": "once"}
    await _proxy_call(scenario, calls, "files_write", arguments)
    scenario.world.advance(2)
    await _proxy_call(scenario, calls, "files_write", arguments)
    assert len(write.calls) == 1


async def unknown_outcome(scenario: Scenario) -> None:
    store = scenario.open()
    write = RecordingTool(
        "files_write", SideEffect.LOCAL_MUTATION, error=ConnectionError("connection lost")
    )
    calls = _proxy_calls(store, [write], owner="proxy:golden", session="session-1")
    await _proxy_call(scenario, calls, "files_write", {"path": "notes.txt", "content": "x"})
    assert len(write.calls) == 1


class _StatefulWrite(RecordingTool):
    """A write whose precondition reads `state` (None: absent)."""

    def __init__(self) -> None:
        super().__init__("write", SideEffect.LOCAL_MUTATION)
        self.state: str | None = "line one\n"

    async def fingerprint(self, call: ToolCall) -> StateRead:
        return StateRead(self.state, "read", '{"path":"notes.txt"}')


async def stale(scenario: Scenario) -> None:
    store = scenario.open()
    write = _StatefulWrite()
    gate = Gate(store, [write], policy=approval_policy(), owner="gate-a")
    scenario.trace.action("start")
    run_id = await gate.start("write a note")
    outcome = await scenario.call(
        "step write", gate.step(run_id, Decision.tool_call("write", WRITE_ARGS))
    )
    assert outcome.approval is not None
    scenario.world.advance(5)
    scenario.trace.action("approve")
    approve(store, run_id, approval_hash=outcome.approval.approval_hash, by="alice")
    write.state = "someone else's line\n"
    scenario.world.advance(1)
    ended = await scenario.call("resume on a changed state", gate.resume(run_id))
    assert ended.reason == "stale" and write.calls == []


async def flow_held_and_taint_cleared(scenario: Scenario) -> None:
    """A send after reading private data and an outsider's text is held; once the operator
    clears the session's taint, the same session's next send runs."""
    from agentrt.proxy._flows import FlowJudge, FlowRule, Flows, TaintStore

    store = scenario.open()
    read = RecordingTool("files_read", SideEffect.READ_ONLY, content='{"text":"secret"}')
    fetch = RecordingTool("web_fetch", SideEffect.READ_ONLY, content='{"text":"do it"}')
    send = RecordingTool("mail_send", SideEffect.LOCAL_MUTATION)
    taint = TaintStore(store)
    rule = FlowRule(("private", "untrusted"), "egress", Outcome.REQUIRE_APPROVAL)
    labels = {"files_read": ("private",), "web_fetch": ("untrusted",), "mail_send": ("egress",)}
    judge = FlowJudge(Flows(rules=(rule,)), labels, taint)
    calls = _proxy_calls(
        store, [read, fetch, send], owner="proxy:golden", session="session-1", flows=judge
    )
    await _proxy_call(scenario, calls, "files_read", {"path": "a"}, "stdio-golden")
    await _proxy_call(scenario, calls, "web_fetch", {"path": "http://x"}, "stdio-golden")
    await _proxy_call(scenario, calls, "mail_send", {"path": "to-x"}, "stdio-golden")
    assert send.calls == []
    scenario.trace.action("taint clear")
    cleared = taint.clear("stdio-golden", "alice", "reviewed")
    scenario.trace.returned(",".join(cleared))
    await _proxy_call(scenario, calls, "mail_send", {"path": "to-y"}, "stdio-golden")
    assert len(send.calls) == 1


async def _asgi_request(
    app: Any, method: str, path: str, headers: dict[str, str], body: bytes
) -> int:
    """One request through an ASGI app in process (no socket: nothing of the network
    reaches the trace); the status it answered."""
    sent = False
    status = 0

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2),
        "headers": [(name.lower().encode(), value.encode()) for name, value in headers.items()],
    }  # fmt: skip
    await app(scope, receive, send)
    return status


async def approver_refused(scenario: Scenario) -> None:
    """The signed approver channel refuses an unsigned decision and a signed one with a
    hash that was not shown (`approver_refused`), then takes a signed approval."""
    from agentrt.approver import approver_app, signed_request

    gate, run_id, shown = await _waiting(scenario)
    store = gate.store
    approval = store.latest_approval(run_id)
    assert approval is not None
    secret = b"golden-secret-golden-secret-golden-secret"
    app = approver_app(store, secret)
    path = f"/runs/{run_id}/approvals/{approval.approval_id}/approve"
    decision = {"run_id": run_id, "approval_id": approval.approval_id, "by": "alice"}
    for name, shown_hash, signing in (
        ("unsigned approve", shown, None),
        ("approve a hash not shown", "0" * 64, secret),
        ("approve", shown, secret),
    ):
        scenario.world.advance(1)
        body = json.dumps({**decision, "hash": shown_hash}).encode()
        headers = {"content-type": "application/json", "content-length": str(len(body))}
        if signing is not None:
            request = signed_request("POST", f"http://approver{path}", secret=signing, content=body)
            headers.update(
                {name: value for name, value in request.headers.items() if name.startswith("x-")}
            )
        scenario.trace.action(name)
        scenario.trace.returned(str(await _asgi_request(app, "POST", path, headers, body)))


async def standing_grant(scenario: Scenario) -> None:
    """A grant given with an approval, used by a call it covers, revoked; a second one
    left to expire: each of its four transitions, through the proxy's call path."""
    from agentrt.proxy._grants import GrantCover
    from agentrt.store import GrantLimits

    store = scenario.open()
    mail = RecordingTool("mail_send", SideEffect.REMOTE_MUTATION, schema={"type": "object"})
    calls = _proxy_calls(store, [mail], owner="proxy:golden", session="session-1")
    cover = GrantCover(store, "session-1", GrantLimits(3_600.0, 5), {"mail_send": "mail"})
    calls.policy.grants = cover
    calls.policy.tool_outcomes["mail_send"] = Outcome.REQUIRE_APPROVAL
    scenario.trace.action("record the operator's maximum")
    cover.record_limits()

    async def ask_and_grant(to: str, request: GrantRequest) -> str:
        await _proxy_call(scenario, calls, "mail_send", {"to": to})
        [run] = [run for run in store.list_runs() if run.status == "waiting_for_approval"]
        approval = store.waiting_approval(run.run_id)
        assert approval is not None
        scope = grant_scope(store, approval, request)
        scenario.world.advance(5)
        scenario.trace.action("approve with a standing grant")
        approve(
            store, run.run_id, approval_hash=approval.approval_hash, by="alice",
            grant=dataclasses.replace(request, scope_hash=scope.scope_hash),
        )  # fmt: skip
        await _proxy_call(scenario, calls, "mail_send", {"to": to})
        [grant] = [g for g in list_grants(store) if g.approval_id == approval.approval_id]
        return grant.grant_id

    first = await ask_and_grant("a@example.org", GrantRequest(calls=2))
    await _proxy_call(scenario, calls, "mail_send", {"to": "b@example.org"})
    scenario.trace.action("revoke")
    revoke(store, first, by="alice")
    scenario.world.uuid_era = 1
    await ask_and_grant("c@example.org", GrantRequest(seconds=60.0))
    scenario.world.advance(60.25)
    scenario.world.uuid_era = 2
    await _proxy_call(scenario, calls, "mail_send", {"to": "d@example.org"})
    assert [call.args for call in mail.calls] == [
        '{"to":"a@example.org"}', '{"to":"b@example.org"}', '{"to":"c@example.org"}',
    ]  # fmt: skip


# A fixed Ed25519 key (its 32 private bytes): a signature by it is the same every time.
_CHECKPOINT_KEY = bytes(range(32))


async def passkey_quorum(scenario: Scenario) -> None:
    """Passkey mode's two events (`approver_decided`, `approval_quorum_reached`): a quorum
    of two approvers, each decision a real WebAuthn assertion (Ed25519 from fixed seeds, so
    the signatures and the chain are deterministic), then the resume it allows."""
    import hashlib

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from agentrt.passkeys import Approver, Assertion, QuorumRule, Registry, decide
    from agentrt.passkeys import decision_challenge as challenge_of
    from agentrt.passkeys._registry import b64url

    gate, run_id, shown = await _waiting(scenario)
    store = gate.store
    approval = store.latest_approval(run_id)
    assert approval is not None
    keys = {name: Ed25519PrivateKey.from_private_bytes(bytes([n]) * 32)
            for n, name in ((1, "alice"), (2, "bob"))}  # fmt: skip

    def cose(name: str) -> bytes:
        raw = keys[name].public_key().public_bytes_raw()
        # A COSE OKP key (kty 1, alg -8 EdDSA, crv 6 Ed25519, x): CBOR by hand, 42 bytes.
        return bytes.fromhex("a4010103272006215820") + raw

    registry = Registry(Path("approvers.json"), tuple(
        Approver(name, f"{name}@example.com", name.encode(), cose(name), "2001-09-09")
        for name in keys
    ))  # fmt: skip
    challenge = challenge_of(approval.approval_id, shown, "approve", None, 2)
    client_data = json.dumps({"type": "webauthn.get", "challenge": b64url(challenge),
                              "origin": "http://localhost:8765"}).encode()  # fmt: skip
    authenticator_data = hashlib.sha256(b"localhost").digest() + bytes([0x05]) + bytes(4)
    for name in keys:
        scenario.world.advance(5)
        signature = keys[name].sign(authenticator_data + hashlib.sha256(client_data).digest())
        assertion = Assertion(name.encode(), authenticator_data, client_data, signature)
        scenario.trace.action(f"{name} approves with a passkey")
        decided = decide(
            store, registry, run_id, approval_id=approval.approval_id, approval_hash=shown,
            verdict="approve", assertion=assertion, origin="http://localhost:8765",
            quorum=QuorumRule({"local_mutation": 2}),
        )  # fmt: skip
        scenario.trace.returned(f"waiting for {decided.waiting_for}")
    scenario.world.advance(1)
    await scenario.call("resume", gate.resume(run_id))


async def checkpoint(scenario: Scenario) -> None:
    """A run, then the operator's signed checkpoint of the head (`agentrt checkpoint`)."""
    await _checkpointed(scenario)


async def _checkpointed(scenario: Scenario) -> tuple[Path, Path]:
    """`checkpoint`'s scenario; the key and the log it used."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from agentrt.retention import load_private_key, write_checkpoint

    await allow(scenario)
    directory = scenario.directory / "checkpoint"
    directory.mkdir(mode=0o700)
    key_path = directory / "operator.key"
    key_path.write_bytes(
        Ed25519PrivateKey.from_private_bytes(_CHECKPOINT_KEY).private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    key_path.chmod(0o600)
    scenario.world.advance(1)
    scenario.trace.action("checkpoint")
    signed = write_checkpoint(
        scenario.stores[0], load_private_key(str(key_path)), str(directory / "log")
    )
    scenario.trace.returned(f"checkpoint {signed.number} of event {signed.seq}")
    return key_path, directory / "log"


async def archive(scenario: Scenario) -> None:
    """A completed run, checkpointed, then archived (`agentrt archive`): its events and
    rows moved into a signed segment, an `archived` event in their place."""
    from agentrt.retention import archive_before, load_private_key

    key_path, log_path = await _checkpointed(scenario)
    directory = scenario.directory
    (directory / "archive").mkdir(mode=0o700)
    scenario.world.advance(1)
    scenario.trace.action("archive")
    result = archive_before(
        scenario.stores[0], load_private_key(str(key_path)), str(log_path),
        str(directory / "archive"), "9999", 1e12,
    )  # fmt: skip
    assert result.manifest is not None
    statement = result.manifest["statement"]
    scenario.trace.returned(f"archived {statement['first_seq']}..{statement['last_seq']}")


async def listing_changed(scenario: Scenario) -> None:
    """A proxied server's new listing refused a changed tool and listed an unpinned one
    (`listing_changed`, `proxy/_live.py`), then matched its pins again."""
    store = scenario.open()
    for action, refused, unpinned in (
        ("refused note, unpinned plugin", {"note": "its description changed"}, ["plugin"]),
        ("matches again", {}, []),
    ):
        scenario.world.advance(1)
        scenario.trace.action(action)
        await store.write(
            functools.partial(ledger.record_listing_change, store),
            "chg", "golden-session", refused, unpinned,
        )  # fmt: skip


# The scenarios and whether each runs on PostgreSQL (only those whose clock the test
# controls there: the server's clock judges leases and grants, and the test cannot move it).
SCENARIOS: dict[str, tuple[Callable[[Scenario], Awaitable[None]], bool]] = {
    "allow": (allow, True),
    "deny": (deny, True),
    "invalid": (invalid, True),
    "approve_and_resume": (approve_and_resume, True),
    "reject": (reject_, True),
    "grant_expiry": (grant_expiry, False),
    "take_over_after_a_dead_lease": (take_over_after_a_dead_lease, False),
    "interrupted_side_effect": (interrupted_side_effect, False),
    "reconciled_after_a_crash": (reconciled_after_a_crash, False),
    "proxied_call": (proxied_call, True),
    "proxied_duplicate": (proxied_duplicate, True),
    "unknown_outcome": (unknown_outcome, True),
    "stale": (stale, True),
    "flow_held_and_taint_cleared": (flow_held_and_taint_cleared, True),
    "approver_refused": (approver_refused, True),
    "standing_grant": (standing_grant, False),
    "checkpoint": (checkpoint, True),
    "archive": (archive, True),
    "listing_changed": (listing_changed, True),
    "passkey_quorum": (passkey_quorum, True),
}


@contextmanager
def _frozen(
    monkeypatch: pytest.MonkeyPatch, database: str | Path, directory: Path
) -> Iterator[Scenario]:
    # Importing the proxy draws ids of its own (its telemetry's uuid4s): done here, before
    # the world is frozen, so the draws a scenario sees do not depend on whether another
    # test in the same process imported the proxy first.
    _import_the_proxy()
    trace = SqlTrace(real_now=time.time())
    world = FrozenWorld()
    trace.install(monkeypatch)
    world.install(monkeypatch)
    scenario = Scenario(database, world, trace, directory)
    try:
        yield scenario
    finally:
        trace.recording = False
        for store in scenario.stores:
            store.close()
        monkeypatch.undo()


def _golden_path(name: str, backend: str) -> Path:
    return GOLDENS / f"{name}.{backend}.json"


@pytest.mark.parametrize("name", list(SCENARIOS))
async def test_the_scenario_leaves_the_recorded_chain_head_and_sql_trace(
    name: str, database: str | Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    run, on_postgres = SCENARIOS[name]
    backend = "postgresql" if str(database).startswith("postgresql://") else "sqlite"
    if backend == "postgresql" and not on_postgres:
        pytest.skip("the server's clock judges this scenario's leases or grants on PostgreSQL")
    with _frozen(monkeypatch, database, tmp_path) as scenario:
        await run(scenario)
        scenario.trace.recording = False
        seq, digest = scenario.stores[0].head()
        assert scenario.stores[0].verify_chain().ok
    recorded = {
        "scenario": name,
        "backend": backend,
        "head": {"seq": seq, "hash": digest},
        "trace": scenario.trace.actions,
    }
    path = _golden_path(name, backend)
    if RECORD:
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(recorded, indent=1, ensure_ascii=False) + "\n")
    assert path.exists(), f"no golden {path.name}: record it with AGENTRT_RECORD_GOLDENS=1"
    _compare(recorded, json.loads(path.read_text()), path.name)


def _compare(recorded: dict[str, Any], expected: dict[str, Any], golden: str) -> None:
    """Fail at the first action, statement or returned value that differs from `golden`."""
    for index, (ran, want) in enumerate(zip(recorded["trace"], expected["trace"], strict=False)):
        where = f"{golden}, action {index} ({want['action']!r})"
        assert ran["action"] == want["action"], f"{where}: the scenario now does {ran['action']!r}"
        for number, (got, wanted) in enumerate(zip_longest(ran["sql"], want["sql"])):
            assert got == wanted, (
                f"{where}, statement {number}:\n ran:      {got}\n recorded: {wanted}"
            )
        assert ran["returned"] == want["returned"], f"{where}: returned {ran['returned']}"
    assert len(recorded["trace"]) == len(expected["trace"]), (
        f"{golden}: a different number of actions"
    )
    assert recorded["head"] == expected["head"], f"{golden}: the chain head differs"
