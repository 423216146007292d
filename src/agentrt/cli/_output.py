"""How the command prints: aligned text for a person, JSON Lines for a program.

Text output passes every value a model or a server chose through `sanitize`,
so a goal carrying a terminal escape or a bidi override prints as visible
escapes.  JSON Lines are pure printable ASCII for the same reason: every
character outside it is written as a JSON `\\u` escape, which a program
decodes back to the original and a terminal shows as harmless text.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

import click

from ..canonical import canonical_json
from ..sanitize import sanitize
from ..trace import ascii_only

__all__ = [
    "BOUND_HEAD",
    "BOUND_TAIL",
    "Output",
    "ascii_json",
    "ascii_only",
    "bounded",
    "flatten",
    "jsonable",
    "size_of",
    "value_field",
]

BOUND_HEAD: Final = 160
"""Characters of a long value printed before the cut."""
BOUND_TAIL: Final = 60
"""Characters of a long value printed after the cut."""


def jsonable(value: Any) -> Any:
    """Turn records (frozen dataclasses), enums and tuples into plain JSON values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            field.name: jsonable(getattr(value, field.name)) for field in dataclasses.fields(value)
        }
    if isinstance(value, enum.Enum):
        return jsonable(value.value)
    if isinstance(value, Mapping):
        return {str(key): jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(item) for item in value]
    return value


def ascii_json(value: Any) -> str:
    """One JSON value on one line, printable ASCII only, numbers kept as their literals.

    Built on `canonical_json` (sorted keys, exact numbers); only strings can
    hold characters outside printable ASCII, and there a `\\u` escape means
    the same character, so the text decodes to the same value.
    """
    return ascii_only(canonical_json(jsonable(value)))


def bounded(text: str, head: int = BOUND_HEAD, tail: int = BOUND_TAIL) -> str:
    """`text` sanitized, its middle cut when it is longer than `head + tail` characters.

    The cut is made before escaping, so what is hidden is counted in the
    characters the model or server sent, not in escapes.
    """
    if len(text) <= head + tail:
        return sanitize(text)
    omitted = len(text) - head - tail
    return f"{sanitize(text[:head])} …[{omitted} characters not shown]… {sanitize(text[-tail:])}"


def size_of(text: str) -> str:
    """The size of a string as a person reads it: characters, and bytes when they differ."""
    characters = len(text)
    encoded = len(text.encode("utf-8", "surrogatepass"))
    unit = "character" if characters == 1 else "characters"
    if encoded == characters:
        return f"{characters} {unit}"
    return f"{characters} {unit}, {encoded} bytes"


class Output:
    """Where a subcommand prints: `json` picks JSON Lines over aligned text."""

    def __init__(self, *, json: bool) -> None:
        self.json = json

    def line(self, text: str = "") -> None:
        """Print one line of text the command wrote (callers sanitize what others chose)."""
        click.echo(text)

    def record(self, value: Any) -> None:
        """Print one JSON object as one line."""
        click.echo(ascii_json(value))

    def json_text(self, json_text: str) -> None:
        """Print JSON text another module encoded, as one printable-ASCII line."""
        click.echo(ascii_only(json_text))

    def table(self, headers: Sequence[str], rows: Iterable[Sequence[str]]) -> None:
        """Print rows as aligned columns; the last column is never padded.

        Cells must already be sanitized: padding is counted in characters, and
        an escape sequence would make the columns lie about their width.
        """
        materialized = [list(row) for row in rows]
        widths = [len(header) for header in headers]
        for row in materialized:
            for index, cell in enumerate(row):
                widths[index] = max(widths[index], len(cell))
        for row in [list(headers), *materialized]:
            padded = [cell.ljust(widths[index]) for index, cell in enumerate(row[:-1])]
            click.echo("  ".join([*padded, row[-1]]).rstrip())

    def fields(self, pairs: Sequence[tuple[str, str]]) -> None:
        """Print one `name  value` pair a line, names aligned; values must be sanitized."""
        width = max((len(name) for name, _ in pairs), default=0)
        for name, value in pairs:
            click.echo(f"{name.ljust(width)}  {value}".rstrip())


def value_field(value: Any) -> str:
    """A value shown in a field line: a string bounded with its size; anything else as
    JSON (bounded) with its size; None as `-`."""
    if value is None:
        return "-"
    if isinstance(value, str):
        return f"{bounded(value)}  ({size_of(value)})"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    encoded = canonical_json(jsonable(value))
    return f"{bounded(encoded)}  ({size_of(encoded)} of JSON)"


def flatten(prefix: str, value: Any) -> list[tuple[str, str]]:
    """Field lines for a JSON value: an object's members one a line (one level deep,
    `prefix.member`), anything else as one line."""
    if isinstance(value, Mapping) and value:
        return [
            (f"{prefix}.{bounded(str(key), 40, 10)}", value_field(item))
            for key, item in value.items()
        ]
    return [(prefix, value_field(value))]
