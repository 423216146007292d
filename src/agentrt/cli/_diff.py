"""What changed between two pins of a server: the review a re-pin asks a person to make.

A changed description is where a prompt injection arrives, so the review
shows it word by word; a changed schema as the paths of the keys that
changed, with old and new values; changed hints as the server's claims.
Every piece of text the server chose is escaped with `sanitize` here, so a
caller prints the lines as they are.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Final

from ..canonical import canonical_json, parse_json
from ..mcp import Manifest, PinnedTool
from ..sanitize import sanitize
from ._output import bounded

__all__ = ["ToolChange", "manifest_changes"]

_WORDS: Final = re.compile(r"\s+|[^\s]+")
_VALUE_HEAD: Final = 60
_VALUE_TAIL: Final = 20
# The marks word_diff draws, each made inert in the server's own text (a
# backslash before its sign), so no wording can open or close one itself.
_MARKS: Final = (("[-", "[\\-"), ("-]", "\\-]"), ("{+", "{\\+"), ("+}", "\\+}"))


@dataclass(frozen=True, slots=True)
class ToolChange:
    """One tool's difference between the pin it replaces and the new one.

    `kind` is `added`, `removed` or `changed`; `lines` are escaped and ready to print.
    """

    tool: str
    kind: str
    lines: list[str] = field(default_factory=list)
    what: str = "tool"
    """What changed: `tool`, or a `prompt`, `resource` or `resource template`."""


def manifest_changes(
    old: Manifest, new: Manifest, *, only: set[str] | None = None
) -> list[ToolChange]:
    """Every tool that differs between `old` and `new` (limited to `only` when given).

    An empty list means the server presents exactly what was pinned.
    """
    changes: list[ToolChange] = []
    for name in sorted(set(old.tools) | set(new.tools)):
        if only is not None and name not in only:
            continue
        before, after = old.tools.get(name), new.tools.get(name)
        if before is None and after is not None:
            changes.append(ToolChange(name, "added", _added_lines(after)))
        elif after is None:
            changes.append(ToolChange(name, "removed", ["no longer offered by the server"]))
        elif before is not None:
            lines = _changed_lines(before, after)
            if lines:
                changes.append(ToolChange(name, "changed", lines))
    if only is None:
        changes += _offer_changes(old, new)
        changes += _app_changes(old, new)
    return changes


def _app_changes(old: Manifest, new: Manifest) -> list[ToolChange]:
    """MCP Apps whose contents or tools differ: the HTML is not in the manifest, so the
    review names the change and asks for the app itself to be read."""
    changes: list[ToolChange] = []
    before_all, after_all = old.apps or {}, new.apps or {}
    for uri in sorted(set(before_all) | set(after_all)):
        before, after = before_all.get(uri), after_all.get(uri)
        if after is not None and (before is None or before.content_hash != after.content_hash):
            lines = [
                f"contents SHA-256 {after.content_hash[:16]}…; read the app "
                "(resources/read of its URI) before you agree",
                f"named by: {', '.join(sanitize(tool) for tool in after.tools) or 'no tool'}",
            ]
            changes.append(ToolChange(uri, "added" if before is None else "changed", lines, "app"))
        elif after is None:
            changes.append(ToolChange(uri, "removed", ["no longer named or offered"], "app"))
        elif before is not None and before.tools != after.tools:
            named = ", ".join(sanitize(tool) for tool in after.tools) or "no tool"
            changes.append(ToolChange(uri, "changed", [f"named by: {named}"], "app"))
    return changes


_OFFER_NOUNS: Final = {
    "prompts": "prompt",
    "resources": "resource",
    "resource_templates": "resource template",
}


def _offer_changes(old: Manifest, new: Manifest) -> list[ToolChange]:
    """Prompts, resources and templates that differ; a manifest from before they were pinned
    counts as pinning none, so a re-pin over it adds them (and asks for the review)."""
    changes: list[ToolChange] = []
    for section, noun in _OFFER_NOUNS.items():
        before_pins, after_pins = old.offers(section), new.offers(section)
        if before_pins is None and after_pins is not None and not after_pins:
            # Newly looked at and empty: still written, so the manifest says so.
            changes.append(ToolChange(section, "added", ["the server offers none"], noun + "s"))
            continue
        before_all, after_all = before_pins or {}, after_pins or {}
        for key in sorted(set(before_all) | set(after_all)):
            before, after = before_all.get(key), after_all.get(key)
            if before is None and after is not None:
                lines = [f"description: {sanitize(after.description)}"]
                changes.append(ToolChange(key, "added", lines, noun))
            elif after is None:
                changes.append(ToolChange(key, "removed", ["no longer offered"], noun))
            elif before is not None and before != after:
                lines = []
                if before.description != after.description:
                    lines.append(f"description: {word_diff(before.description, after.description)}")
                if before.shape_hash != after.shape_hash:
                    lines.append("arguments changed" if noun == "prompt" else "listing changed")
                if before.name != after.name:
                    lines.append(f"name: {sanitize(before.name)} -> {sanitize(after.name)}")
                changes.append(ToolChange(key, "changed", lines, noun))
    return changes


def _added_lines(tool: PinnedTool) -> list[str]:
    return [
        f"description: {sanitize(tool.description)}",
        f"hints (the server's claims): {_hint_text(tool.annotations)}",
    ]


def _changed_lines(before: PinnedTool, after: PinnedTool) -> list[str]:
    lines: list[str] = []
    if before.description != after.description:
        lines.append(f"description: {word_diff(before.description, after.description)}")
    if before.input_schema != after.input_schema:
        lines.append("input schema:")
        lines += [
            f"  {line}"
            for line in json_diff(parse_json(before.input_schema), parse_json(after.input_schema))
        ]
    old_hints, new_hints = before.annotations or {}, after.annotations or {}
    for key in sorted(set(old_hints) | set(new_hints)):
        if key in old_hints and key in new_hints and old_hints[key] == new_hints[key]:
            continue
        lines.append(
            f"hint {sanitize(key)} (the server's claim): "
            f"{_value(old_hints, key)} -> {_value(new_hints, key)}"
        )
    return lines


def _words(text: str) -> str:
    shown = sanitize(text)
    # In this order, no replacement can make a mark another one removed.
    for mark, inert in _MARKS:
        shown = shown.replace(mark, inert)
    return shown


def word_diff(old: str, new: str) -> str:
    """`old` against `new` word by word: removed words as `[-…-]`, added ones as `{+…+}`.

    A mark inside the server's text is shown with a backslash (`[\\-`, `\\+}`),
    so a description cannot close the added mark and pass new words off as removed.
    """
    before, after = _WORDS.findall(old), _WORDS.findall(new)
    pieces: list[str] = []
    matcher = difflib.SequenceMatcher(a=before, b=after, autojunk=False)
    for operation, a_start, a_end, b_start, b_end in matcher.get_opcodes():
        removed = "".join(before[a_start:a_end])
        added = "".join(after[b_start:b_end])
        if operation == "equal":
            pieces.append(_words(removed))
            continue
        if removed:
            pieces.append(f"[-{_words(removed)}-]")
        if added:
            pieces.append(f"{{+{_words(added)}+}}")
    return "".join(pieces)


def json_diff(old: Any, new: Any) -> list[str]:
    """One line per changed key: its path, then `added`, `removed` or old `->` new."""
    return list(_json_diff(old, new, ""))


def _json_diff(old: Any, new: Any, path: str) -> Iterator[str]:
    shown = path or "(the whole schema)"
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new)):
            child = f"{path}.{key}" if path else str(key)
            if key not in old:
                yield f"{sanitize(child)}: added {_json(new[key])}"
            elif key not in new:
                yield f"{sanitize(child)}: removed (was {_json(old[key])})"
            else:
                yield from _json_diff(old[key], new[key], child)
        return
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        for index, (before, after) in enumerate(zip(old, new, strict=True)):
            yield from _json_diff(before, after, f"{path}[{index}]")
        return
    if canonical_json(old) != canonical_json(new):
        yield f"{sanitize(shown)}: {_json(old)} -> {_json(new)}"


def _json(value: Any) -> str:
    return bounded(canonical_json(value), _VALUE_HEAD, _VALUE_TAIL)


def _value(hints: dict[str, Any], key: str) -> str:
    return _json(hints[key]) if key in hints else "(absent)"


def _hint_text(annotations: dict[str, Any] | None) -> str:
    if not annotations:
        return "none"
    return " ".join(f"{sanitize(key)}={_json(annotations[key])}" for key in sorted(annotations))
