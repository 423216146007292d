"""The results file, `agentrt/bench/v1`: one JSON document, read strictly.

The reader refuses, in one sentence naming the field or trial, anything a
careless or hostile writer could slip past a comparison: a field it does not
know, a second document, a repeated key or trial, a count that is negative,
fractional or past `MAX_COUNT`, and a summary that does not follow from the
trials (every summary is recomputed on read).  docs/bench.md shows the
schema with a complete example.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from decimal import Decimal
from typing import Any, Final

from ..canonical import JSONBoundaryError, canonical_json, parse_json
from ..sanitize import sanitize
from ._results import (
    FORMAT,
    TALLY_FIELDS,
    Mode,
    Results,
    Summary,
    Tally,
    Trial,
    summarize,
)
from ._vocabulary import MAX_COUNT, BenchError, Outcome, OutcomeClass, Taxonomy, shown

__all__ = ["MAX_FILE_BYTES", "decode_results", "encode_results", "summary_json", "taxonomy_json"]

MAX_FILE_BYTES: Final = 64 * 1024 * 1024
"""The largest results file read: far past any bench, short of exhausting memory."""

_COMMIT_CHARACTERS: Final = frozenset("0123456789abcdef")


def encode_results(results: Results) -> bytes:
    """`results` as a results file: indented JSON, fields in the documented order."""
    document = {
        "format": FORMAT,
        "commit": results.commit,
        "taxonomy": taxonomy_json(results.taxonomy),
        "modes": [
            {
                "name": mode.name,
                "trials": [_trial_json(trial) for trial in mode.trials],
                "summary": summary_json(summarize(results.taxonomy, mode)),
            }
            for mode in results.modes
        ],
    }
    return (json.dumps(document, indent=2, ensure_ascii=True) + "\n").encode("ascii")


def taxonomy_json(taxonomy: Taxonomy) -> dict[str, Any]:
    outcomes: list[dict[str, Any]] = []
    for outcome in taxonomy.outcomes:
        entry: dict[str, Any] = {"name": outcome.name, "class": outcome.outcome_class.value}
        if outcome.over is not None:
            entry["over"] = outcome.over
        outcomes.append(entry)
    return {
        "name": taxonomy.name,
        "expectations": list(taxonomy.expectations),
        "outcomes": outcomes,
    }


def _trial_json(trial: Trial) -> dict[str, Any]:
    entry: dict[str, Any] = {"scenario": trial.scenario, "repeat": trial.repeat}
    if trial.expects is not None:
        entry["expects"] = trial.expects
    if trial.outcome is not None:
        entry["outcome"] = trial.outcome
    if trial.excluded is not None:
        entry["excluded"] = trial.excluded
    entry["tally"] = _tally_json(trial.tally)
    return entry


def _tally_json(tally: Tally) -> dict[str, int]:
    return {name: getattr(tally, name) for name in TALLY_FIELDS}


def summary_json(summary: Summary) -> dict[str, Any]:
    """`summary` as the results file holds it."""
    return {
        "trials": summary.trials,
        "judged": summary.judged,
        "excluded": summary.excluded,
        "expecting": dict(summary.expecting),
        "outcomes": {
            name: {"count": count.count, "denominator": count.denominator}
            for name, count in summary.outcomes
        },
        "unsafe": {"count": summary.unsafe.count, "denominator": summary.unsafe.denominator},
        "disqualified": summary.disqualified,
        "totals": _tally_json(summary.totals),
    }


def decode_results(data: bytes, source: str) -> Results:
    """The results file `data` (named `source` in refusals), checked whole.

    Raises `BenchError` with one sentence beginning with the file's name.
    """
    try:
        return _decode(data)
    except BenchError as error:
        raise BenchError(f"results file {sanitize(source)}: {error}") from None


def _decode(data: bytes) -> Results:
    if len(data) > MAX_FILE_BYTES:
        raise BenchError(f"the file is larger than {MAX_FILE_BYTES} bytes")
    try:
        document = parse_json(data)
    except JSONBoundaryError as error:
        raise BenchError(str(error)) from None
    top = _fields(document, "the document", {"format", "commit", "taxonomy", "modes"})
    if top["format"] != FORMAT:
        raise BenchError(
            f"the format is {_value(top['format'])}, not {shown(FORMAT)} (the only one known)"
        )
    commit = _commit(top["commit"])
    taxonomy = _taxonomy(top["taxonomy"])
    modes_value = _list(top["modes"], "modes")
    modes: list[Mode] = []
    summaries: list[Any] = []
    for index, value in enumerate(modes_value):
        mode_fields = _fields(value, f"modes[{index}]", {"name", "trials", "summary"})
        name = _string(mode_fields["name"], f"the name of modes[{index}]")
        where = f"mode {shown(name)}"
        trials = tuple(
            _trial(trial, f"trials[{number}] of {where}")
            for number, trial in enumerate(_list(mode_fields["trials"], f"the trials of {where}"))
        )
        modes.append(Mode(name=name, trials=trials))
        summaries.append(mode_fields["summary"])
    results = Results(commit=commit, taxonomy=taxonomy, modes=tuple(modes))
    for mode, written in zip(results.modes, summaries, strict=True):
        _check_summary(written, summary_json(summarize(taxonomy, mode)), mode.name)
    return results


def _fields(
    value: Any, where: str, required: set[str], optional: frozenset[str] = frozenset()
) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BenchError(f"{where} is not a JSON object")
    for key in value:
        if key not in required and key not in optional:
            raise BenchError(f"{where} has an unknown field {shown(key)}")
    for key in sorted(required):
        if key not in value:
            raise BenchError(f"{where} lacks the field {shown(key)}")
    return value


def _list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise BenchError(f"{what} is not a JSON array")
    return value


def _string(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise BenchError(f"{what} is not a string")
    return value


def _count(value: Any, what: str) -> int:
    if type(value) is not int:
        raise BenchError(f"{what} is {_value(value)}, not a whole number")
    if value < 0:
        raise BenchError(f"{what} is a negative count ({value})")
    if value > MAX_COUNT:
        raise BenchError(f"{what} is past the bound of {MAX_COUNT}")
    return value


def _value(value: Any) -> str:
    """A parsed JSON value as a refusal quotes it."""
    text = canonical_json(value)
    return sanitize(text if len(text) <= 80 else text[:80] + "…")


def _commit(value: Any) -> str:
    commit = _string(value, "the commit")
    if not 7 <= len(commit) <= 64 or not set(commit) <= _COMMIT_CHARACTERS:
        raise BenchError(
            f"the commit {shown(commit)} is not 7-64 lowercase hexadecimal digits of a commit id"
        )
    return commit


def _taxonomy(value: Any) -> Taxonomy:
    fields = _fields(value, "the taxonomy", {"name", "expectations", "outcomes"})
    expectations = tuple(
        _string(item, "an expectation of the taxonomy")
        for item in _list(fields["expectations"], "the taxonomy's expectations")
    )
    outcomes: list[Outcome] = []
    for index, item in enumerate(_list(fields["outcomes"], "the taxonomy's outcomes")):
        where = f"the taxonomy's outcomes[{index}]"
        entry = _fields(item, where, {"name", "class"}, frozenset({"over"}))
        try:
            outcome_class = OutcomeClass(entry["class"])
        except (ValueError, TypeError):
            raise BenchError(
                f"{where} has the class {_value(entry['class'])}, not one of "
                + ", ".join(member.value for member in OutcomeClass)
            ) from None
        outcomes.append(
            Outcome(
                name=_string(entry["name"], f"the name of {where}"),
                outcome_class=outcome_class,
                over=_optional_string(entry, "over", where),
            )
        )
    return Taxonomy(
        name=_string(fields["name"], "the taxonomy's name"),
        expectations=expectations,
        outcomes=tuple(outcomes),
    )


def _trial(value: Any, where: str) -> Trial:
    fields = _fields(
        value,
        where,
        {"scenario", "repeat", "tally"},
        frozenset({"expects", "outcome", "excluded"}),
    )
    tally_fields = _fields(fields["tally"], f"the tally of {where}", set(TALLY_FIELDS))
    tally = Tally(
        **{
            name: _count(tally_fields[name], f"{name} in the tally of {where}")
            for name in TALLY_FIELDS
        }
    )
    return Trial(
        scenario=_string(fields["scenario"], f"the scenario of {where}"),
        repeat=_count(fields["repeat"], f"the repeat of {where}"),
        expects=_optional_string(fields, "expects", where),
        outcome=_optional_string(fields, "outcome", where),
        excluded=_optional_string(fields, "excluded", where),
        tally=tally,
    )


def _optional_string(fields: Mapping[str, Any], key: str, where: str) -> str | None:
    if key not in fields:
        return None
    return _string(fields[key], f"the {key} of {where}")


def _check_summary(written: Any, derived: dict[str, Any], mode: str) -> None:
    """Refuse a written summary that differs in any way from the one its trials give."""
    _compare(written, derived, "", f"the summary of mode {shown(mode)}")


def _compare(written: Any, derived: Any, path: str, where: str) -> None:
    if isinstance(derived, dict):
        if not isinstance(written, dict):
            raise BenchError(f"{where}: {path or 'it'} is not a JSON object")
        for key in written:
            if key not in derived:
                raise BenchError(f"{where} has an unknown field {shown(path + key)}")
        for key, item in derived.items():
            if key not in written:
                raise BenchError(f"{where} lacks the field {shown(path + key)}")
            _compare(written[key], item, f"{path}{key}.", where)
        return
    field = path.rstrip(".")
    if isinstance(written, (int, Decimal)) and not isinstance(written, bool) and written < 0:
        raise BenchError(f"{where} has a negative count at {shown(field)} ({_value(written)})")
    if type(written) is not type(derived) or written != derived:
        raise BenchError(
            f"{where} says {shown(field)} is {_value(written)}, but its trials give "
            f"{_value(derived)}"
        )
