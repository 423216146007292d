"""An approval as a person reads it in a terminal: fields aligned, content as
numbered lines, edits as a diff (used by `show`, `approve` and `reject`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from ..canonical import canonical_json
from ..inbox.review import (
    TextReview,
    displayed_hash,
    edits_of,
    parsed_arguments,
    size_of,
    state_changes,
    text_review,
)
from ..sanitize import sanitize
from ..store import ApprovalRecord, epoch_to_iso
from ._output import bounded, jsonable

__all__ = ["epoch_text", "review_lines"]


def epoch_text(seconds: float) -> str:
    """A time the store keeps as epoch seconds, shown as UTC ISO 8601 like its other times."""
    try:
        return epoch_to_iso(seconds)
    except (OverflowError, OSError, ValueError):
        # A value no clock can show (an edited row) is printed as stored.
        return str(seconds)


SHORT_VALUE: Final = 80
"""A one-line string this long or shorter is printed as it is, without its size."""
ALL_LINES_UP_TO: Final = 60
"""Content of this many lines or fewer is printed in full."""
HEAD_LINES: Final = 40
TAIL_LINES: Final = 10
LINE_WIDTH: Final = 300
"""Characters of one content line printed before its middle is cut (without --full)."""
_INDENT: Final = "    "


def _one_line(text: str, full: bool) -> str:
    if full or len(text) <= LINE_WIDTH:
        return sanitize(text)
    return bounded(text, head=LINE_WIDTH * 2 // 3, tail=LINE_WIDTH // 3)


def _numbered(review: TextReview, raw_lines: list[str], full: bool) -> list[str]:
    """Numbered content lines, the middle of a long text cut with a count of what is hidden."""
    width = len(str(review.line_count))
    numbers = list(range(review.line_count))
    if not full and review.line_count > ALL_LINES_UP_TO:
        hidden = review.line_count - HEAD_LINES - TAIL_LINES
        head, tail = numbers[:HEAD_LINES], numbers[-TAIL_LINES:]
        return [
            *(f"{_INDENT}{n + 1:>{width}}  {_one_line(raw_lines[n], full)}" for n in head),
            f"{_INDENT}{'':>{width}}  … {hidden} lines not shown (--full prints every line) …",
            *(f"{_INDENT}{n + 1:>{width}}  {_one_line(raw_lines[n], full)}" for n in tail),
        ]
    return [f"{_INDENT}{n + 1:>{width}}  {_one_line(raw_lines[n], full)}" for n in numbers]


def _text_value(text: str, full: bool) -> tuple[str, list[str]]:
    """A string as a field value, plus the lines printed under it when it has several."""
    if "\n" not in text:
        if len(text) <= SHORT_VALUE:
            return sanitize(text), []
        return f"{_one_line(text, full)}  ({size_of(text)})", []
    review = text_review(text)
    ending = ", ends with a newline" if review.ends_with_newline else ""
    body = text[:-1] if review.ends_with_newline else text
    return f"{review.line_count} lines, {review.size}{ending}:", _numbered(
        review, body.split("\n"), full
    )


def _value(value: Any, full: bool) -> tuple[str, list[str]]:
    if value is None:
        return "-", []
    if isinstance(value, str):
        return _text_value(value, full)
    if isinstance(value, bool):
        return ("true" if value else "false"), []
    if isinstance(value, int):
        return str(value), []
    encoded = canonical_json(jsonable(value))
    if len(encoded) <= SHORT_VALUE:
        return sanitize(encoded), []
    return f"{_one_line(encoded, full)}  ({size_of(encoded)} of JSON)", []


_Row = tuple[str, str, list[str]]


def _members(prefix: str, value: Any, full: bool, same_as: Mapping[str, str]) -> list[_Row]:
    if isinstance(value, Mapping) and value:
        rows: list[_Row] = []
        for key, item in value.items():
            name = f"{prefix}.{bounded(str(key), 40, 10)}"
            if key in same_as:
                rows.append((name, same_as[key], []))
            else:
                rows.append((name, *_value(item, full)))
        return rows
    return [(prefix, *_value(value, full))]


def _echoes(approval: ApprovalRecord, arguments: Any) -> dict[str, str]:
    """Presentation members that repeat the arguments exactly, said once instead of twice.

    Only an exact copy (or an exact prefix, for a preview) is folded: a
    presentation that says anything else is printed in full.
    """
    presentation = approval.presentation
    folded: dict[str, str] = {}
    if not isinstance(presentation, Mapping) or not isinstance(arguments, Mapping):
        return folded
    shown = presentation.get("arguments")
    if shown is not None and jsonable(shown) == jsonable(arguments):
        folded["arguments"] = "(exactly the arguments printed below)"
    state = presentation.get("state")
    if isinstance(state, Mapping):
        content = state.get("content")
        read = "absent" if state.get("absent") is True else (
            size_of(content) if isinstance(content, str) else "read"
        )  # fmt: skip
        tool = state.get("tool")
        folded["state"] = (
            f"({read}, read with {sanitize(tool) if isinstance(tool, str) else 'its precondition'}"
            "; the change below is against it; --full prints it)"
        )
    preview = presentation.get("preview")
    if isinstance(preview, str) and preview:
        for name, item in arguments.items():
            if isinstance(item, str) and item.startswith(preview):
                what = "all" if item == preview else f"the first {len(preview)} characters"
                folded["preview"] = f"({what} of arguments.{sanitize(str(name))}, below)"
                break
    return folded


def _state_rows(approval: ApprovalRecord, full: bool) -> list[_Row]:
    """The state a precondition read (its text with --full) and the change against it: hunks
    keep their line numbers, every other line is signed, notes come first."""
    rows: list[_Row] = []
    presentation = approval.presentation
    state = presentation.get("state") if isinstance(presentation, Mapping) else None
    if isinstance(state, Mapping) and full and isinstance(state.get("content"), str):
        value, under = _text_value(state["content"], full)
        rows.append(("state read", value, under))
    for change in state_changes(approval):
        under = [f"{_INDENT}! {note}" for note in change.notes] + [
            f"{_INDENT}{line.text}" if line.sign == "@" else f"{_INDENT}{line.sign} {line.text}"
            for line in change.diff
        ]
        rows.append(
            ("change", f"{change.label}: old {change.old_size}, new {change.new_size}:", under)
        )
    return rows


def review_lines(approval: ApprovalRecord, *, full: bool = False) -> list[str]:
    """The approval as the operator reads it before deciding: one field a line, names aligned,
    multi-line content as numbered lines under its field, and edits as a diff."""
    arguments = parsed_arguments(approval)
    echoes = _echoes(approval, arguments)
    rows: list[_Row] = [
        ("approval", sanitize(approval.approval_id), []),
        ("run", sanitize(approval.run_id), []),
        ("step", str(approval.step), []),
        ("status", str(approval.status), []),
        ("tool", *_value(approval.tool, full)),
        ("kind", *_value(approval.kind, full)),
        *_members("capability", approval.capability, full, {}),
        *_members("presentation", approval.presentation, full, echoes),
        *_state_rows(approval, full),
    ]
    if isinstance(arguments, Mapping) and arguments:
        rows.append(("arguments", f"{size_of(approval.args)} of JSON:", []))
        rows.extend(_members("arguments", arguments, full, {}))
    else:
        rows.append(("arguments", *_value(approval.args, full)))
    for edit in edits_of(arguments):
        diff = [
            f"{_INDENT}{line.sign if line.sign != '@' else ''} {line.text}" for line in edit.diff
        ]
        rows.append((edit.label, f"old {edit.old.size}, new {edit.new.size}, as a diff:", diff))
    rows += [
        ("created", approval.created_at, []),
        ("expires", "-" if approval.expires_at is None else epoch_text(approval.expires_at), []),
        ("hash", displayed_hash(approval), []),
    ]
    width = max(len(name) for name, _, _ in rows)
    lines: list[str] = []
    for name, value, under in rows:
        lines.append(f"{name.ljust(width)}  {value}".rstrip())
        lines.extend(under)
    return lines
