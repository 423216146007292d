"""Spans built from committed events, received by a real OTLP/HTTP receiver on loopback."""

from __future__ import annotations

import io
import json
import socket
import time
from pathlib import Path

import anyio
import pytest
from export_support import (
    POLICY,
    SECRET_ARGUMENT,
    SECRET_RESULT,
    approved_write_run,
    tools,
)
from otlp_receiver import ReceivedSpan, otlp_receiver

from agentrt import Decision
from agentrt.gate import Gate
from agentrt.store import open_store
from agentrt.telemetry import (
    CONTENT_CHARS,
    TelemetrySettings,
    TraceBuilder,
    TraceExporter,
    settings_from,
    trace_context_metadata,
    trace_id_of,
)

SIDE_EFFECTS = {"read_note": "read_only", "write_note": "local_mutation"}
HOST_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
HOST_SPAN = "00f067aa0ba902b7"


def _exporter(database: Path, url: str, *, content: bool = False) -> TraceExporter:
    settings = TelemetrySettings(url + "/v1/traces", "agentrt-test", content)
    exporter = TraceExporter(
        database, settings, side_effects=SIDE_EFFECTS, log=io.StringIO(), poll_seconds=0.05
    )
    exporter.start()
    return exporter


def _runs(database: Path, sandbox: Path, *metadatas: dict[str, str] | None) -> list[str]:
    async def scenario() -> list[str]:
        with open_store(database) as store:
            gate = Gate(store, tools(sandbox), policy=POLICY)
            return [await approved_write_run(gate, metadata) for metadata in metadatas]

    sandbox.mkdir(exist_ok=True)
    return anyio.run(scenario)


def _every_value(spans: list[ReceivedSpan]) -> list[str]:
    return [str(value) for span in spans for value in span.attributes.values()] + [
        span.name for span in spans
    ]


@pytest.fixture
def database(tmp_path: Path) -> Path:
    path = tmp_path / "runs.db"
    open_store(path).close()
    return path


def test_spans_reach_a_real_receiver_shaped_run_step_and_children(
    database: Path, tmp_path: Path
) -> None:
    with otlp_receiver() as receiver:
        exporter = _exporter(database, receiver.url)
        (run_id,) = _runs(database, tmp_path / "sandbox", None)
        exporter.stop()
        spans = receiver.snapshot()
    assert exporter.dropped == 0 and exporter.sent == len(spans)
    assert {span.trace_id for span in spans} == {f"{trace_id_of(run_id):032x}"}
    assert {span.service_name for span in spans} == {"agentrt-test"}
    by_id = {span.span_id: span for span in spans}
    (root,) = [span for span in spans if span.parent_span_id == ""]
    assert root.name == "invoke_agent agentrt"
    assert root.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert root.attributes["agentrt.run.id"] == run_id
    assert root.attributes["agentrt.outcome"] == "completed"
    steps = sorted(
        (span for span in spans if span.parent_span_id == root.span_id),
        key=lambda span: span.attributes["agentrt.step"],
    )
    assert [step.name for step in steps] == ["step read_note", "step write_note"]
    assert [step.attributes["agentrt.outcome"] for step in steps] == ["succeeded", "succeeded"]
    assert steps[1].attributes["agentrt.side_effect"] == "local_mutation"

    def children(step: ReceivedSpan) -> list[ReceivedSpan]:
        found = [span for span in spans if span.parent_span_id == step.span_id]
        return sorted(found, key=lambda span: span.start_ns)

    assert [child.name for child in children(steps[0])] == [
        "agentrt.policy",
        "execute_tool read_note",
    ]
    write_children = children(steps[1])
    assert [child.name for child in write_children] == [
        "agentrt.policy",
        "agentrt.approval_wait",
        "agentrt.policy",
        "execute_tool write_note",
    ]
    wait = write_children[1]
    assert wait.attributes["agentrt.approval.kind"] == "tool:local_mutation"
    assert wait.attributes["agentrt.outcome"] == "granted"
    assert wait.start_ns <= wait.end_ns
    assert write_children[2].attributes["agentrt.policy.resumed"] is True
    tool = write_children[3]
    assert tool.attributes["gen_ai.operation.name"] == "execute_tool"
    assert tool.attributes["gen_ai.tool.name"] == "write_note"
    assert tool.attributes["agentrt.outcome"] == "succeeded"
    for span in spans:
        if span.parent_span_id:
            assert span.parent_span_id in by_id, span.name
            parent = by_id[span.parent_span_id]
            assert parent.start_ns <= span.start_ns and span.end_ns <= parent.end_ns
    for value in _every_value(spans):
        assert SECRET_ARGUMENT not in value and SECRET_RESULT not in value


def test_a_restarted_builder_derives_the_same_ids(database: Path, tmp_path: Path) -> None:
    with otlp_receiver() as receiver:
        exporter = _exporter(database, receiver.url)
        _runs(database, tmp_path / "sandbox", None, None)
        exporter.stop()
        received = {(span.trace_id, span.span_id, span.name) for span in receiver.snapshot()}
    builder = TraceBuilder(side_effects=SIDE_EFFECTS)
    with open_store(database, read_only=True) as store:
        rebuilt = {
            (f"{record.trace_id:032x}", f"{record.span_id:016x}", record.name)
            for event in store.events_after(0, 10_000)
            for record in builder.add(event)
        }
    assert rebuilt == received
    assert len(received) == 2 * 9  # each: run, 2 steps, 3 policies, a wait, 2 tools


def test_an_exporter_started_mid_run_joins_the_runs_trace(database: Path, tmp_path: Path) -> None:
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir()

    async def paused() -> tuple[str, str, str]:
        with open_store(database) as store:
            gate = Gate(store, tools(sandbox), policy=POLICY)
            run_id = await gate.start("write")
            args = json.dumps({"path": "a.txt", "content": "x"})
            outcome = await gate.step(run_id, Decision.tool_call("write_note", args))
            assert outcome.approval is not None
            return run_id, outcome.approval.approval_id, outcome.approval.approval_hash

    run_id, approval_id, digest = anyio.run(paused)
    with otlp_receiver() as receiver:
        exporter = _exporter(database, receiver.url)

        async def finish() -> None:
            from agentrt.approvals import approve

            with open_store(database) as store:
                approve(store, run_id, approval_hash=digest, approval_id=approval_id, by="t")
                gate = Gate(store, tools(sandbox), policy=POLICY)
                await gate.resume(run_id)
                await gate.step(run_id, Decision.complete("done"))

        anyio.run(finish)
        exporter.stop()
        spans = receiver.snapshot()
    names = sorted(span.name for span in spans)
    assert names == sorted(
        ["invoke_agent agentrt", "step write_note", "agentrt.approval_wait", "agentrt.policy",
         "execute_tool write_note"]
    )  # fmt: skip
    assert {span.trace_id for span in spans} == {f"{trace_id_of(run_id):032x}"}
    ids = {span.span_id for span in spans}
    assert all(span.parent_span_id in ids for span in spans if span.parent_span_id)


def test_a_hosts_traceparent_is_continued(database: Path, tmp_path: Path) -> None:
    meta = {"traceparent": f"00-{HOST_TRACE}-{HOST_SPAN}-01", "progressToken": 3}
    metadata = {"proxy_session": "s1", **trace_context_metadata(meta)}
    with otlp_receiver() as receiver:
        exporter = _exporter(database, receiver.url)
        _runs(database, tmp_path / "sandbox", metadata)
        exporter.stop()
        spans = receiver.snapshot()
    assert {span.trace_id for span in spans} == {HOST_TRACE}
    (root,) = [span for span in spans if span.name == "invoke_agent agentrt"]
    assert root.parent_span_id == HOST_SPAN
    (tool,) = [span for span in spans if span.name == "execute_tool write_note"]
    assert tool.attributes["mcp.method.name"] == "tools/call"
    assert tool.attributes["mcp.session.id"] == "s1"
    steps = [span for span in spans if span.name.startswith("tools/call ")]
    assert len(steps) == 2 and all(step.kind == 2 for step in steps)  # SPAN_KIND_SERVER


@pytest.mark.parametrize(
    "meta",
    [
        None,
        {},
        {"traceparent": 7},
        {"traceparent": f"00-{'0' * 32}-{HOST_SPAN}-01"},
        {"traceparent": f"00-{HOST_TRACE}-{'0' * 16}-01"},
        {"traceparent": f"00-{HOST_TRACE.upper()}-{HOST_SPAN}-01"},
        {"traceparent": f"00-{HOST_TRACE}-{HOST_SPAN}-01\nx"},
        {"traceparent": f"ff-{HOST_TRACE}-{HOST_SPAN}-01"},
    ],
)
def test_a_malformed_traceparent_is_not_continued(meta: object) -> None:
    assert trace_context_metadata(meta) == {}  # type: ignore[arg-type]


def test_arguments_and_results_are_exported_only_with_content_bounded_and_sanitized(
    database: Path, tmp_path: Path
) -> None:
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir()
    long_hostile = "exe.txt\u202e" + "y" * 5000

    async def run() -> None:
        with open_store(database) as store:
            gate = Gate(store, tools(sandbox), policy=POLICY)
            run_id = await gate.start("read")
            args = json.dumps({"path": "a.txt", "content": long_hostile}, ensure_ascii=False)
            await gate.step(run_id, Decision.tool_call("read_note", args))
            await gate.step(run_id, Decision.complete("done"))

    with otlp_receiver() as receiver:
        exporter = _exporter(database, receiver.url, content=True)
        anyio.run(run)
        exporter.stop()
        spans = receiver.snapshot()
    (step,) = [span for span in spans if span.name == "step read_note"]
    arguments = step.attributes["gen_ai.tool.call.arguments"]
    assert "\u202e" not in arguments and "exe.txt\\u202e" in arguments
    assert len(arguments) <= CONTENT_CHARS
    (tool,) = [span for span in spans if span.name == "execute_tool read_note"]
    assert SECRET_RESULT in tool.attributes["gen_ai.tool.call.result"]


def _dead_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_dead_endpoint_never_affects_the_run(database: Path, tmp_path: Path) -> None:
    log = io.StringIO()
    settings = TelemetrySettings(f"http://127.0.0.1:{_dead_port()}/v1/traces")
    exporter = TraceExporter(database, settings, log=log, poll_seconds=0.05)
    exporter.start()
    (run_id,) = _runs(database, tmp_path / "sandbox", None)
    started = time.monotonic()
    exporter.stop()
    assert time.monotonic() - started < 15
    with open_store(database, read_only=True) as store:
        assert store.get_run(run_id).status == "completed"
    assert exporter.sent == 0 and exporter.dropped > 0
    assert log.getvalue().count("could not be sent") == 1
    assert "runs are not affected" in log.getvalue()


def test_settings_come_from_the_configuration_then_the_standard_variables() -> None:
    assert settings_from(None, environ={}) is None
    environ = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/", "OTEL_SERVICE_NAME": "gw"}
    assert settings_from(None, environ=environ) == TelemetrySettings(
        "http://collector:4318/v1/traces", "gw", False
    )
    traces = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:1/custom", **environ}
    assert settings_from(None, environ=traces).traces_url == "http://c:1/custom"  # type: ignore[union-attr]
    configured = settings_from({"otlp_endpoint": "http://here:9", "content": True}, environ=environ)
    assert configured == TelemetrySettings("http://here:9/v1/traces", "gw", True)


class Failing:
    """A real tool that raises: its step is a tool error."""

    def __init__(self, name: str, side_effect: str) -> None:
        from agentrt import SideEffect, ToolSpec

        self.spec = ToolSpec(
            name=name,
            description="Fails.",
            input_schema={"type": "object"},
            side_effect=SideEffect(side_effect),
            timeout=5.0,
        )

    async def call(self, call: object) -> object:
        raise RuntimeError(f"broken: {SECRET_ARGUMENT}")


def test_denied_invalid_failed_and_rejected_steps_carry_their_outcome_and_error_type(
    database: Path, tmp_path: Path
) -> None:
    from agentrt.approvals import reject

    sandbox = tmp_path / "sandbox"
    sandbox.mkdir()

    async def scenario() -> tuple[str, str]:
        with open_store(database) as store:
            registered = [*tools(sandbox), Failing("mail", "remote_mutation")]
            registered.append(Failing("broken_read", "read_only"))
            gate = Gate(store, registered, policy=POLICY)
            first = await gate.start("many endings")
            await gate.step(first, Decision.tool_call("mail", "{}"))  # denied by the policy
            await gate.step(first, Decision.tool_call(SECRET_ARGUMENT, "{}"))  # unknown tool
            await gate.step(first, Decision.tool_call("broken_read", "{}"))  # raises
            await gate.step(first, Decision.fail(f"gave up: {SECRET_ARGUMENT}"))
            second = await gate.start("rejected")
            args = json.dumps({"path": "a", "content": SECRET_ARGUMENT})
            outcome = await gate.step(second, Decision.tool_call("write_note", args))
            assert outcome.approval is not None
            reject(store, second, approval_hash=outcome.approval.approval_hash, note="no")
            return first, second

    first, second = anyio.run(scenario)
    builder = TraceBuilder(side_effects=SIDE_EFFECTS)
    with open_store(database, read_only=True) as store:
        records = [record for event in store.events_after(0, 1000) for record in builder.add(event)]
    assert builder.open_runs == 0

    def spans_of(run_id: str) -> dict[str, dict[str, object]]:
        trace = trace_id_of(run_id)
        return {
            record.name: {**record.attributes, "status": record.error}
            for record in records
            if record.trace_id == trace
        }

    many = spans_of(first)
    assert many["step mail"]["agentrt.outcome"] == "denied"
    assert many["step mail"]["error.type"] == "denied"
    assert many["step unknown"]["agentrt.outcome"] == "invalid"
    assert many["step unknown"]["error.type"] == "invalid_request"
    assert many["execute_tool broken_read"]["error.type"] == "tool_error"
    assert many["step broken_read"]["agentrt.outcome"] == "failed"
    root = many["invoke_agent agentrt"]
    assert root["agentrt.outcome"] == "failed" and root["status"] is not None
    rejected = spans_of(second)
    assert rejected["agentrt.approval_wait"]["agentrt.outcome"] == "rejected"
    assert rejected["agentrt.approval_wait"]["error.type"] == "approval_rejected"
    assert rejected["step write_note"]["error.type"] == "approval_rejected"
    assert rejected["invoke_agent agentrt"]["agentrt.outcome"] == "cancelled"
    assert rejected["invoke_agent agentrt"]["agentrt.reason"] == "approval_rejected"
    for record in records:
        for value in [record.name, record.error or "", *map(str, record.attributes.values())]:
            assert SECRET_ARGUMENT not in value
