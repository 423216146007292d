"""Spans from committed events: a run is a trace, a step a span, and the policy decision, the
approval wait and the tool execution the step's children.

Nothing here imports OpenTelemetry: a `SpanRecord` is a plain value the
exporter turns into the SDK's span.  A span is produced by the event that
closes it, so a span never describes what the database does not hold yet.

Ids are derived, not drawn: the trace id from the run id (or taken from the
`traceparent` the run's metadata carries), each span id from the run id and
the `seq` of the event that opened it.  An exporter that restarts and reads
the same events again therefore produces the same ids, and a backend sees a
repeated span as the same span.
"""

from __future__ import annotations

import enum
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from ..canonical import canonical_json
from ..sanitize import sanitize
from ..store import Event

__all__ = [
    "CONTENT_CHARS",
    "SpanKind",
    "SpanRecord",
    "TraceBuilder",
    "trace_context_metadata",
    "trace_id_of",
]

CONTENT_CHARS: Final = 1024
"""With content on, the most characters of an argument or result a span carries."""

_TRACEPARENT: Final = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
_TRACESTATE_CHARS: Final = 512
# A reason is exported only when it is one of the runtime's own code words,
# never a sentence a model or an agent wrote.
_CODE_WORD: Final = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


class SpanKind(enum.StrEnum):
    INTERNAL = "internal"
    SERVER = "server"
    CLIENT = "client"


AttributeValue = str | int | bool | tuple[str, ...]


@dataclass(frozen=True, slots=True)
class SpanRecord:
    """One finished span: ids, parent, name, times (ns since the epoch) and attributes."""

    trace_id: int
    span_id: int
    parent_span_id: int | None
    parent_is_remote: bool
    name: str
    kind: SpanKind
    start_ns: int
    end_ns: int
    attributes: dict[str, AttributeValue]
    error: str | None
    closed_at_seq: int
    """The seq of the event that ended the span (an exporter skips those it already sent)."""


def trace_context_metadata(meta: Mapping[str, Any] | None) -> dict[str, str]:
    """From a host's MCP `_meta`, the W3C trace context worth keeping in a run's metadata.

    Returns `{"traceparent": …}` (and `"tracestate"` when one came with it)
    when `meta["traceparent"]` is a well-formed version-00 W3C traceparent
    with non-zero ids, else `{}`.  The proxy merges this into the metadata of
    the run it starts, so the run's trace continues the host's.
    """
    if not isinstance(meta, Mapping):
        return {}
    parent = meta.get("traceparent")
    if not isinstance(parent, str):
        return {}
    match = _TRACEPARENT.match(parent)
    if match is None or int(match[1], 16) == 0 or int(match[2], 16) == 0:
        return {}
    kept = {"traceparent": parent}
    state = meta.get("tracestate")
    if isinstance(state, str) and len(state) <= _TRACESTATE_CHARS and state.isprintable():
        kept["tracestate"] = state
    return kept


def _derived(size: int, *parts: str) -> int:
    digest = hashlib.sha256("\x00".join(("agentrt", *parts)).encode("utf-8")).digest()
    value = int.from_bytes(digest[:size], "big")
    return value or 1  # zero is the invalid id in W3C trace context


def trace_id_of(run_id: str, metadata: Mapping[str, Any] | None = None) -> int:
    """The trace id of a run: its host's trace when the metadata carries one, else derived."""
    parent = (metadata or {}).get("traceparent")
    match = _TRACEPARENT.match(parent) if isinstance(parent, str) else None
    if match is not None and int(match[1], 16) and int(match[2], 16):
        return int(match[1], 16)
    return _derived(16, "trace", run_id)


def _nanoseconds(created_at: str) -> int:
    moment = datetime.fromisoformat(created_at.replace("Z", "+00:00"))
    return int(moment.timestamp()) * 1_000_000_000 + moment.microsecond * 1000


def _content(value: Any) -> str:
    text = sanitize(value if isinstance(value, str) else canonical_json(value))
    return text if len(text) <= CONTENT_CHARS else text[: CONTENT_CHARS - 1] + "…"


def _code(value: Any, fallback: str) -> str:
    return value if isinstance(value, str) and _CODE_WORD.match(value) else fallback


@dataclass(slots=True)
class _Open:
    span_id: int
    parent_span_id: int | None
    name: str
    kind: SpanKind
    start_ns: int
    attributes: dict[str, AttributeValue]


@dataclass(slots=True)
class _Step:
    span: _Open
    tool: str
    children: dict[str, _Open] = field(default_factory=dict)
    outcome: str = "recorded"
    error: str | None = None


@dataclass(slots=True)
class _Run:
    run_id: str
    trace_id: int
    root: _Open
    remote_parent: bool
    tools: frozenset[str]
    steps: dict[int, _Step] = field(default_factory=dict)
    approval_steps: dict[str, int] = field(default_factory=dict)


class TraceBuilder:
    """Turns events, in seq order, into finished spans.

    `add(event)` returns the spans that event closes.  Events of a run the
    builder has not seen start (`run_started` came before it was made) are
    ignored unless the run is first replayed with `add`; the exporter does
    that from the store.  `content=True` adds arguments and results, each
    sanitized and cut to `CONTENT_CHARS`; `side_effects` maps a tool name to
    its operator-given side-effect class.
    """

    def __init__(
        self, *, content: bool = False, side_effects: Mapping[str, str] | None = None
    ) -> None:
        self.content = content
        self.side_effects = dict(side_effects or {})
        self._runs: dict[str, _Run] = {}

    def knows(self, run_id: str) -> bool:
        return run_id in self._runs

    @property
    def open_runs(self) -> int:
        return len(self._runs)

    # -- events --------------------------------------------------------------

    def add(self, event: Event) -> list[SpanRecord]:
        """The spans `event` closes (none for most events)."""
        if event.type == "run_started":
            self._start_run(event)
            return []
        run = self._runs.get(event.run_id)
        if run is None:
            return []
        payload = event.payload
        handler = _HANDLERS.get(event.type)
        if handler is not None:
            return handler(self, run, event, payload)
        if event.type.startswith("run_") and event.type[4:] in _RUN_ENDS:
            return self._end_run(run, event, payload)
        return []

    def _start_run(self, event: Event) -> None:
        payload = event.payload
        metadata = payload.get("metadata")
        metadata = metadata if isinstance(metadata, dict) else {}
        trace_id = trace_id_of(event.run_id, metadata)
        remote = "traceparent" in trace_context_metadata(metadata)
        parent = int(str(metadata["traceparent"]).split("-")[2], 16) if remote else None
        attributes: dict[str, AttributeValue] = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": "agentrt",
            "gen_ai.conversation.id": sanitize(event.run_id),
            "agentrt.run.id": sanitize(event.run_id),
        }
        session = metadata.get("proxy_session")
        if isinstance(session, str):
            attributes["mcp.session.id"] = sanitize(session)
        tools = payload.get("tools")
        names = frozenset(t for t in tools if isinstance(t, str)) if isinstance(tools, list) else ()
        root = _Open(
            _derived(8, "span", event.run_id, str(event.seq)),
            parent,
            "invoke_agent agentrt",
            SpanKind.INTERNAL,
            _nanoseconds(event.created_at),
            attributes,
        )
        self._runs[event.run_id] = _Run(event.run_id, trace_id, root, remote, frozenset(names))

    def _finish(self, run: _Run, span: _Open, event: Event, error: str | None = None) -> SpanRecord:
        if error is not None:
            span.attributes["error.type"] = error
        is_root = span is run.root
        return SpanRecord(
            trace_id=run.trace_id,
            span_id=span.span_id,
            parent_span_id=span.parent_span_id,
            parent_is_remote=is_root and run.remote_parent,
            name=span.name,
            kind=span.kind,
            start_ns=span.start_ns,
            end_ns=max(_nanoseconds(event.created_at), span.start_ns),
            attributes=span.attributes,
            error=error,
            closed_at_seq=event.seq,
        )

    def _open_child(
        self, run: _Run, step: _Step, key: str, name: str, event: Event,
        attributes: dict[str, AttributeValue],
    ) -> _Open:  # fmt: skip
        span = _Open(
            _derived(8, "span", run.run_id, str(event.seq)),
            step.span.span_id,
            name,
            SpanKind.INTERNAL,
            _nanoseconds(event.created_at),
            attributes,
        )
        step.children[key] = span
        return span

    def _step_of(self, run: _Run, payload: Mapping[str, Any]) -> _Step | None:
        number = payload.get("step")
        return run.steps.get(number) if isinstance(number, int) else None

    def _tool_attributes(self, run: _Run, tool: str) -> dict[str, AttributeValue]:
        attributes: dict[str, AttributeValue] = {"gen_ai.tool.name": sanitize(tool)}
        side_effect = self.side_effects.get(tool)
        if side_effect is not None:
            attributes["agentrt.side_effect"] = sanitize(side_effect)
        if "mcp.session.id" in run.root.attributes:
            # A proxy run is one host `tools/call`.
            attributes["mcp.method.name"] = "tools/call"
            attributes["mcp.session.id"] = run.root.attributes["mcp.session.id"]
        return attributes

    def _close_step(self, run: _Run, number: int, event: Event) -> list[SpanRecord]:
        step = run.steps.pop(number, None)
        if step is None:
            return []
        finished = [
            self._finish(run, child, event, "interrupted") for child in step.children.values()
        ]
        step.span.attributes["agentrt.outcome"] = step.outcome
        finished.append(self._finish(run, step.span, event, step.error))
        return finished

    def _open_step(self, run: _Run, event: Event, number: int, tool: str) -> list[SpanRecord]:
        # A new step means every earlier one is settled, whatever was last heard of it.
        finished = [
            record
            for earlier in sorted(run.steps)
            for record in self._close_step(run, earlier, event)
        ]
        attributes = self._tool_attributes(run, tool)
        attributes["agentrt.step"] = number
        kind = SpanKind.SERVER if "mcp.method.name" in attributes else SpanKind.INTERNAL
        name = (
            f"tools/call {sanitize(tool)}" if kind is SpanKind.SERVER else f"step {sanitize(tool)}"
        )
        span = _Open(
            _derived(8, "span", run.run_id, str(event.seq)),
            run.root.span_id,
            name,
            kind,
            _nanoseconds(event.created_at),
            attributes,
        )
        run.steps[number] = _Step(span, tool)
        return finished

    # -- handlers, one per event type ------------------------------------------

    def _on_step_recorded(
        self, run: _Run, event: Event, payload: Mapping[str, Any]
    ) -> list[SpanRecord]:
        number, tool = payload.get("step"), payload.get("tool")
        if not isinstance(number, int) or not isinstance(tool, str):
            return []
        finished = self._open_step(run, event, number, tool)
        if self.content and "args" in payload:
            run.steps[number].span.attributes["gen_ai.tool.call.arguments"] = _content(
                payload["args"]
            )
        return finished

    def _on_step_invalid(
        self, run: _Run, event: Event, payload: Mapping[str, Any]
    ) -> list[SpanRecord]:
        number, tool = payload.get("step"), payload.get("tool")
        if not isinstance(number, int):
            return []
        # A name the run never registered is the model's text, not a tool's name.
        name = tool if isinstance(tool, str) and tool in run.tools else "unknown"
        finished = self._open_step(run, event, number, name)
        step = run.steps[number]
        step.outcome, step.error = "invalid", "invalid_request"
        return finished + self._close_step(run, number, event)

    def _on_policy(self, run: _Run, event: Event, payload: Mapping[str, Any]) -> list[SpanRecord]:
        if event.type == "run_resumed":
            approval_id = payload.get("approval_id")
            number = run.approval_steps.get(approval_id) if isinstance(approval_id, str) else None
            step = run.steps.get(number) if number is not None else None
        else:
            step = self._step_of(run, payload)
        if step is None:
            return []
        outcome = _code(payload.get("outcome"), "unknown")
        attributes: dict[str, AttributeValue] = {
            "agentrt.policy.outcome": outcome,
            "agentrt.policy.resumed": event.type == "run_resumed",
        }
        # The decision is committed with the step it decides, so its span is an instant.
        span = self._open_child(run, step, "policy", "agentrt.policy", event, attributes)
        step.children.pop("policy")
        step.outcome = outcome
        return [self._finish(run, span, event)]

    def _on_approval_requested(
        self, run: _Run, event: Event, payload: Mapping[str, Any]
    ) -> list[SpanRecord]:
        step = self._step_of(run, payload)
        approval_id = payload.get("approval_id")
        if step is None or not isinstance(approval_id, str):
            return []
        number = payload.get("step")
        assert isinstance(number, int)  # `_step_of` found the step by it
        run.approval_steps[approval_id] = number
        kind = payload.get("kind")
        attributes: dict[str, AttributeValue] = {
            "agentrt.approval.kind": sanitize(kind) if isinstance(kind, str) else "approval",
            "agentrt.approval.id": sanitize(approval_id),
        }
        capability = payload.get("capability")
        side_effect = capability.get("side_effect") if isinstance(capability, dict) else None
        if isinstance(side_effect, str) and "agentrt.side_effect" not in step.span.attributes:
            step.span.attributes["agentrt.side_effect"] = sanitize(side_effect)
        self._open_child(
            run, step, f"approval:{approval_id}", "agentrt.approval_wait", event, attributes
        )
        step.outcome = "waiting_for_approval"
        return []

    def _on_approval_decided(
        self, run: _Run, event: Event, payload: Mapping[str, Any]
    ) -> list[SpanRecord]:
        approval_id = payload.get("approval_id")
        if not isinstance(approval_id, str):
            return []
        number = run.approval_steps.get(approval_id)
        step = run.steps.get(number) if number is not None else None
        span = step.children.pop(f"approval:{approval_id}", None) if step else None
        if step is None or span is None:
            return []
        outcome = event.type.removeprefix("approval_")
        span.attributes["agentrt.outcome"] = outcome
        step.outcome = f"approval_{outcome}"
        error = None if outcome == "granted" else f"approval_{outcome}"
        step.error = error
        return [self._finish(run, span, event, error)]

    def _on_tool_started(
        self, run: _Run, event: Event, payload: Mapping[str, Any]
    ) -> list[SpanRecord]:
        step = self._step_of(run, payload)
        if step is None:
            return []
        attributes = self._tool_attributes(run, step.tool)
        attributes["gen_ai.operation.name"] = "execute_tool"
        attributes["gen_ai.tool.call.id"] = sanitize(f"{run.run_id}/{payload['step']}")
        self._open_child(
            run, step, "tool", f"execute_tool {sanitize(step.tool)}", event, attributes
        )
        step.outcome = "executing"
        return []

    def _on_tool_ended(
        self, run: _Run, event: Event, payload: Mapping[str, Any]
    ) -> list[SpanRecord]:
        step = self._step_of(run, payload)
        if step is None:
            return []
        span = step.children.pop("tool", None)
        finished: list[SpanRecord] = []
        if event.type == "tool_finished":
            step.outcome, step.error = "succeeded", None
            if span is not None:
                span.attributes["agentrt.outcome"] = "succeeded"
                if self.content and "content" in payload:
                    span.attributes["gen_ai.tool.call.result"] = _content(payload["content"])
                finished.append(self._finish(run, span, event))
        else:
            word = "failed" if event.type == "tool_error" else "interrupted"
            error = "tool_error" if event.type == "tool_error" else "interrupted"
            step.outcome, step.error = word, error
            if span is not None:
                span.attributes["agentrt.outcome"] = word
                finished.append(self._finish(run, span, event, error))
        if event.type == "step_interrupted":
            # A read is retried as a new step; a mutation waits for an approval on this one.
            return finished
        number = payload.get("step")
        assert isinstance(number, int)
        return finished + self._close_step(run, number, event)

    def _on_step_denied(
        self, run: _Run, event: Event, payload: Mapping[str, Any]
    ) -> list[SpanRecord]:
        step = self._step_of(run, payload)
        if step is None:
            return []
        step.outcome, step.error = "denied", "denied"
        number = payload.get("step")
        assert isinstance(number, int)
        return self._close_step(run, number, event)

    def _on_model_attempt(
        self, run: _Run, event: Event, payload: Mapping[str, Any]
    ) -> list[SpanRecord]:
        """One request to a model, as the GenAI semantic conventions name it: a client span
        `chat MODEL` under the run, from the attempt's start to its record.  Usage, the
        finish reason and the outcome; never the prompt or the reply (not recorded)."""
        provider = _code(str(payload.get("provider", "")).lower(), "unknown")
        model = payload.get("model")
        model_name = sanitize(model) if isinstance(model, str) and model else "unknown"
        attributes: dict[str, AttributeValue] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.system": provider,
            "gen_ai.provider.name": provider,
            "gen_ai.request.model": model_name,
        }
        for name, key in (("agentrt.step", "step"), ("agentrt.model.attempt", "attempt")):
            value = payload.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                attributes[name] = value
        usage = payload.get("usage")
        if isinstance(usage, Mapping):
            for field_name, attribute in _USAGE_ATTRIBUTES:
                count = usage.get(field_name)
                if isinstance(count, int) and not isinstance(count, bool):
                    attributes[attribute] = count
        stop = payload.get("stop_reason")
        if isinstance(stop, str) and _CODE_WORD.match(stop):
            attributes["gen_ai.response.finish_reasons"] = (stop,)
        outcome = _code(payload.get("outcome"), "unknown")
        attributes["agentrt.outcome"] = outcome
        started = payload.get("started_at")
        end_ns = _nanoseconds(event.created_at)
        try:
            start_ns = _nanoseconds(started) if isinstance(started, str) else end_ns
        except ValueError:  # not a time the meter wrote: the span is an instant
            start_ns = end_ns
        span = _Open(
            _derived(8, "span", run.run_id, str(event.seq)),
            run.root.span_id,
            f"chat {model_name}",
            SpanKind.CLIENT,
            min(start_ns, end_ns),
            attributes,
        )
        return [self._finish(run, span, event, None if outcome == "ok" else outcome)]

    def _end_run(self, run: _Run, event: Event, payload: Mapping[str, Any]) -> list[SpanRecord]:
        status = event.type.removeprefix("run_")
        reason = _code(payload.get("reason"), "")
        finished: list[SpanRecord] = []
        for number in sorted(run.steps):
            step = run.steps[number]
            for key in [key for key in step.children if key.startswith("approval:")]:
                span = step.children.pop(key)
                word = reason if reason.startswith("approval_") else f"run_{status}"
                span.attributes["agentrt.outcome"] = word.removeprefix("approval_")
                finished.append(self._finish(run, span, event, word))
            if step.outcome in ("recorded", "waiting_for_approval", "executing", "allow"):
                step.outcome, step.error = status, reason or f"run_{status}"
            finished.extend(self._close_step(run, number, event))
        run.root.attributes["agentrt.outcome"] = status
        if reason:
            run.root.attributes["agentrt.reason"] = reason
        error = None if status == "completed" else (reason or status)
        finished.append(self._finish(run, run.root, event, error))
        del self._runs[run.run_id]
        return finished


_RUN_ENDS: Final = frozenset({"completed", "failed", "cancelled"})

# The recorded usage fields and the GenAI semantic conventions' attribute for each.
_USAGE_ATTRIBUTES: Final = (
    ("input_tokens", "gen_ai.usage.input_tokens"),
    ("output_tokens", "gen_ai.usage.output_tokens"),
    ("cache_read_input_tokens", "gen_ai.usage.cache_read.input_tokens"),
    ("cache_creation_input_tokens", "gen_ai.usage.cache_creation.input_tokens"),
)

_HANDLERS: Final = {
    "step_recorded": TraceBuilder._on_step_recorded,
    "step_invalid": TraceBuilder._on_step_invalid,
    "policy_decided": TraceBuilder._on_policy,
    "run_resumed": TraceBuilder._on_policy,
    "approval_requested": TraceBuilder._on_approval_requested,
    "approval_granted": TraceBuilder._on_approval_decided,
    "approval_rejected": TraceBuilder._on_approval_decided,
    "approval_expired": TraceBuilder._on_approval_decided,
    "tool_started": TraceBuilder._on_tool_started,
    "tool_finished": TraceBuilder._on_tool_ended,
    "tool_error": TraceBuilder._on_tool_ended,
    "step_interrupted": TraceBuilder._on_tool_ended,
    "step_denied": TraceBuilder._on_step_denied,
    "model_attempt": TraceBuilder._on_model_attempt,
}
