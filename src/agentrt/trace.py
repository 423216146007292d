"""Observers: an aligned text trace and a JSON Lines trace of committed events."""

from __future__ import annotations

from typing import Any, TextIO

from .canonical import canonical_json
from .sanitize import sanitize
from .store import Event

__all__ = ["JsonlTrace", "TextTrace", "ascii_only", "event_json", "format_event"]

_VALUE_CHARS = 120


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else canonical_json(value)
    text = sanitize(text)
    if len(text) > _VALUE_CHARS:
        text = text[: _VALUE_CHARS - 1] + "…"
    return text


def format_event(event: Event) -> str:
    """One aligned line for an event; everything a model or server chose is escaped."""
    fields = " ".join(f"{key}={_short(value)}" for key, value in sorted(event.payload.items()))
    run_id = sanitize(event.run_id)[:40]
    return f"{event.seq:>6}  {event.created_at}  {run_id:<32}  {event.type:<20}  {fields}"


def _escape_beyond_ascii(char: str) -> str:
    code = ord(char)
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def ascii_only(json_text: str) -> str:
    """JSON text with every character outside printable ASCII written as a `\\u` escape.

    Valid because such characters can only occur inside JSON strings, where
    the escape means the same character; a terminal showing the line then
    cannot be steered by a bidi control or a C1 character a model chose.
    """
    if json_text.isascii() and "\x7f" not in json_text:
        return json_text
    return "".join(char if ord(char) < 0x7F else _escape_beyond_ascii(char) for char in json_text)


def event_json(event: Event) -> str:
    """An event as one line of JSON, printable ASCII only (lossless: JSON escapes decode)."""
    return ascii_only(
        canonical_json(
            {
                "seq": event.seq,
                "run_id": event.run_id,
                "type": event.type,
                "payload": event.payload,
                "created_at": event.created_at,
                "prev_hash": event.prev_hash,
                "hash": event.hash,
            }
        )
    )


class TextTrace:
    """Write each committed event as an aligned text line."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def __call__(self, event: Event) -> None:
        self.stream.write(format_event(event) + "\n")
        self.stream.flush()


class JsonlTrace:
    """Write each committed event as one JSON object per line."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def __call__(self, event: Event) -> None:
        self.stream.write(event_json(event) + "\n")
        self.stream.flush()
