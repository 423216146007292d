"""Times as the store writes them: ISO 8601 text in UTC for what happened when, epoch
seconds for leases and expiries."""

from __future__ import annotations

import time
from datetime import UTC, datetime

# The text of the current second, kept: `utc_now` runs several times a step.
_utc_second: tuple[int, str] = (-1, "")


def utc_now() -> str:
    """The current UTC time as ISO 8601 with microseconds (`2026-12-01T16:41:50.521022Z`)."""
    return _utc_text(time.time_ns() // 1_000)


def utc_at(epoch: float) -> str:
    """`epoch` as `utc_now` writes the time: UTC ISO 8601 with microseconds."""
    return _utc_text(round(epoch * 1_000_000))


def _utc_text(microseconds: int) -> str:
    global _utc_second
    second, micros = divmod(microseconds, 1_000_000)
    cached = _utc_second
    if cached[0] != second:
        cached = (second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)))
        _utc_second = cached  # one tuple, replaced whole: safe across threads
    return f"{cached[1]}.{micros:06d}Z"


def epoch_to_iso(epoch: float) -> str:
    """Epoch seconds (how leases and expiries are kept) as UTC ISO 8601, to the second."""
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def iso_to_epoch(text: str) -> float:
    """A time the store wrote with `utc_now` as epoch seconds."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
