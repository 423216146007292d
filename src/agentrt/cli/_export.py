"""`export`: every committed event after a cursor, as JSON Lines on stdout.

The database is opened read-only.  Each batch is written and flushed
before the cursor file is replaced, so a stop (SIGINT, SIGTERM, a reader
that closed the pipe) leaves the cursor at the last event the reader was
given, and only a kill between a flush and the cursor's replacement repeats
a batch (see `agentrt.export` for the guarantee).
"""

from __future__ import annotations

import io
import os
import signal
import stat
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import BinaryIO
from urllib.parse import urlsplit

import click

from ..export import DEFAULT_POLL_SECONDS, Follower, export_line
from ..sanitize import sanitize
from ._app import EXIT_REFUSED, CommandError, Settings, open_for_reading

__all__ = ["export"]


@contextmanager
def _stopped_by_signals(follower: Follower) -> Iterator[None]:
    """SIGINT and SIGTERM ask the follower to stop once the batch in hand is written."""

    def stop(_signal: int, _frame: FrameType | None) -> None:
        follower.stop()

    previous = {number: signal.signal(number, stop) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def _silence_stdout() -> None:
    """After EPIPE: point stdout at /dev/null so the interpreter's last flush cannot fail too."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)


def _sync_if_file(stdout: BinaryIO) -> None:
    """Put lines written to a regular file on disk before the cursor (which is fsynced) moves.

    Otherwise a power cut could keep the new cursor and lose the lines it
    counts as delivered.  A pipe or a terminal has nothing to sync.
    """
    try:
        descriptor = stdout.fileno()
        regular = stat.S_ISREG(os.fstat(descriptor).st_mode)
    except (OSError, ValueError, io.UnsupportedOperation):
        return
    if regular:
        try:
            os.fsync(descriptor)
        except OSError as error:
            raise CommandError(
                f"the exported lines could not be put on disk: "
                f"{sanitize(error.strerror or str(error))}; the cursor stays where it was"
            ) from error


@click.command(short_help="Print events after a cursor as JSON Lines.")
@click.option(
    "--cursor",
    "cursor_path",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="Where the position is kept (owner-only); advanced only after the lines are flushed.",
)
@click.option("--follow", is_flag=True, help="Keep waiting for new events (until SIGINT/SIGTERM).")
@click.option(
    "--from",
    "from_seq",
    type=click.IntRange(1),
    metavar="SEQ",
    help="The first event to print when there is no cursor yet (default 1).",
)
@click.option(
    "--poll",
    "poll_seconds",
    type=click.FloatRange(0.05, 60.0),
    default=DEFAULT_POLL_SECONDS,
    show_default=True,
    metavar="SECONDS",
    help="With --follow, seconds between looks at a quiet database.",
)
@click.option(
    "--otlp",
    "otlp_url",
    metavar="URL",
    help="Send the events' spans to this OTLP/HTTP base URL (as OTEL_EXPORTER_OTLP_ENDPOINT "
    "takes it) instead of printing the events; needs the otel extra.",
)
@click.option(
    "--content",
    is_flag=True,
    help="With --otlp, put arguments and results (sanitized, bounded) in the spans.",
)
@click.option(
    "--retries",
    type=click.IntRange(0, 100),
    metavar="N",
    help="With --otlp and without --follow, how many times a batch the collector did not "
    "take is sent again before the command gives up (default 5, after 0.5, 1, 2, 5 and 10 s; "
    "then every 10 s).",
)
@click.pass_obj
def export(
    settings: Settings,
    cursor_path: Path | None,
    follow: bool,
    from_seq: int | None,
    poll_seconds: float,
    otlp_url: str | None,
    content: bool,
    retries: int | None,
) -> None:
    """Print every event after the cursor, oldest first, one JSON object per line.

    Each line carries seq, run_id, type, payload, created_at, prev_hash and
    hash, so a consumer can recompute the chain it received.  With --otlp,
    the events' spans (runs, steps, tool calls, model attempts) are sent to
    a collector instead, each batch before the cursor moves past it.
    """
    if otlp_url is not None:
        _export_spans(
            settings, otlp_url, cursor_path, follow, from_seq, poll_seconds, content, retries
        )
        return
    if content:
        raise CommandError("--content goes with --otlp (the JSON Lines always carry everything)")
    if retries is not None:
        raise CommandError("--retries goes with --otlp (printing lines is never retried)")
    stdout: BinaryIO = sys.stdout.buffer
    with open_for_reading(settings) as store:
        follower = Follower(store, cursor_path=cursor_path, from_seq=from_seq)
        with _stopped_by_signals(follower):
            for batch in follower.batches(follow=follow, poll_seconds=poll_seconds):
                text = "".join(export_line(event) + "\n" for event in batch)
                try:
                    stdout.write(text.encode("ascii"))
                    stdout.flush()
                except BrokenPipeError:
                    _silence_stdout()
                    shown = f"event {follower.position.seq}" if follower.position.seq else "start"
                    where = f" at {shown}" if cursor_path is not None else ""
                    raise CommandError(
                        f"stdout was closed by its reader; the cursor stays{where}",
                        EXIT_REFUSED,
                    ) from None
                _sync_if_file(stdout)
                try:
                    follower.advance(batch)
                except OSError as error:
                    raise CommandError(
                        f"the cursor {sanitize(str(cursor_path))} cannot be written: "
                        f"{sanitize(error.strerror or str(error))}; the lines up to event "
                        f"{batch[-1].seq} were printed and will be printed again next time"
                    ) from error


def _export_spans(
    settings: Settings,
    url: str,
    cursor_path: Path | None,
    follow: bool,
    from_seq: int | None,
    poll_seconds: float,
    content: bool,
    retries: int | None,
) -> None:
    """`export --otlp URL`: spans, not lines, with the same cursor and the same stops."""
    from ..telemetry import SpansNotDelivered, TraceExporter, otel_available, settings_from

    parsed = urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise CommandError(
            f"--otlp takes an http:// or https:// base URL such as http://127.0.0.1:4318, "
            f"not {sanitize(url)!r}"
        )
    if retries is not None and follow:
        raise CommandError("--retries goes without --follow (a follower tries until it is stopped)")
    if not otel_available():
        raise CommandError(
            "--otlp needs the OpenTelemetry extra, which is not installed "
            "(pip install 'agentrt[otel]')"
        )
    telemetry = settings_from({"otlp_endpoint": url, "content": content})
    assert telemetry is not None
    with open_for_reading(settings) as store:
        follower = Follower(store, cursor_path=cursor_path, from_seq=from_seq)
        exporter = TraceExporter(store.path, telemetry, log=sys.stderr)
        with _stopped_by_signals(follower):
            try:
                exporter.follow_cursor(
                    store, follower, follow=follow, poll_seconds=poll_seconds, retries=retries
                )
            except SpansNotDelivered as error:
                raise CommandError(str(error)) from None
            except OSError as error:
                raise CommandError(
                    f"the cursor {sanitize(str(cursor_path))} cannot be written: "
                    f"{sanitize(error.strerror or str(error))}; the spans sent will be sent "
                    "again next time"
                ) from error
        where = f"event {follower.position.seq}" if follower.position.seq else "the start"
        click.echo(
            f"agentrt: {exporter.sent} span(s) sent to {sanitize(telemetry.traces_url)}; "
            f"the position is {where}",
            err=True,
        )
