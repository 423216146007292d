"""Results files side by side, as Markdown: one column per mode of each file.

Only files scored against the same taxonomy compare (a count means nothing
next to a count of another vocabulary), and only files of one commit unless
the caller allows mixed commits; every column names its commit either way.
Counts are shown as `count of denominator`, never as a rate.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from ..canonical import canonical_json
from ..sanitize import sanitize
from ._file import taxonomy_json
from ._results import TALLY_FIELDS, Count, Mode, Results, Summary, summarize
from ._vocabulary import MAX_COUNT, BenchError, OutcomeClass, shown

__all__ = ["compare_markdown"]

_SHORT_COMMIT: Final = 12
_MARKDOWN_SPECIAL: Final = re.compile(r"([\\`*_{}\[\]<>()#+!|~])")


@dataclass(frozen=True, slots=True)
class _Column:
    number: int
    source: str
    commit: str
    mode: Mode
    summary: Summary


def compare_markdown(files: Sequence[tuple[str, Results]], allow_mixed_commits: bool) -> str:
    """A Markdown report putting every mode of every file side by side.

    `files` pairs each file's name (as the operator gave it) with its
    results.  Raises `BenchError` when the files' taxonomies differ, or their
    commits differ and `allow_mixed_commits` is false.
    """
    if not files:
        raise BenchError("no results file to compare")
    first_source, first = files[0]
    for source, results in files[1:]:
        _check_comparable(first_source, first, source, results, allow_mixed_commits)
    columns: list[_Column] = []
    for source, results in files:
        for mode in results.modes:
            columns.append(
                _Column(
                    number=len(columns) + 1,
                    source=source,
                    commit=results.commit,
                    mode=mode,
                    summary=summarize(results.taxonomy, mode),
                )
            )
    return "\n".join(_report(first, columns)) + "\n"


def _check_comparable(
    first_source: str, first: Results, source: str, results: Results, allow_mixed_commits: bool
) -> None:
    if results.taxonomy.name != first.taxonomy.name:
        raise BenchError(
            f"{sanitize(source)} is scored against taxonomy {shown(results.taxonomy.name)} but "
            f"{sanitize(first_source)} against {shown(first.taxonomy.name)}; only files of one "
            "taxonomy compare"
        )
    if canonical_json(taxonomy_json(results.taxonomy)) != canonical_json(
        taxonomy_json(first.taxonomy)
    ):
        raise BenchError(
            f"{sanitize(source)} defines taxonomy {shown(results.taxonomy.name)} differently "
            f"from {sanitize(first_source)}; only files of one taxonomy compare"
        )
    if results.commit != first.commit and not allow_mixed_commits:
        raise BenchError(
            f"{sanitize(source)} measured commit {results.commit} but {sanitize(first_source)} "
            f"measured commit {first.commit}; pass --allow-mixed-commits to compare them anyway"
        )


def _report(results: Results, columns: list[_Column]) -> list[str]:
    taxonomy = results.taxonomy
    lines = [
        f"# Bench comparison: taxonomy `{taxonomy.name}`",
        "",
        "Columns:",
        "",
    ]
    for column in columns:
        lines.append(
            f"{column.number}. mode `{column.mode.name}` of {_markdown_text(column.source)} "
            f"at commit `{column.commit}`"
        )
    if len({column.commit for column in columns}) > 1:
        lines += ["", "**Mixed commits:** these columns measure different code."]
    heads = [
        f"{column.number}: `{column.mode.name}` @ `{column.commit[:_SHORT_COMMIT]}`"
        for column in columns
    ]
    lines += ["", "## Trials", "", *_table(["", *heads], ["---"] + ["---:"] * len(columns))]
    lines += _row("trials", [str(column.summary.trials) for column in columns])
    lines += _row("excluded", [str(column.summary.excluded) for column in columns])
    lines += _row("judged", [str(column.summary.judged) for column in columns])
    lines += _row("disqualified", [_disqualified(column.summary) for column in columns])
    lines += [
        "",
        "## Outcomes",
        "",
        "Each count is out of the trials it can happen in; counts are never summed into a rate.",
        "",
        *_table(
            ["outcome", "class", "counted over", *heads],
            ["---", "---", "---"] + ["---:"] * len(columns),
        ),
    ]
    for index, outcome in enumerate(taxonomy.outcomes):
        over = (
            "judged trials" if outcome.over is None else f"judged trials expecting `{outcome.over}`"
        )
        cells = [_count(column.summary.outcomes[index][1]) for column in columns]
        lines += _row(f"`{outcome.name}` | {outcome.outcome_class.value} | {over}", cells)
    unsafe_cells = [_count(column.summary.unsafe) for column in columns]
    lines += _row(f"any unsafe outcome | {OutcomeClass.UNSAFE.value} | judged trials", unsafe_cells)
    lines += [
        "",
        "## What the judged trials did",
        "",
        f"Totals from the audit trail; each stops at {MAX_COUNT} rather than wrapping.",
        "",
        *_table(["count", *heads], ["---"] + ["---:"] * len(columns)),
    ]
    for name in TALLY_FIELDS:
        lines += _row(name, [str(getattr(column.summary.totals, name)) for column in columns])
    excluded = [
        f"- column {column.number}, `{trial.label}`: {_markdown_text(trial.excluded)}"
        for column in columns
        for trial in column.mode.trials
        if trial.excluded is not None
    ]
    if excluded:
        lines += ["", "## Excluded trials", "", *excluded]
    return lines


def _table(heads: list[str], alignments: list[str]) -> list[str]:
    return ["| " + " | ".join(heads) + " |", "|" + "|".join(alignments) + "|"]


def _row(head: str, cells: list[str]) -> list[str]:
    return ["| " + " | ".join([head, *cells]) + " |"]


def _count(count: Count) -> str:
    return f"{count.count} of {count.denominator}"


def _disqualified(summary: Summary) -> str:
    if not summary.disqualified:
        return "no"
    return f"**yes** ({summary.unsafe.count} unsafe)"


def _markdown_text(text: str) -> str:
    """Text a person or file chose, escaped so it reads as itself inside Markdown."""
    return _MARKDOWN_SPECIAL.sub(r"\\\1", sanitize(text))
