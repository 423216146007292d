"""OpenTelemetry spans built from the audit log (the `otel` extra: `pip install 'agentrt[otel]'`).

A run is a trace; each step a span; the policy decision, an approval wait
and the tool execution are the step's children.  Spans are built from
committed events only, in a thread with its own read-only connection, so
an exporter that fails or falls behind never changes what a run does.
Arguments and results are left out unless the operator sets `content`.

`TraceBuilder` and `trace_context_metadata` need nothing beyond agentrt;
`TraceExporter` and `start_exporter` import the SDK only when started.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from .._lazy import lazy_names

if TYPE_CHECKING:
    from ._exporter import SpansNotDelivered, TraceExporter, otel_available, start_exporter
    from ._settings import TelemetrySettings, settings_from
    from ._spans import (
        CONTENT_CHARS,
        SpanKind,
        SpanRecord,
        TraceBuilder,
        trace_context_metadata,
        trace_id_of,
    )

__all__ = [
    "CONTENT_CHARS",
    "SpanKind",
    "SpanRecord",
    "SpansNotDelivered",
    "TelemetrySettings",
    "TraceBuilder",
    "TraceExporter",
    "otel_available",
    "settings_from",
    "start_exporter",
    "trace_context_metadata",
    "trace_id_of",
]

# Each name is imported on first use, so the proxy (which needs only its settings and,
# for its calls, `trace_context_metadata`) does not load the exporter unless telemetry
# is configured.
_WHERE: Final = {
    "SpansNotDelivered": "._exporter",
    "TelemetrySettings": "._settings",
    "TraceExporter": "._exporter",
    "otel_available": "._exporter",
    "settings_from": "._settings",
    "start_exporter": "._exporter",
    "CONTENT_CHARS": "._spans",
    "SpanKind": "._spans",
    "SpanRecord": "._spans",
    "TraceBuilder": "._spans",
    "trace_context_metadata": "._spans",
    "trace_id_of": "._spans",
}


__getattr__ = lazy_names(__name__, _WHERE, globals())
