"""The exporter: follows a database in a thread of its own and sends finished spans over OTLP/HTTP.

It reads the database through its own read-only connection and never
touches the writer's store, so a slow, failing or absent collector costs a
run nothing: spans that cannot be sent are dropped (and said so once), the
run carries on.  It covers what is committed from the moment it starts; a
run already under way when it starts is read back from the store when its
next event arrives, so its later spans still join the same trace.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Final

from ..errors import AgentrtError
from ..export import Follower
from ..sanitize import sanitize
from ..store import Event, Store, is_postgres_url, open_store
from ._settings import TelemetrySettings, settings_from
from ._spans import SpanKind, SpanRecord, TraceBuilder

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

__all__ = [
    "SpansNotDelivered",
    "TelemetrySettings",
    "TraceExporter",
    "otel_available",
    "settings_from",
    "start_exporter",
]

_DEFAULT_TIMEOUT_SECONDS: Final = 3.0
_POLL_SECONDS: Final = 0.25
_REPLAY_PAGE: Final = 1000
_REPLAYED_KEPT: Final = 10_000
_SCOPE: Final = "agentrt"
# Pauses between attempts to deliver a batch with a cursor (the last one repeats with --follow).
_RETRY_SECONDS: Final = (0.5, 1.0, 2.0, 5.0, 10.0)


def otel_available() -> bool:
    """Whether the `otel` extra (the OpenTelemetry SDK and its OTLP/HTTP exporter) is installed."""
    try:
        return all(
            importlib.util.find_spec(name) is not None
            for name in ("opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.http")
        )
    except ImportError:  # a parent package is missing
        return False


class TraceExporter:
    """Sends the spans of everything committed to `database` after `start()`, until `stop()`."""

    def __init__(
        self,
        database: str | os.PathLike[str],
        settings: TelemetrySettings,
        *,
        side_effects: Mapping[str, str] | None = None,
        log: IO[str] | None = None,
        poll_seconds: float = _POLL_SECONDS,
    ) -> None:
        # A postgresql:// URL stays text (a Path would fold its "//").
        self.database: str | Path = (
            database if isinstance(database, str) and is_postgres_url(database) else Path(database)
        )
        self.settings = settings
        self.builder = TraceBuilder(content=settings.content, side_effects=side_effects)
        self.log = log if log is not None else sys.stderr
        self.poll_seconds = poll_seconds
        self.sent = 0
        self.dropped = 0
        self._failing = False
        self._replayed: set[str] = set()
        self._store: Store | None = None
        self._follower: Follower | None = None
        self._thread: threading.Thread | None = None
        self._exporter: SpanExporter | None = None
        self._resource: Resource | None = None
        self._scope: InstrumentationScope | None = None

    def _open_exporter(self) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        # The SDK logs each failed export; the exporter says it once itself.
        logging.getLogger("opentelemetry.exporter.otlp").addHandler(logging.NullHandler())
        timeout = None if _timeout_in_environment() else _DEFAULT_TIMEOUT_SECONDS
        self._exporter = OTLPSpanExporter(endpoint=self.settings.traces_url, timeout=timeout)
        self._resource = Resource.create({"service.name": self.settings.service_name})
        self._scope = InstrumentationScope(_SCOPE)

    def start(self) -> None:
        """Begin at the database's newest event; the spans of later events are sent."""
        self._open_exporter()
        store = open_store(self.database, read_only=True)
        self._store = store
        self._follower = Follower(store, from_seq=store.head_seq() + 1)
        self._thread = threading.Thread(target=self._follow, name="agentrt-telemetry", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 15.0) -> None:
        """Send the spans of what is committed by now, then stop (waiting at most `timeout`)."""
        if self._follower is None or self._thread is None:
            return
        self._follower.stop()
        self._thread.join(timeout)

    # -- the thread ------------------------------------------------------------

    def _follow(self) -> None:
        follower, store = self._follower, self._store
        assert follower is not None and store is not None
        try:
            for batch in follower.batches(follow=True, poll_seconds=self.poll_seconds):
                self._process(store, batch)
                follower.advance(batch)
            # Stopped: what was committed before the stop still gets its spans.
            while batch := store.events_after(follower.position.seq, 500):
                self._process(store, batch)
                follower.advance(batch)
        except Exception as error:  # an exporter's failure must never reach a run
            self._say(f"telemetry stopped: {sanitize(str(error) or type(error).__name__)}")
        finally:
            if self._exporter is not None:
                with contextlib.suppress(Exception):  # a dead exporter's shutdown is not news
                    self._exporter.shutdown()
            store.close()

    def follow_cursor(
        self,
        store: Store,
        follower: Follower,
        *,
        follow: bool = False,
        poll_seconds: float = _POLL_SECONDS,
        retry_seconds: Sequence[float] = _RETRY_SECONDS,
        retries: int | None = None,
    ) -> None:
        """`agentrt export --otlp`: the spans of the events after `follower`'s cursor, each
        batch's spans delivered before the cursor moves past it.

        Unlike the live exporter nothing is dropped: a batch whose spans the
        collector refuses is sent again after a pause (`retry_seconds`, the
        last one repeated), until it is taken or the follower is stopped, and
        then `SpansNotDelivered` names the event the cursor stays at.  Without
        `follow`, the attempts end after `retries` pauses (by default one per
        listed pause).  A run that began before the cursor is read back from
        the store, so its later spans find their parents; the spans its
        earlier events closed are not sent again.
        """
        limit = len(retry_seconds) if retries is None else retries
        self._open_exporter()
        try:
            for batch in follower.batches(follow=follow, poll_seconds=poll_seconds):
                records = self._collect(store, batch)
                attempt = 0
                while records and not self._deliver(records):
                    if not self._failing:
                        self._say(
                            f"telemetry: {len(records)} span(s) could not be sent to "
                            f"{sanitize(self.settings.traces_url)}; trying again"
                        )
                    self._failing = True
                    if attempt >= limit and not follow:
                        raise SpansNotDelivered(self.settings.traces_url, follower.position.seq)
                    pause = retry_seconds[min(attempt, len(retry_seconds) - 1)]
                    attempt += 1
                    if follower.wait_stopped(pause):
                        raise SpansNotDelivered(self.settings.traces_url, follower.position.seq)
                if records:
                    self.sent += len(records)
                    if self._failing:
                        self._say(
                            f"telemetry: spans reach {sanitize(self.settings.traces_url)} again"
                        )
                    self._failing = False
                follower.advance(batch)
        finally:
            if self._exporter is not None:
                with contextlib.suppress(Exception):
                    self._exporter.shutdown()

    def _collect(self, store: Store, batch: Sequence[Event]) -> list[SpanRecord]:
        """The spans `batch` closes, reading back the start of any run it joins midway."""
        finished: list[SpanRecord] = []
        for event in batch:
            run_id = event.run_id
            if (
                event.type != "run_started"
                and not self.builder.knows(run_id)
                and run_id not in self._replayed
            ):
                # Once per run: a run whose start is not in the log stays unknown.
                if len(self._replayed) >= _REPLAYED_KEPT:
                    self._replayed.clear()
                self._replayed.add(run_id)
                self._replay(store, event)
            finished.extend(self.builder.add(event))
        return finished

    def _process(self, store: Store, batch: Sequence[Event]) -> None:
        finished = self._collect(store, batch)
        if finished:
            self._send(finished)

    def _replay(self, store: Store, event: Event) -> None:
        """Read back the events of a run that began before this exporter started.

        Their spans ended before the start, so were another exporter's to
        send; they are rebuilt only so the run's later spans find their parents.
        """
        offset = 0
        while True:
            history = store.list_events(event.run_id, limit=_REPLAY_PAGE, offset=offset)
            for earlier in history:
                if earlier.seq >= event.seq:
                    return
                self.builder.add(earlier)
            if len(history) < _REPLAY_PAGE:
                return
            offset += len(history)

    def _deliver(self, records: Sequence[SpanRecord]) -> bool:
        from opentelemetry.sdk.trace.export import SpanExportResult

        assert self._exporter is not None
        try:
            result = self._exporter.export([self._to_sdk(record) for record in records])
        except Exception:
            return False
        return result is SpanExportResult.SUCCESS

    def _send(self, records: Sequence[SpanRecord]) -> None:
        delivered = self._deliver(records)
        if delivered:
            self.sent += len(records)
            if self._failing:
                self._say(f"telemetry: spans reach {sanitize(self.settings.traces_url)} again")
            self._failing = False
            return
        self.dropped += len(records)
        if not self._failing:
            self._say(
                f"telemetry: {len(records)} span(s) could not be sent to "
                f"{sanitize(self.settings.traces_url)} and were dropped; runs are not affected"
            )
        self._failing = True

    def _to_sdk(self, record: SpanRecord) -> ReadableSpan:
        from opentelemetry import trace
        from opentelemetry.sdk.trace import ReadableSpan

        flags = trace.TraceFlags(trace.TraceFlags.SAMPLED)
        context = trace.SpanContext(record.trace_id, record.span_id, False, flags)
        parent = None
        if record.parent_span_id is not None:
            parent = trace.SpanContext(
                record.trace_id, record.parent_span_id, record.parent_is_remote, flags
            )
        status = (
            trace.Status(trace.StatusCode.ERROR, record.error)
            if record.error is not None
            else trace.Status(trace.StatusCode.UNSET)
        )
        kind = {
            SpanKind.SERVER: trace.SpanKind.SERVER,
            SpanKind.CLIENT: trace.SpanKind.CLIENT,
        }.get(record.kind, trace.SpanKind.INTERNAL)
        return ReadableSpan(
            name=record.name,
            context=context,
            parent=parent,
            resource=self._resource,
            attributes=record.attributes,
            kind=kind,
            status=status,
            start_time=record.start_ns,
            end_time=record.end_ns,
            instrumentation_scope=self._scope,
        )

    def _say(self, line: str) -> None:
        try:
            self.log.write(f"agentrt: {line}\n")
            self.log.flush()
        except (OSError, ValueError):
            pass


class SpansNotDelivered(AgentrtError):
    """The collector did not take a batch's spans; the cursor stays before that batch."""

    def __init__(self, url: str, seq: int) -> None:
        where = f"event {seq}" if seq else "the start"
        super().__init__(
            f"spans could not be sent to {sanitize(url)}; the cursor stays at {where}, "
            "and the next run sends them"
        )
        self.seq = seq


def _timeout_in_environment() -> bool:
    return bool(
        os.environ.get("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT")
        or os.environ.get("OTEL_EXPORTER_OTLP_TIMEOUT")
    )


def start_exporter(
    database: str | os.PathLike[str],
    settings: TelemetrySettings | None,
    *,
    side_effects: Mapping[str, str] | None = None,
    log: IO[str] | None = None,
) -> TraceExporter | None:
    """Start a `TraceExporter` when telemetry is configured and the extra is installed.

    Returns None (after one line on `log` when telemetry was asked for) when
    it is not configured, the extra is missing, or the exporter cannot start:
    telemetry never stops the program it watches.
    """
    stream = log if log is not None else sys.stderr
    if settings is None:
        return None
    if not otel_available():
        stream.write(
            "agentrt: telemetry is configured but the OpenTelemetry extra is not installed "
            "(pip install 'agentrt[otel]'); no spans are sent\n"
        )
        return None
    exporter = TraceExporter(database, settings, side_effects=side_effects, log=stream)
    try:
        exporter.start()
    except (AgentrtError, OSError, ValueError) as error:
        stream.write(f"agentrt: telemetry did not start: {sanitize(str(error))}\n")
        return None
    return exporter
