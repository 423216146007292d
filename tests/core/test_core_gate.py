"""The gate's sequence on a real SQLite file: record, validate, decide, execute, record."""

from __future__ import annotations

import io
import json
from pathlib import Path

import anyio
import pytest
from _postgres import raw_connect

from agentrt import (
    ApprovalHashMismatch,
    ApprovalStatus,
    Decision,
    DefaultPolicy,
    Driver,
    Gate,
    JsonlTrace,
    Limits,
    PolicyDecision,
    RegistrationError,
    RunStateError,
    RunStatus,
    SchemaError,
    SideEffect,
    TextTrace,
    ToolSpec,
    approve,
    cancel,
    open_store,
    reject,
)
from agentrt.policy import RunView, ToolRequest

from .helpers import RecordingTool, ScriptAgent, SwitchPolicy, approval_policy

pytestmark = pytest.mark.anyio

WRITE_ARGS = '{"path": "notes.txt",  "content": "line one\\nline two\\n"}'


@pytest.fixture
def db(database: str | Path) -> str | Path:
    return database


async def _waiting_run(db: Path, write: RecordingTool) -> tuple[Gate, str, str]:
    store = open_store(db)
    gate = Gate(store, [write], policy=approval_policy())
    run_id = await gate.start("write a note")
    outcome = await gate.step(run_id, Decision.tool_call("write", WRITE_ARGS))
    assert outcome.status is RunStatus.WAITING_FOR_APPROVAL
    assert outcome.approval is not None
    return gate, run_id, outcome.approval.approval_hash


async def test_allowed_read_runs_and_is_recorded_with_its_result(db: Path) -> None:
    read = RecordingTool("read", SideEffect.READ_ONLY, content='{"text":"hello"}')
    store = open_store(db)
    gate = Gate(store, [read], policy=DefaultPolicy())
    run_id = await gate.start("read")
    outcome = await gate.step(run_id, Decision.tool_call("read", '{"path": "a"}'))
    assert outcome.observation is not None and outcome.observation.kind == "result"
    assert outcome.observation.content == '{"text":"hello"}'
    assert [call.args for call in read.calls] == ['{"path": "a"}']
    types = [event.type for event in store.list_events(run_id)]
    assert types == [
        "run_started",
        "step_recorded",
        "policy_decided",
        "tool_started",
        "tool_finished",
    ]
    step = store.list_steps(run_id)[0]
    assert step.args == '{"path": "a"}' and step.status == "succeeded"


async def test_malformed_request_never_runs_and_is_recorded_verbatim(db: Path) -> None:
    read = RecordingTool("read", SideEffect.READ_ONLY)
    store = open_store(db)
    gate = Gate(store, [read], limits=Limits(max_consecutive_failures=10))
    run_id = await gate.start("read")
    for bad in ['{"path": 1}', '{"path": "a", "path": "b"}', "{not json", '{"path": "a"} []']:
        outcome = await gate.step(run_id, Decision.tool_call("read", bad))
        assert outcome.observation is not None and outcome.observation.kind == "invalid"
    assert read.calls == []
    assert [step.args for step in store.list_steps(run_id)][:2] == [
        '{"path": 1}',
        '{"path": "a", "path": "b"}',
    ]


async def test_unknown_tool_is_an_invalid_observation(db: Path) -> None:
    gate = Gate(open_store(db), [RecordingTool("read", SideEffect.READ_ONLY)])
    run_id = await gate.start("x")
    outcome = await gate.step(run_id, Decision.tool_call("rm_rf", "{}"))
    assert outcome.observation is not None and outcome.observation.kind == "invalid"
    assert "unknown tool" in outcome.observation.content


async def test_denial_is_an_observation_the_agent_sees(db: Path) -> None:
    destroy = RecordingTool("destroy", SideEffect.DESTRUCTIVE)
    gate = Gate(open_store(db), [destroy], policy=DefaultPolicy())
    run_id = await gate.start("x")
    outcome = await gate.step(run_id, Decision.tool_call("destroy", '{"path": "/"}'))
    assert outcome.status is RunStatus.RUNNING
    assert outcome.observation is not None and outcome.observation.kind == "denied"
    assert destroy.calls == []
    assert gate.history(run_id)[0].kind == "denied"


async def test_policy_abort_ends_the_run(db: Path) -> None:
    tool = RecordingTool("read", SideEffect.READ_ONLY)
    gate = Gate(
        open_store(db), [tool], policy=SwitchPolicy(PolicyDecision.abort("goal impossible"))
    )
    run_id = await gate.start("x")
    outcome = await gate.step(run_id, Decision.tool_call("read", '{"path": "a"}'))
    assert outcome.status is RunStatus.FAILED
    assert gate.store.get_run(run_id).reason == "policy_abort"
    assert tool.calls == []


async def test_policy_that_raises_fails_closed(db: Path) -> None:
    class Broken:
        async def evaluate(self, request: object, run: object) -> PolicyDecision:
            raise RuntimeError("bug in policy")

    tool = RecordingTool("read", SideEffect.READ_ONLY)
    gate = Gate(open_store(db), [tool], policy=Broken())
    run_id = await gate.start("x")
    outcome = await gate.step(run_id, Decision.tool_call("read", '{"path": "a"}'))
    assert outcome.status is RunStatus.FAILED
    assert gate.store.get_run(run_id).reason == "policy_error"
    assert tool.calls == []


async def test_terminal_tool_success_completes_the_run_with_its_result(db: Path) -> None:
    finish = RecordingTool("finish", SideEffect.READ_ONLY, content='{"answer":42}', terminal=True)
    gate = Gate(open_store(db), [finish])
    run_id = await gate.start("x")
    outcome = await gate.step(run_id, Decision.tool_call("finish", '{"path": "a"}'))
    assert outcome.status is RunStatus.COMPLETED
    run = gate.store.get_run(run_id)
    assert run.status is RunStatus.COMPLETED and run.result == '{"answer":42}'


async def test_a_terminal_tool_that_fails_leaves_the_run_going_with_its_failure_counted(
    db: Path,
) -> None:
    # A terminal tool's result reads back only the run's status (its success ends
    # the run); after its error the run goes on, and the next step decides on the
    # run as stored: its failure streak, its step count.
    finish = RecordingTool("finish", SideEffect.READ_ONLY, terminal=True, error=RuntimeError("no"))
    gate = Gate(open_store(db), [finish], limits=Limits(max_consecutive_failures=2))
    run_id = await gate.start("x")
    first = await gate.step(run_id, Decision.tool_call("finish", '{"path": "a"}'))
    assert (first.status, first.reason) == (RunStatus.RUNNING, "tool_error")
    run = gate.store.get_run(run_id)
    assert (run.status, run.step_count, run.consecutive_failures) == (RunStatus.RUNNING, 1, 1)
    assert run_id not in gate._views
    second = await gate.step(run_id, Decision.tool_call("finish", '{"path": "b"}'))
    assert second.status is RunStatus.RUNNING
    third = await gate.step(run_id, Decision.tool_call("finish", '{"path": "c"}'))
    assert (third.status, third.reason) == (RunStatus.FAILED, "failure_limit")
    assert len(finish.calls) == 2


async def test_tool_timeout_and_exception_are_tool_error_observations(db: Path) -> None:
    slow = RecordingTool("slow", SideEffect.READ_ONLY, timeout=0.2, delay=5.0)
    broken = RecordingTool("broken", SideEffect.READ_ONLY, error=RuntimeError("disk on fire"))
    gate = Gate(open_store(db), [slow, broken])
    run_id = await gate.start("x")
    timed_out = await gate.step(run_id, Decision.tool_call("slow", '{"path": "a"}'))
    assert timed_out.observation is not None and timed_out.observation.kind == "tool_error"
    assert "timed out" in timed_out.observation.content
    failed = await gate.step(run_id, Decision.tool_call("broken", '{"path": "a"}'))
    assert failed.observation is not None and "disk on fire" in failed.observation.content
    assert gate.store.get_run(run_id).consecutive_failures == 2


async def test_tool_content_that_is_not_json_is_a_tool_error(db: Path) -> None:
    liar = RecordingTool("liar", SideEffect.READ_ONLY, content='{"a":1,"a":2}')
    gate = Gate(open_store(db), [liar])
    run_id = await gate.start("x")
    outcome = await gate.step(run_id, Decision.tool_call("liar", '{"path": "a"}'))
    assert outcome.observation is not None and outcome.observation.kind == "tool_error"
    assert "repeated" in outcome.observation.content


async def test_consecutive_failures_end_the_run_before_the_next_action(db: Path) -> None:
    broken = RecordingTool("broken", SideEffect.READ_ONLY, error=RuntimeError("no"))
    gate = Gate(open_store(db), [broken], limits=Limits(max_consecutive_failures=2))
    agent = ScriptAgent([Decision.tool_call("broken", '{"path": "a"}')] * 5)
    result = await Driver(gate, agent).run("x")
    assert result.status is RunStatus.FAILED and result.reason == "failure_limit"
    assert len(broken.calls) == 2


async def test_step_limit_ends_the_run(db: Path) -> None:
    read = RecordingTool("read", SideEffect.READ_ONLY)
    gate = Gate(open_store(db), [read], limits=Limits(max_steps=3, loop_window=0))
    agent = ScriptAgent([Decision.tool_call("read", f'{{"path": "{i}"}}') for i in range(10)])
    result = await Driver(gate, agent).run("x")
    assert (result.status, result.reason) == (RunStatus.FAILED, "step_limit")
    assert len(read.calls) == 3


async def test_loop_detection_ends_a_run_repeating_itself(db: Path) -> None:
    read = RecordingTool("read", SideEffect.READ_ONLY)
    gate = Gate(open_store(db), [read])
    agent = ScriptAgent([Decision.tool_call("read", '{"path": "same"}')] * 10)
    result = await Driver(gate, agent).run("x")
    assert (result.status, result.reason) == (RunStatus.FAILED, "loop_detected")
    assert len(read.calls) == 3


async def test_the_view_a_result_leaves_is_what_a_fresh_read_of_the_run_gives(db: Path) -> None:
    # The next step's view (the run and its last steps) is built from what the
    # result's transaction wrote, not read again: it must equal a fresh read,
    # field for field, through successes, a tool error and an invalid step.
    read = RecordingTool("read", SideEffect.READ_ONLY, content='{"text":"x"}')
    broken = RecordingTool("broken", SideEffect.READ_ONLY, error=RuntimeError("no"))
    gate = Gate(open_store(db), [read, broken], limits=Limits(loop_window=3))
    run_id = await gate.start("views")
    decisions = [Decision.tool_call("read", f'{{"path": "{index}"}}') for index in range(4)] + [
        Decision.tool_call("broken", '{"path": "b"}'),
        Decision.tool_call("read", '{"path": 7}'),  # invalid: leaves no view
        Decision.tool_call("read", '{"path": "after"}'),
        Decision.tool_call("read", '{"path": "same"}'),
        Decision.tool_call("read", '{"path": "same"}'),
    ]
    compared = 0
    for decision in decisions:
        outcome = await gate.step(run_id, decision)
        assert outcome.status is RunStatus.RUNNING
        view = gate._views.get(run_id)
        if outcome.reason == "invalid":
            assert view is None
            continue
        assert view is not None
        fresh = await gate.store.run(gate._read_view, run_id)
        assert view == fresh
        compared += 1
    assert compared == len(decisions) - 1
    # The derived window still ends a run repeating itself.
    outcome = await gate.step(run_id, Decision.tool_call("read", '{"path": "same"}'))
    assert outcome.status is RunStatus.RUNNING
    outcome = await gate.step(run_id, Decision.tool_call("read", '{"path": "same"}'))
    assert (outcome.status, outcome.reason) == (RunStatus.FAILED, "loop_detected")


async def test_the_run_a_start_writes_is_what_a_fresh_read_of_it_gives(db: Path) -> None:
    # A started run is built from the values its INSERT wrote, not read back, and
    # the first step of `start_and_step` takes its lease on that row unread: both
    # must equal what a fresh read gives, field for field, with and without
    # metadata and a deadline, and the runs keep their order of creation.
    read = RecordingTool("read", SideEffect.READ_ONLY, content='{"text":"x"}')
    store = open_store(db)
    plain = Gate(store, [read])
    timed = Gate(store, [read], limits=Limits(deadline=600.0))
    started = [
        await plain.start("plain"),
        await timed.start("timed", metadata={"team": "ops", "note": "\u00fcber \U0001f600"}),
    ]
    for gate, run_id in zip((plain, timed), started, strict=True):
        assert gate._views[run_id] == await store.run(gate._read_view, run_id)
    run_id = "first-step"
    value, outcome = await timed.start_and_step(
        "stepped", Decision.tool_call("read", '{"path": "p"}'), run_id=run_id,
        metadata={"k": "v"}, admit=lambda connection: (True, "admitted"),
    )  # fmt: skip
    assert value == "admitted" and outcome is not None
    assert outcome.observation is not None and outcome.observation.kind == "result"
    fresh = store.get_run(run_id)
    assert (fresh.status, fresh.step_count, fresh.metadata) == (RunStatus.RUNNING, 1, {"k": "v"})
    assert fresh.lease_owner == timed.owner and fresh.deadline_at is not None
    assert timed._views[run_id] == await store.run(timed._read_view, run_id)
    assert [run.run_id for run in store.list_runs()] == [run_id, *reversed(started)]
    assert store.verify_chain().ok


async def test_deadline_ends_the_run(db: Path) -> None:
    # The deadline is wide enough for a slow machine to reach the first call
    # (opening the store and committing the run take fsyncs), and the call
    # outlasts it, so the run ends on the deadline after exactly one call.
    read = RecordingTool("read", SideEffect.READ_ONLY, delay=1.5)
    gate = Gate(open_store(db), [read], limits=Limits(deadline=1.0, loop_window=0))
    agent = ScriptAgent([Decision.tool_call("read", f'{{"path": "{i}"}}') for i in range(10)])
    result = await Driver(gate, agent).run("x")
    assert (result.status, result.reason) == (RunStatus.FAILED, "deadline")
    assert len(read.calls) == 1


async def test_driver_completes_and_agent_sees_history(db: Path) -> None:
    read = RecordingTool("read", SideEffect.READ_ONLY, content='"hello"')
    agent = ScriptAgent([Decision.tool_call("read", '{"path": "a"}'), Decision.complete("done")])
    result = await Driver(Gate(open_store(db), [read]), agent).run("x")
    assert result.status is RunStatus.COMPLETED and result.result == "done"
    assert [o.content for o in agent.inputs[1].history] == ['"hello"']
    assert [spec.name for spec in agent.inputs[0].tools] == ["read"]


async def test_agent_exception_fails_the_run(db: Path) -> None:
    class Crashing:
        async def decide(self, step_input: object) -> Decision:
            raise ConnectionError("model unreachable")

    result = await Driver(Gate(open_store(db), []), Crashing()).run("x")
    assert result.status is RunStatus.FAILED and "model unreachable" in result.reason


# -- registration ------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            ToolSpec("bad name", "d", {"type": "object"}, SideEffect.READ_ONLY, 1.0),
            "does not match",
        ),
        (ToolSpec("x" * 65, "d", {"type": "object"}, SideEffect.READ_ONLY, 1.0), "does not match"),
        (ToolSpec("t", "", {"type": "object"}, SideEffect.READ_ONLY, 1.0), "no description"),
        (ToolSpec("t", "d", {"type": "object"}, "read_only", 1.0), "side-effect"),  # type: ignore[arg-type]
        (ToolSpec("t", "d", {"type": "object"}, SideEffect.READ_ONLY, 0), "timeout"),
        (ToolSpec("t", "d", {"type": "string"}, SideEffect.READ_ONLY, 1.0), "object"),
    ],
)
def test_registration_refuses_an_incomplete_spec(spec: ToolSpec, message: str) -> None:
    class Holder:
        def __init__(self) -> None:
            self.spec = spec

        async def call(self, call: object) -> object:
            raise AssertionError("never called")

    with pytest.raises(RegistrationError, match=message):
        Gate(open_store(":memory:"), [Holder()])


def test_registration_refuses_a_duplicate_name() -> None:
    tools = [
        RecordingTool("read", SideEffect.READ_ONLY),
        RecordingTool("read", SideEffect.DESTRUCTIVE),
    ]
    with pytest.raises(RegistrationError, match="registered twice"):
        Gate(open_store(":memory:"), tools)


@pytest.mark.parametrize(
    "reference", ["file:///etc/passwd", "http://127.0.0.1:9/schema.json", "other.json#/a"]
)
def test_schema_ref_outside_the_document_is_refused_at_registration(
    reference: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[str] = []
    real_open = open

    def spying_open(file: object, *args: object, **kwargs: object) -> object:
        opened.append(str(file))
        return real_open(file, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr("builtins.open", spying_open)
    schema = {"type": "object", "properties": {"a": {"$ref": reference}}}
    tool = RecordingTool("read", SideEffect.READ_ONLY, schema=schema)
    with pytest.raises(SchemaError, match="not self-contained"):
        Gate(open_store(":memory:"), [tool])
    assert opened == []


# -- approvals ---------------------------------------------------------------


async def test_approve_then_resume_executes_the_recorded_request_once(db: Path) -> None:
    write = RecordingTool("write", SideEffect.LOCAL_MUTATION)
    gate, run_id, shown = await _waiting_run(db, write)
    assert write.calls == []
    approve(gate.store, run_id, approval_hash=shown, by="alice")
    outcome = await gate.resume(run_id)
    assert outcome.observation is not None and outcome.observation.kind == "result"
    assert [call.args for call in write.calls] == [WRITE_ARGS]
    with pytest.raises(RunStateError):
        await gate.resume(run_id)
    assert len(write.calls) == 1
    assert gate.store.latest_approval(run_id).status is ApprovalStatus.USED  # type: ignore[union-attr]


async def test_the_gate_hands_a_calls_context_to_the_tool_untouched(db: Path) -> None:
    # The caller's per-call channels reach the tool explicitly, on its `ToolCall`, by
    # whichever path executes it: a first step, a later step, a resumed approval.
    read = RecordingTool("read", SideEffect.READ_ONLY)
    write = RecordingTool("write", SideEffect.LOCAL_MUTATION)
    gate = Gate(open_store(db), [read, write], policy=approval_policy())
    first, later, resumed = object(), object(), object()
    _, started = await gate.start_and_step(
        "read twice, then write",
        Decision.tool_call("read", '{"path": "a"}'),
        run_id="run-with-context",
        admit=lambda connection: (True, None),
        context=first,
    )
    assert started is not None and started.observation is not None
    await gate.step("run-with-context", Decision.tool_call("read", '{"path": "b"}'), context=later)
    await gate.step("run-with-context", Decision.tool_call("read", '{"path": "c"}'))
    waiting = await gate.step(
        "run-with-context", Decision.tool_call("write", WRITE_ARGS), context=object()
    )
    assert waiting.approval is not None
    approve(gate.store, "run-with-context", approval_hash=waiting.approval.approval_hash)
    await gate.resume("run-with-context", context=resumed)
    assert [call.context for call in read.calls] == [first, later, None]
    assert read.calls[0].context is first and read.calls[1].context is later
    assert len(write.calls) == 1 and write.calls[0].context is resumed


class _NamedApprovalPolicy:
    """`approval_policy()` under a declared identity."""

    id = "rules-v7"

    def __init__(self) -> None:
        self._inner = approval_policy()

    async def evaluate(self, request: ToolRequest, run: RunView) -> PolicyDecision:
        return await self._inner.evaluate(request, run)


async def test_a_resume_names_the_policy_that_decided_it_as_the_first_decision_does(
    db: Path,
) -> None:
    write = RecordingTool("write", SideEffect.LOCAL_MUTATION)
    gate = Gate(open_store(db), [write], policy=_NamedApprovalPolicy())
    run_id = await gate.start("write a note")
    outcome = await gate.step(run_id, Decision.tool_call("write", WRITE_ARGS))
    assert outcome.approval is not None
    approve(gate.store, run_id, approval_hash=outcome.approval.approval_hash, by="alice")
    await gate.resume(run_id)
    payloads = {event.type: event.payload for event in gate.store.list_events(run_id)}
    assert payloads["policy_decided"]["policy_id"] == "rules-v7"
    assert payloads["run_resumed"] == {
        "approval_id": outcome.approval.approval_id,
        "outcome": "require_approval",
        "policy_id": "rules-v7",
    }
    assert gate.store.verify_chain().ok


async def test_approval_presentation_shows_path_line_count_and_preview(db: Path) -> None:
    write = RecordingTool("write", SideEffect.LOCAL_MUTATION)
    gate, run_id, _ = await _waiting_run(db, write)
    approval = gate.store.waiting_approval(run_id)
    assert approval is not None
    assert approval.presentation["path"] == "notes.txt"
    assert approval.presentation["lines"] == 2
    assert approval.presentation["preview"].startswith("line one")
    assert approval.tool == "write" and approval.args == WRITE_ARGS


async def test_tampered_approval_is_refused(db: Path) -> None:
    write = RecordingTool("write", SideEffect.LOCAL_MUTATION)
    gate, run_id, shown = await _waiting_run(db, write)
    raw = raw_connect(db)
    raw.execute(
        "UPDATE approvals SET args = ? WHERE run_id = ?",
        ('{"path": "/etc/passwd", "content": "x"}', run_id),
    )
    raw.commit()
    raw.close()
    with pytest.raises(ApprovalHashMismatch, match="no longer matches"):
        approve(gate.store, run_id, approval_hash=shown)
    assert write.calls == []


async def test_tampered_row_after_approval_does_not_run(db: Path) -> None:
    write = RecordingTool("write", SideEffect.LOCAL_MUTATION)
    gate, run_id, shown = await _waiting_run(db, write)
    approve(gate.store, run_id, approval_hash=shown)
    raw = raw_connect(db)
    raw.execute("UPDATE approvals SET presentation = '{}' WHERE run_id = ?", (run_id,))
    raw.commit()
    raw.close()
    with pytest.raises(ApprovalHashMismatch):
        await gate.resume(run_id)
    assert write.calls == []


async def test_deciding_against_a_stale_view_is_refused(db: Path) -> None:
    write = RecordingTool("write", SideEffect.LOCAL_MUTATION)
    gate, run_id, _ = await _waiting_run(db, write)
    with pytest.raises(ApprovalHashMismatch, match="not the request that was shown"):
        approve(gate.store, run_id, approval_hash="0" * 64)
    with pytest.raises(ApprovalHashMismatch):
        reject(gate.store, run_id, approval_hash="0" * 64)
    assert gate.store.get_run(run_id).status is RunStatus.WAITING_FOR_APPROVAL


async def test_only_the_latest_approval_can_be_decided(db: Path) -> None:
    write = RecordingTool("write", SideEffect.LOCAL_MUTATION)
    policy = SwitchPolicy(PolicyDecision.require_approval("write", {"v": 1}, {"v": 1}))
    store = open_store(db)
    gate = Gate(store, [write], policy=policy)
    run_id = await gate.start("x")
    first = (await gate.step(run_id, Decision.tool_call("write", WRITE_ARGS))).approval
    assert first is not None
    approve(store, run_id, approval_hash=first.approval_hash)
    # The policy changed what it asks the operator to approve: the old grant no longer counts.
    policy.decision = PolicyDecision.require_approval("write", {"v": 2}, {"v": 2})
    outcome = await gate.resume(run_id)
    assert outcome.status is RunStatus.WAITING_FOR_APPROVAL and outcome.approval is not None
    assert outcome.approval.approval_id != first.approval_id
    assert store.get_approval(first.approval_id).status is ApprovalStatus.SUPERSEDED
    with pytest.raises(Exception, match="only a step's latest approval"):
        approve(store, run_id, approval_hash=first.approval_hash, approval_id=first.approval_id)
    assert write.calls == []


async def test_resume_reevaluates_the_policy_and_honours_a_denial(db: Path) -> None:
    write = RecordingTool("write", SideEffect.LOCAL_MUTATION)
    policy = SwitchPolicy(PolicyDecision.require_approval("write", {}, {}))
    store = open_store(db)
    gate = Gate(store, [write], policy=policy)
    run_id = await gate.start("x")
    approval = (await gate.step(run_id, Decision.tool_call("write", WRITE_ARGS))).approval
    assert approval is not None
    approve(store, run_id, approval_hash=approval.approval_hash)
    policy.decision = PolicyDecision.deny("writes frozen")
    outcome = await gate.resume(run_id)
    assert outcome.observation is not None and outcome.observation.kind == "denied"
    assert write.calls == []


async def test_reject_cancels_the_run_and_the_note_reaches_the_model(db: Path) -> None:
    write = RecordingTool("write", SideEffect.LOCAL_MUTATION)
    gate, run_id, shown = await _waiting_run(db, write)
    reject(gate.store, run_id, approval_hash=shown, note="not in that folder")
    run = gate.store.get_run(run_id)
    assert (run.status, run.reason) == (RunStatus.CANCELLED, "approval_rejected")
    assert gate.history(run_id)[-1].content == "not in that folder"
    with pytest.raises(RunStateError):
        await gate.resume(run_id)
    assert write.calls == []


async def test_expired_approval_cancels_the_run_with_nothing_executed(db: Path) -> None:
    write = RecordingTool("write", SideEffect.LOCAL_MUTATION)
    store = open_store(db)
    gate = Gate(store, [write], policy=approval_policy(), limits=Limits(approval_ttl=0.05))
    run_id = await gate.start("x")
    approval = (await gate.step(run_id, Decision.tool_call("write", WRITE_ARGS))).approval
    assert approval is not None
    await anyio.sleep(0.1)
    with pytest.raises(Exception, match="expired"):
        approve(store, run_id, approval_hash=approval.approval_hash)
    run = store.get_run(run_id)
    assert (run.status, run.reason) == (RunStatus.CANCELLED, "approval_expired")
    assert write.calls == []


async def test_expired_grant_cancels_the_run_with_nothing_executed(db: Path) -> None:
    write = RecordingTool("write", SideEffect.LOCAL_MUTATION)
    store = open_store(db)
    gate = Gate(store, [write], policy=approval_policy(), limits=Limits(grant_ttl=0.05))
    run_id = await gate.start("x")
    approval = (await gate.step(run_id, Decision.tool_call("write", WRITE_ARGS))).approval
    assert approval is not None
    approve(store, run_id, approval_hash=approval.approval_hash)
    await anyio.sleep(0.1)
    outcome = await gate.resume(run_id)
    assert (outcome.status, outcome.reason) == (RunStatus.CANCELLED, "grant_expired")
    assert write.calls == []


async def test_paused_run_outlasts_the_process(db: Path) -> None:
    write = RecordingTool("write", SideEffect.LOCAL_MUTATION)
    gate, run_id, shown = await _waiting_run(db, write)
    gate.store.close()
    # "Tomorrow": a new store, a new gate, the same database file.
    store = open_store(db)
    approve(store, run_id, approval_hash=shown)
    later_write = RecordingTool("write", SideEffect.LOCAL_MUTATION)
    agent = ScriptAgent([Decision.complete("written")])
    result = await Driver(Gate(store, [later_write], policy=approval_policy()), agent).resume(
        run_id
    )
    assert result.status is RunStatus.COMPLETED
    assert [call.args for call in later_write.calls] == [WRITE_ARGS]


async def test_two_concurrent_resumes_execute_once(db: Path) -> None:
    write = RecordingTool("write", SideEffect.LOCAL_MUTATION, delay=0.2)
    gate, run_id, shown = await _waiting_run(db, write)
    approve(gate.store, run_id, approval_hash=shown)
    gates = [Gate(open_store(db), [write], policy=approval_policy()) for _ in range(2)]
    errors: list[Exception] = []

    async def resume(gate: Gate) -> None:
        try:
            await gate.resume(run_id)
        except RunStateError as exc:
            errors.append(exc)

    async with anyio.create_task_group() as group:
        for each in gates:
            group.start_soon(resume, each)
    assert len(write.calls) == 1
    assert len(errors) == 1


async def test_operator_cancel_stops_a_live_loop_at_its_next_write(db: Path) -> None:
    store = open_store(db)
    slow = RecordingTool("slow", SideEffect.READ_ONLY, delay=0.3)
    gate = Gate(store, [slow], limits=Limits(loop_window=0))
    agent = ScriptAgent([Decision.tool_call("slow", f'{{"path": "{i}"}}') for i in range(20)])
    results = []

    async def drive() -> None:
        results.append(await Driver(gate, agent).run("x", run_id="cancel-me"))

    async with anyio.create_task_group() as group:
        group.start_soon(drive)
        # Cancelled while the first call is in flight (however slow the machine or
        # the database is to get there).
        with anyio.fail_after(30):
            while not slow.calls:
                await anyio.sleep(0.01)
        cancel(open_store(db), "cancel-me", by="bob")
    assert results[0].status is RunStatus.CANCELLED
    assert len(slow.calls) == 1
    # The call that was in flight still has its result recorded.
    assert store.list_steps("cancel-me")[0].status == "succeeded"


async def test_observers_see_events_only_after_commit(db: Path) -> None:
    store = open_store(db)
    seen: list[int] = []

    def observer(event: object) -> None:
        # The event must already be readable through a second connection.
        other = raw_connect(db)
        count = other.execute("SELECT COUNT(*) FROM events WHERE seq = ?", (event.seq,)).fetchone()[
            0
        ]  # type: ignore[attr-defined]
        other.close()
        seen.append(count)

    text, lines = io.StringIO(), io.StringIO()
    gate = Gate(store, [RecordingTool("read", SideEffect.READ_ONLY)],
                observers=[observer, TextTrace(text), JsonlTrace(lines)])  # fmt: skip
    run_id = await gate.start("goal \x1b[31mred\u202e")
    await gate.step(run_id, Decision.tool_call("read", '{"path": "a"}'))
    assert seen and all(count == 1 for count in seen)
    assert "\x1b" not in text.getvalue() and "\\x1b" in text.getvalue()
    assert "\\u202e" in text.getvalue()
    # JSON Lines are printable ASCII (escapes decode back to the exact goal).
    assert lines.getvalue().isascii() and "\u202e" not in lines.getvalue()
    records = [json.loads(line) for line in lines.getvalue().splitlines()]
    assert records[0]["payload"]["goal"] == "goal \x1b[31mred\u202e"
    assert [record["type"] for record in records][:2] == ["run_started", "step_recorded"]


async def test_driver_raises_the_agents_own_error_and_releases_the_lease(db: Path) -> None:
    from agentrt import AgentrtError

    class Unreachable(AgentrtError):
        pass

    class Failing:
        async def decide(self, step_input: object) -> Decision:
            raise Unreachable("the model endpoint is down")

    store = open_store(db)
    gate = Gate(store, [RecordingTool("read", SideEffect.READ_ONLY)], lease_ttl=60)
    with pytest.raises(Unreachable):
        await Driver(gate, Failing()).run("x", run_id="resumable")
    run = store.get_run("resumable")
    assert run.status is RunStatus.RUNNING and run.lease_owner is None
    # Another process may pick the run up at once, not after the lease's 60 s.
    other = Gate(open_store(db), [RecordingTool("read", SideEffect.READ_ONLY)])
    result = await Driver(other, ScriptAgent([Decision.complete("done")])).resume("resumable")
    assert result.status is RunStatus.COMPLETED


async def test_presentation_line_count_counts_newlines_only(db: Path) -> None:
    write = RecordingTool("write", SideEffect.LOCAL_MUTATION)
    store = open_store(db)
    gate = Gate(store, [write], policy=approval_policy())
    run_id = await gate.start("x")
    args = json.dumps({"path": "a", "content": "one\u2028two\x0bthree\x85four\nfive"})
    outcome = await gate.step(run_id, Decision.tool_call("write", args))
    assert outcome.approval is not None
    assert outcome.approval.presentation["lines"] == 2
