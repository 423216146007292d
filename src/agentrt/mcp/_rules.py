"""The operator's classification of a server's tools: `Rule`, and `FileRule`, its file form."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Final, TypeAlias

from ..canonical import JSONBoundaryError, parse_json
from ..sanitize import sanitize
from ..tools import SideEffect
from ._errors import OperatorFileError

__all__ = ["FileRule", "Rule", "Rules", "parse_duration", "rules_from_json"]


@dataclass(frozen=True, slots=True)
class Rule:
    """How the operator classifies one of a server's tools.

    `side_effect` is the operator's judgement; nothing the server says
    replaces it.  `timeout` (seconds) bounds one call, else the server's
    `default_timeout` does.  `description` replaces the server's in what the
    model sees.  `deny` and `fixed` hide top-level parameters from the model;
    `fixed` maps a parameter to raw JSON text injected into every call.
    `rename` replaces the final name `<server>_<tool>`.  With
    `allow_hint_mismatch` a tool whose annotations contradict `side_effect`
    registers anyway and the report records the contradiction.
    """

    side_effect: SideEffect
    timeout: float | None = None
    terminal: bool = False
    description: str | None = None
    deny: list[str] = field(default_factory=list)
    fixed: dict[str, str] = field(default_factory=dict)
    rename: str | None = None
    allow_hint_mismatch: bool = False

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "side_effect", SideEffect(self.side_effect))
        except ValueError:
            raise ValueError(
                f"a rule's side_effect must be one of {_SIDE_EFFECTS}, "
                f"not {sanitize(repr(self.side_effect))}"
            ) from None
        if self.timeout is not None and not (
            isinstance(self.timeout, (int, float)) and math.isfinite(self.timeout)
        ):
            raise ValueError(f"a rule's timeout must be a number of seconds, not {self.timeout!r}")
        if self.timeout is not None and self.timeout <= 0:
            raise ValueError(f"a rule's timeout must be positive, not {self.timeout!r}")
        for name in self.deny:
            if not isinstance(name, str):
                raise ValueError(f"a rule's deny entry {sanitize(repr(name))} is not a string")
        for name, value in self.fixed.items():
            if not isinstance(name, str) or not isinstance(value, str):
                raise ValueError(
                    f"a rule's fixed entry {sanitize(repr(name))} must map a name to JSON text"
                )


Rules: TypeAlias = dict[str, Rule]
"""Rules for one server, keyed by the server's own tool names."""

_SIDE_EFFECTS: Final = ", ".join(effect.value for effect in SideEffect)

_DURATION_PART: Final = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_UNIT_SECONDS: Final = {
    "ns": Decimal("1e-9"),
    "us": Decimal("1e-6"),
    "µs": Decimal("1e-6"),
    "μs": Decimal("1e-6"),
    "ms": Decimal("1e-3"),
    "s": Decimal(1),
    "m": Decimal(60),
    "h": Decimal(3600),
}


def parse_duration(text: str) -> float:
    """Parse a Go-style duration (`"5s"`, `"1m30s"`, `"250ms"`) into positive seconds."""
    if not isinstance(text, str) or not text:
        raise ValueError(f'{sanitize(repr(text))} is not a duration such as "5s" or "1m30s"')
    position = 0
    total = Decimal(0)
    while position < len(text):
        match = _DURATION_PART.match(text, position)
        if match is None:
            raise ValueError(f'{sanitize(repr(text))} is not a duration such as "5s" or "1m30s"')
        total += Decimal(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        position = match.end()
    if total <= 0:
        raise ValueError(f"the duration {sanitize(repr(text))} is not positive")
    return float(total)


_FILE_RULE_FIELDS: Final = (
    "side_effect",
    "timeout",
    "terminal",
    "description",
    "deny",
    "fixed",
    "rename",
    "allow_hint_mismatch",
    "when",
)


@dataclass(frozen=True, slots=True)
class FileRule:
    """One rule as a rules file writes it: durations are strings, fixed values are JSON."""

    side_effect: str
    timeout: str | None = None
    terminal: bool = False
    description: str | None = None
    deny: list[str] = field(default_factory=list)
    fixed: dict[str, Any] = field(default_factory=dict)
    rename: str | None = None
    allow_hint_mismatch: bool = False
    # The proxy's conditions, as written; the proxy compiles them (the rule itself never sees them).
    when: list[Any] = field(default_factory=list)

    def to_rule(self, *, conditions_handled: bool = False) -> Rule:
        """The `Rule` this file entry describes (fixed values as canonical JSON text).

        A rule with conditions is refused unless the caller evaluates them
        (`conditions_handled`): `load` alone would drop them, and a condition
        meant to hold a call back must never be silently ignored.
        """
        from ..canonical import canonical_json

        if self.when and not conditions_handled:
            raise ValueError(
                'this rule has conditions ("when"), which only agentrt proxy evaluates'
            )

        return Rule(
            side_effect=SideEffect(self.side_effect),
            timeout=None if self.timeout is None else parse_duration(self.timeout),
            terminal=self.terminal,
            description=self.description,
            deny=list(self.deny),
            fixed={name: canonical_json(value) for name, value in self.fixed.items()},
            rename=self.rename,
            allow_hint_mismatch=self.allow_hint_mismatch,
        )


def rules_from_json(data: bytes | str, *, source: str = "the rules") -> dict[str, FileRule]:
    """Parse a rules document: a JSON object of tool name → `FileRule`.

    Refused, naming the field and `source`: a repeated key, an unknown field,
    a field of the wrong type, a side effect or duration that does not parse.
    """
    try:
        document = parse_json(data)
    except JSONBoundaryError as exc:
        raise OperatorFileError(f"{source} is not usable JSON: {sanitize(str(exc))}") from None
    if not isinstance(document, dict):
        raise OperatorFileError(f"{source} must be a JSON object of tool name to rule")
    rules: dict[str, FileRule] = {}
    for tool, entry in document.items():
        rules[tool] = _file_rule(tool, entry, source)
    return rules


def _file_rule(tool: str, entry: Any, source: str) -> FileRule:
    where = f'the rule for "{sanitize(tool)}" in {source}'
    if not isinstance(entry, dict):
        raise OperatorFileError(f"{where} is not a JSON object")
    for key in entry:
        if key not in _FILE_RULE_FIELDS:
            raise OperatorFileError(f'{where} has the unknown field "{sanitize(key)}"')
    if "side_effect" not in entry:
        raise OperatorFileError(f'{where} has no "side_effect"')
    side_effect = entry["side_effect"]
    if side_effect not in tuple(SideEffect):
        raise OperatorFileError(
            f'{where}: "side_effect" must be one of {_SIDE_EFFECTS}, '
            f"not {sanitize(repr(side_effect))}"
        )
    timeout = _optional(entry, "timeout", str, where)
    if timeout is not None:
        try:
            parse_duration(timeout)
        except ValueError as exc:
            raise OperatorFileError(f'{where}: "timeout" {exc}') from None
    deny = entry.get("deny", [])
    if not isinstance(deny, list) or not all(isinstance(name, str) for name in deny):
        raise OperatorFileError(f'{where}: "deny" must be a list of parameter names')
    fixed = entry.get("fixed", {})
    if not isinstance(fixed, Mapping):
        raise OperatorFileError(f'{where}: "fixed" must be an object of parameter to value')
    when = entry.get("when", [])
    if not isinstance(when, list):
        raise OperatorFileError(f'{where}: "when" must be a list of conditions')
    return FileRule(
        side_effect=str(side_effect),
        timeout=timeout,
        terminal=_flag(entry, "terminal", where),
        description=_optional(entry, "description", str, where),
        deny=list(deny),
        fixed=dict(fixed),
        rename=_optional(entry, "rename", str, where),
        allow_hint_mismatch=_flag(entry, "allow_hint_mismatch", where),
        when=list(when),
    )


def _optional(entry: dict[str, Any], key: str, kind: type[str], where: str) -> str | None:
    value = entry.get(key)
    if value is not None and not isinstance(value, kind):
        raise OperatorFileError(f'{where}: "{key}" must be a string')
    return value


def _flag(entry: dict[str, Any], key: str, where: str) -> bool:
    value = entry.get(key, False)
    if not isinstance(value, bool):
        raise OperatorFileError(f'{where}: "{key}" must be true or false')
    return value
