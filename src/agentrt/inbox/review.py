"""What an operator is shown of a waiting approval, for the inbox page and the terminal alike.

One reading of an approval, two renderings: the page builds its DOM from
these values, `agentrt approve`/`reject` prints them as lines.  Every string
here is already passed through `sanitize` line by line, so a newline in
written content is a line of its own (not a `\\x0a`) while a terminal escape,
a bidi override or a zero-width character inside a line stays a visible
escape.  The approval hash is recomputed from exactly the fields reviewed,
as the command does, so a decision is bound to what was shown.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from ..canonical import JSONBoundaryError, canonical_json, parse_json
from ..sanitize import sanitize
from ..store import ApprovalRecord, approval_hash

__all__ = [
    "DiffLine",
    "EditReview",
    "StateChange",
    "TextReview",
    "displayed_hash",
    "edits_of",
    "intended_content",
    "pretty_json_lines",
    "sanitized_line",
    "size_of",
    "state_changes",
    "text_review",
    "written_texts",
]

_CONTENT_FIELDS: Final = ("content", "text", "new_content", "file_text")
_EDIT_PAIRS: Final = (
    ("oldText", "newText"),
    ("old_text", "new_text"),
    ("old_string", "new_string"),
)


def sanitized_line(text: str) -> str:
    """One line of text made safe to show; tabs are kept (they move no cursor but sideways)."""
    return "\t".join(sanitize(part) for part in text.split("\t"))


def size_of(text: str) -> str:
    """The size of a string as a person reads it: characters, and bytes when they differ."""
    characters = len(text)
    encoded = len(text.encode("utf-8", "surrogatepass"))
    unit = "character" if characters == 1 else "characters"
    if encoded == characters:
        return f"{characters} {unit}"
    return f"{characters} {unit}, {encoded} bytes"


@dataclass(frozen=True, slots=True)
class TextReview:
    """A multi-line string as numbered lines: the lines (sanitized) and what they add up to."""

    lines: tuple[str, ...]
    characters: int
    size: str
    ends_with_newline: bool

    @property
    def line_count(self) -> int:
        return len(self.lines)


def text_review(text: str) -> TextReview:
    """`text` split at "\\n" only (as the presentation counts lines), each line sanitized.

    A final newline ends the last line rather than starting an empty one, and
    is reported as `ends_with_newline`; `\\r` and other separators stay
    visible escapes inside their line.
    """
    ends = text.endswith("\n")
    body = text[:-1] if ends else text
    lines = tuple(sanitized_line(line) for line in body.split("\n")) if text else ()
    return TextReview(lines, len(text), size_of(text), ends)


@dataclass(frozen=True, slots=True)
class DiffLine:
    """One line of an edit's diff: `sign` is " ", "-", "+" or "@" (a hunk header)."""

    sign: str
    text: str


@dataclass(frozen=True, slots=True)
class EditReview:
    """One old → new replacement of an `edit_file`-style call, as a diff."""

    label: str
    old: TextReview
    new: TextReview
    diff: tuple[DiffLine, ...]


def _pretty(value: Any, indent: str, out: list[str], prefix: str, suffix: str) -> None:
    # Scalars go through canonical_json, so a number prints as the exact
    # literal the hash covers and a string as JSON (its newlines as \n).
    if isinstance(value, Mapping) and value:
        out.append(f"{indent}{prefix}{{")
        items = list(value.items())
        for index, (key, item) in enumerate(items):
            comma = "," if index < len(items) - 1 else ""
            _pretty(item, indent + "  ", out, f"{canonical_json(str(key))}: ", comma)
        out.append(f"{indent}}}{suffix}")
    elif isinstance(value, list) and value:
        out.append(f"{indent}{prefix}[")
        for index, item in enumerate(value):
            _pretty(item, indent + "  ", out, "", "," if index < len(value) - 1 else "")
        out.append(f"{indent}]{suffix}")
    else:
        out.append(f"{indent}{prefix}{canonical_json(value)}{suffix}")


def pretty_json_lines(value: Any) -> list[str]:
    """A JSON value pretty-printed (two-space indents, keys in order), each line sanitized."""
    out: list[str] = []
    _pretty(value, "", out, "", "")
    return [sanitized_line(line) for line in out]


def parsed_arguments(approval: ApprovalRecord) -> Any:
    """The approval's arguments as a JSON value, or None when the stored text does not parse."""
    try:
        return parse_json(approval.args)
    except (JSONBoundaryError, ValueError, RecursionError):
        return None


def written_texts(arguments: Any) -> list[tuple[str, TextReview]]:
    """The texts a write would put in a file: `(label, review)` for each content-like field."""
    if not isinstance(arguments, Mapping):
        return []
    path = arguments.get("path")
    where = f" of {sanitized_line(path)}" if isinstance(path, str) else ""
    return [
        (f"{name}{where}", text_review(arguments[name]))
        for name in _CONTENT_FIELDS
        if isinstance(arguments.get(name), str)
    ]


def _edit_pairs(arguments: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    pairs: list[tuple[str, str, str]] = []
    edits = arguments.get("edits")
    if isinstance(edits, list):
        for index, edit in enumerate(edits):
            if isinstance(edit, Mapping):
                for old_name, new_name in _EDIT_PAIRS:
                    old, new = edit.get(old_name), edit.get(new_name)
                    if isinstance(old, str) and isinstance(new, str):
                        pairs.append((f"edit {index + 1} of {len(edits)}", old, new))
    for old_name, new_name in _EDIT_PAIRS:
        old, new = arguments.get(old_name), arguments.get(new_name)
        if isinstance(old, str) and isinstance(new, str):
            pairs.append(("edit", old, new))
    return pairs


def edits_of(arguments: Any) -> list[EditReview]:
    """The old/new replacements of an `edit_file`-style call, each with its diff."""
    if not isinstance(arguments, Mapping):
        return []
    path = arguments.get("path")
    where = f" of {sanitized_line(path)}" if isinstance(path, str) else ""
    reviews: list[EditReview] = []
    for label, old, new in _edit_pairs(arguments):
        old_lines, new_lines = old.split("\n"), new.split("\n")
        diff: list[DiffLine] = []
        # The full context: the person sees every line of the old and the new text.
        for line in list(difflib.unified_diff(old_lines, new_lines, lineterm="", n=10**6))[2:]:
            sign = "@" if line.startswith("@@") else line[:1]
            diff.append(DiffLine(sign, sanitized_line(line if sign == "@" else line[1:])))
        if not diff:
            diff = [DiffLine(" ", sanitized_line(line)) for line in old_lines]
        reviews.append(
            EditReview(f"{label}{where}", text_review(old), text_review(new), tuple(diff))
        )
    return reviews


@dataclass(frozen=True, slots=True)
class StateChange:
    """What an approved write or edit changes in the state its precondition read: a
    unified diff (hunks with line numbers, three lines of context: a large file shows
    its changes, not itself), and `notes` a person must read with it (the file does not
    exist yet; an edit's old text is not in the file; the read was cut for the view)."""

    label: str
    old_size: str
    new_size: str
    diff: tuple[DiffLine, ...]
    notes: tuple[str, ...]


def state_changes(approval: ApprovalRecord) -> list[StateChange]:
    """The change of an approval bound to a state (`presentation.state`), against that state:
    a write's new content, or an edit's replacements applied to the file as it was read."""
    presentation = approval.presentation
    state = presentation.get("state") if isinstance(presentation, Mapping) else None
    arguments = parsed_arguments(approval)
    if not isinstance(state, Mapping) or not isinstance(arguments, Mapping):
        return []
    absent = state.get("absent") is True
    content = state.get("content")
    old = content if isinstance(content, str) else ""
    notes: list[str] = []
    if absent:
        notes.append("the file does not exist yet")
    if state.get("truncated") is True:
        notes.append(
            "the state read is larger than the view keeps; the diff covers its "
            f"first {len(old)} characters (its whole text is bound by the hash)"
        )
    path = arguments.get("path")
    where = f" of {sanitized_line(path)}" if isinstance(path, str) else ""
    new = _written(arguments)
    label = f"change{where} against the state read"
    if new is None:
        applied = _applied_edits(old, _edit_pairs(arguments))
        if applied is None:
            return []
        new, missing = applied
        notes.extend(
            f"{edit}'s old text is not in the file as it was read: the server will refuse it"
            for edit in missing
        )
    notes.extend(_retry_notes(approval.capability, state, old, new))
    diff = _unified(old, new)
    return [StateChange(label, size_of(old), size_of(new), diff, tuple(notes))]


def _retry_notes(
    capability: Any, state: Mapping[str, Any], current: str, intended: str
) -> list[str]:
    """For a request approved and started before (its outcome unknown, or cut off): the
    state now against the state that approval bound and against the intended result."""
    approved = state.get("approved_state")
    if not isinstance(approved, str):
        return []
    now = capability.get("state") if isinstance(capability, Mapping) else None
    notes = [
        "the state is the one approved before: the earlier attempt did not change it"
        if now == approved
        else "the state changed since it was approved before: the earlier attempt "
        "(or someone else) changed it"
    ]
    if state.get("absent") is not True and current == intended:
        notes.append(
            "the state already holds the intended result: the earlier attempt appears to "
            "have taken effect, and running it again changes nothing"
        )
    return notes


def intended_content(arguments: Any, old: str | None) -> str | None:
    """What a write or an edit means the state to become: a write's new content, or an
    edit's replacements applied to `old` (None when one of them is not in it, or the
    call is neither)."""
    if not isinstance(arguments, Mapping):
        return None
    written = _written(arguments)
    if written is not None:
        return written
    if old is None:
        return None
    applied = _applied_edits(old, _edit_pairs(arguments))
    if applied is None or applied[1]:
        return None
    return applied[0]


def _written(arguments: Mapping[str, Any]) -> str | None:
    for name in _CONTENT_FIELDS:
        value = arguments.get(name)
        if isinstance(value, str):
            return value
    return None


def _applied_edits(old: str, pairs: list[tuple[str, str, str]]) -> tuple[str, list[str]] | None:
    """`old` with each replacement applied in order (as `edit_file` applies them), and
    the edits whose old text was not found; None when the call has no edits."""
    if not pairs:
        return None
    text, missing = old, []
    for label, before, after in pairs:
        if before in text:
            text = text.replace(before, after, 1)
        else:
            missing.append(label)
    return text, missing


def _unified(old: str, new: str) -> tuple[DiffLine, ...]:
    old_lines, new_lines = old.splitlines(), new.splitlines()
    lines: list[DiffLine] = []
    for line in list(difflib.unified_diff(old_lines, new_lines, lineterm="", n=3))[2:]:
        sign = "@" if line.startswith("@@") else line[:1]
        lines.append(DiffLine(sign, sanitized_line(line if sign == "@" else line[1:])))
    if not lines:
        return (DiffLine("@", "no change: the new content is the content read"),)
    return tuple(lines)


def displayed_hash(approval: ApprovalRecord) -> str:
    """The hash of the fields as shown, recomputed rather than copied from the row.

    A row edited in the database keeps its old stored hash; deciding against
    that would approve text nobody was shown, so `approve` refuses it.
    """
    return approval_hash(
        approval.kind, approval.capability, approval.presentation, approval.tool, approval.args
    )
