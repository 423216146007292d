"""The vocabulary of a bench: a taxonomy's closed set of outcomes and their classes.

A taxonomy says, before any trial runs, every way a trial may end and how
that ending is judged: a `success`, a `safe_non_success` (the agent did not
get there but did no harm) or `unsafe`.  An outcome may be counted *over* the
trials that expected one kind of answer (a correct refusal is counted over
the trials that expected a refusal), so every count has a denominator that
means something.  A taxonomy that cannot tell success from harm is refused.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from ..canonical import json_string
from ..errors import AgentrtError
from ..sanitize import sanitize

__all__ = [
    "MAX_COUNT",
    "NAME_PATTERN",
    "BenchError",
    "Outcome",
    "OutcomeClass",
    "Taxonomy",
    "check_name",
    "shown",
]

MAX_COUNT: Final = 2**53 - 1
"""The largest count a results file holds; totals saturate here instead of growing past it.

It is the largest integer every JSON reader (a float64 one included) reads
exactly, so a file written here means the same number wherever it is read.
"""

NAME_PATTERN: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/@+-]{0,127}")
"""Taxonomy, outcome, expectation, mode and scenario names: no space, `|` or backtick,
so a name prints as itself in a Markdown table and on a terminal."""

_SHOWN_CHARACTERS: Final = 80


class BenchError(AgentrtError):
    """A taxonomy, results file or comparison was refused; the message names what and where."""


class OutcomeClass(StrEnum):
    """How an outcome is judged."""

    SUCCESS = "success"
    SAFE_NON_SUCCESS = "safe_non_success"
    UNSAFE = "unsafe"


def shown(text: str) -> str:
    """`text` as it is quoted in a refusal: JSON-quoted, cut when long, escaped."""
    if len(text) > _SHOWN_CHARACTERS:
        text = text[:_SHOWN_CHARACTERS] + "…"
    return sanitize(json_string(text))


def check_name(name: object, what: str) -> str:
    """`name` if it is a string matching `NAME_PATTERN`, else a `BenchError` naming `what`."""
    if not isinstance(name, str):
        raise BenchError(f"{what} must be a string")
    if NAME_PATTERN.fullmatch(name) is None:
        raise BenchError(
            f"{what} {shown(name)} is not a name (1-128 letters, digits and _.:/@+-, "
            "starting with a letter or digit)"
        )
    return name


@dataclass(frozen=True, slots=True)
class Outcome:
    """One way a trial may end: its name, its class, and the expectation it is counted over.

    `over` None counts the outcome over every judged trial; an expectation's
    name counts it over the judged trials that expected that kind of answer,
    and only such a trial may end in it.
    """

    name: str
    outcome_class: OutcomeClass
    over: str | None = None


@dataclass(frozen=True, slots=True)
class Taxonomy:
    """A named, closed set of outcomes; checked when it is made.

    Refused unless it has at least one success and one unsafe outcome, its
    names are names, none repeats, and every `over` is one of `expectations`.
    """

    name: str
    expectations: tuple[str, ...]
    outcomes: tuple[Outcome, ...]

    def __post_init__(self) -> None:
        check_name(self.name, "the taxonomy's name")
        where = f"taxonomy {shown(self.name)}"
        _refuse_repeats(
            (check_name(e, f"an expectation of {where}") for e in self.expectations),
            f"{where} lists the expectation",
        )
        _refuse_repeats(
            (check_name(o.name, f"an outcome of {where}") for o in self.outcomes),
            f"{where} lists the outcome",
        )
        for outcome in self.outcomes:
            if outcome.over is not None and outcome.over not in self.expectations:
                raise BenchError(
                    f"outcome {shown(outcome.name)} of {where} is counted over "
                    f"{shown(outcome.over)}, which is not one of its expectations"
                )
        classes = {outcome.outcome_class for outcome in self.outcomes}
        for needed in (OutcomeClass.SUCCESS, OutcomeClass.UNSAFE):
            if needed not in classes:
                raise BenchError(
                    f"{where} has no {needed.value} outcome; a taxonomy needs at least "
                    "one success and one unsafe outcome"
                )

    def outcome(self, name: str) -> Outcome | None:
        """The outcome called `name`, or None when this taxonomy has none by that name."""
        for outcome in self.outcomes:
            if outcome.name == name:
                return outcome
        return None


def _refuse_repeats(names: Iterable[str], said: str) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise BenchError(f"{said} {shown(name)} twice")
        seen.add(name)
