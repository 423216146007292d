"""The results file `agentrt/bench/v1`: its vocabulary, and a strict decoder."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrt.bench import (
    MAX_COUNT,
    BenchError,
    Mode,
    Outcome,
    OutcomeClass,
    Results,
    Tally,
    Taxonomy,
    decode_results,
    encode_results,
    summarize,
)

from .examples import COMMIT, TAXONOMY, encoded, example_document, example_results, trial
from .strategies import results as any_results


def _refusal(document: Any) -> str:
    with pytest.raises(BenchError) as caught:
        decode_results(encoded(document) if not isinstance(document, bytes) else document, "r.json")
    message = str(caught.value)
    assert message.startswith("results file r.json: ")
    assert "\n" not in message
    return message


# The vocabulary


@pytest.mark.parametrize("missing", [OutcomeClass.SUCCESS, OutcomeClass.UNSAFE])
def test_a_taxonomy_without_a_success_and_an_unsafe_outcome_is_refused(
    missing: OutcomeClass,
) -> None:
    others = [c for c in OutcomeClass if c is not missing]
    outcomes = tuple(Outcome(f"o{i}", c) for i, c in enumerate(others))
    with pytest.raises(BenchError, match=f"has no {missing.value} outcome"):
        Taxonomy("t", (), outcomes)
    # With the missing class added, the same taxonomy is accepted.
    Taxonomy("t", (), (*outcomes, Outcome("added", missing)))


def test_a_taxonomy_refuses_a_repeated_outcome_and_an_over_it_does_not_declare() -> None:
    success, unsafe = Outcome("ok", OutcomeClass.SUCCESS), Outcome("bad", OutcomeClass.UNSAFE)
    with pytest.raises(BenchError, match='lists the outcome "ok" twice'):
        Taxonomy("t", (), (success, unsafe, success))
    with pytest.raises(BenchError, match='counted over "refusal", which is not one of'):
        Taxonomy("t", ("completion",), (success, Outcome("bad", OutcomeClass.UNSAFE, "refusal")))


def test_an_excluded_trial_is_in_no_denominator() -> None:
    summary = summarize(TAXONOMY, example_results().modes[0])
    assert (summary.trials, summary.judged, summary.excluded) == (5, 4, 1)
    # The excluded trial expected a refusal: only the judged refusal-trial is counted over.
    assert dict(summary.expecting) == {"completion": 3, "refusal": 1}
    outcomes = dict(summary.outcomes)
    assert (outcomes["correct_refusal"].count, outcomes["correct_refusal"].denominator) == (1, 1)
    assert (outcomes["failed"].count, outcomes["failed"].denominator) == (0, 4)
    assert summary.totals.steps == 3 + 2 + 1 + 1  # the excluded trial's step is not in it


def test_an_outcome_counted_over_an_expectation_has_those_trials_as_its_denominator() -> None:
    outcomes = dict(summarize(TAXONOMY, example_results().modes[0]).outcomes)
    assert (outcomes["completed"].count, outcomes["completed"].denominator) == (2, 3)
    assert (outcomes["incorrect_refusal"].count, outcomes["incorrect_refusal"].denominator) == (
        1,
        3,
    )


def test_a_trial_cannot_end_in_an_outcome_counted_over_another_expectation() -> None:
    mode = Mode("m", (trial("s", expects="completion", outcome="correct_refusal"),))
    with pytest.raises(BenchError, match='counted over trials expecting "refusal"'):
        Results(COMMIT, TAXONOMY, (mode,))


def test_one_unsafe_outcome_disqualifies_its_mode() -> None:
    results = example_results()
    careful, reckless = (summarize(TAXONOMY, mode) for mode in results.modes)
    assert not careful.disqualified
    assert reckless.disqualified
    assert (reckless.unsafe.count, reckless.unsafe.denominator) == (1, 3)


def test_totals_saturate_at_the_bound_instead_of_wrapping() -> None:
    big = Tally(steps=MAX_COUNT, tokens_in=MAX_COUNT - 1)
    mode = Mode("m", (replace(trial("a"), tally=big), replace(trial("b"), tally=big)))
    totals = summarize(TAXONOMY, mode).totals
    assert totals.steps == MAX_COUNT
    assert totals.tokens_in == MAX_COUNT
    # The saturated file reads back, and a total one past the bound is refused.
    data = encode_results(Results(COMMIT, TAXONOMY, (mode,)))
    assert decode_results(data, "r.json").modes[0] == mode
    document = json.loads(data)
    document["modes"][0]["summary"]["totals"]["steps"] = MAX_COUNT + 1
    assert "totals.steps" in _refusal(document)


# The decoder


def test_the_example_file_reads_back_as_written() -> None:
    results = example_results()
    data = encode_results(results)
    assert decode_results(data, "r.json") == results
    assert encode_results(decode_results(data, "r.json")) == data


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        (lambda d: d, "the document has an unknown field"),
        (lambda d: d["taxonomy"], "the taxonomy has an unknown field"),
        (lambda d: d["taxonomy"]["outcomes"][0], "the taxonomy's outcomes[0] has an unknown"),
        (lambda d: d["modes"][1], "modes[1] has an unknown field"),
        (lambda d: d["modes"][0]["trials"][2], 'trials[2] of mode "scripted" has an unknown'),
        (lambda d: d["modes"][0]["trials"][0]["tally"], "the tally of trials[0] of mode"),
        (lambda d: d["modes"][1]["summary"], 'the summary of mode "reckless" has an unknown'),
        (lambda d: d["modes"][1]["summary"]["totals"], 'unknown field "totals.surprise"'),
    ],
)
def test_the_decoder_refuses_an_unknown_field_wherever_it_is(where: Any, expected: str) -> None:
    document = example_document()
    where(document)["surprise"] = 1
    message = _refusal(document)
    assert expected in message
    assert "surprise" in message


def test_the_decoder_refuses_a_second_document() -> None:
    data = encode_results(example_results())
    assert "more than one JSON value" in _refusal(data + data)
    assert "more than one JSON value" in _refusal(data + b"\n{}\n")


def test_the_decoder_refuses_a_duplicate_trial() -> None:
    document = example_document()
    trials = document["modes"][0]["trials"]
    trials.append(copy.deepcopy(trials[1]))
    assert 'trial "read-readme#2" of mode "scripted" appears twice' in _refusal(document)


def test_the_decoder_refuses_a_duplicate_mode_and_a_repeated_key() -> None:
    document = example_document()
    document["modes"].append(copy.deepcopy(document["modes"][0]))
    assert 'the mode "scripted" appears twice' in _refusal(document)
    data = encode_results(example_results()).replace(
        b'"format": "agentrt/bench/v1",', b'"format": "agentrt/bench/v1", "format": "x",'
    )
    assert 'the key "format" is repeated' in _refusal(data)


@pytest.mark.parametrize(
    ("place", "expected"),
    [
        (("modes", 0, "trials", 0, "tally", "steps"), "is a negative count (-1)"),
        (("modes", 0, "trials", 0, "repeat"), "is a negative count (-1)"),
        (("modes", 0, "summary", "judged"), 'negative count at "judged" (-1)'),
        (("modes", 0, "summary", "outcomes", "failed", "denominator"), "negative count at"),
    ],
)
def test_the_decoder_refuses_a_negative_count(place: tuple[Any, ...], expected: str) -> None:
    document = example_document()
    target = document
    for key in place[:-1]:
        target = target[key]
    target[place[-1]] = -1
    assert expected in _refusal(document)


@pytest.mark.parametrize("value", [1.0, 1.5, True, "1", None, MAX_COUNT + 1])
def test_the_decoder_refuses_a_count_that_is_not_a_whole_number_within_the_bound(
    value: Any,
) -> None:
    document = example_document()
    document["modes"][0]["trials"][0]["tally"]["tool_calls"] = value
    assert "tool_calls in the tally of trials[0]" in _refusal(document)


def test_the_decoder_refuses_a_summary_that_does_not_follow_from_its_trials() -> None:
    document = example_document()
    # The reckless mode's unsafe trial rewritten as a success, its summary left as it was:
    # a file hiding a disqualification.
    document["modes"][1]["trials"][2]["outcome"] = "correct_refusal"
    message = _refusal(document)
    assert 'the summary of mode "reckless" says "outcomes.correct_refusal.count" is 0' in message
    assert "but its trials give 1" in message


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda t: t.pop("outcome"), "exactly one of an outcome and an exclusion reason"),
        (lambda t: t.update(excluded="why"), "exactly one of an outcome and an exclusion reason"),
        (lambda t: t.update(outcome="vanished"), 'ends in "vanished", which taxonomy'),
        (lambda t: t.pop("expects"), "expects no expectation"),
        (lambda t: t.update(expects="praise"), 'expects "praise"'),
        (lambda t: t.update(repeat=0), "repeat that is not a whole number from 1"),
        (lambda t: t.update(scenario="two words"), '"two words" is not a name'),
    ],
)
def test_the_decoder_refuses_a_trial_outside_its_taxonomy(change: Any, expected: str) -> None:
    document = example_document()
    change(document["modes"][0]["trials"][0])
    assert expected in _refusal(document)


def test_the_decoder_refuses_an_excluded_trial_without_a_reason() -> None:
    document = example_document()
    document["modes"][0]["trials"][4]["excluded"] = "  "
    assert "excluded without a reason" in _refusal(document)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda d: d.update(format="agentrt/bench/v2"), 'the format is "agentrt/bench/v2"'),
        (lambda d: d.update(commit="HEAD"), 'the commit "HEAD" is not'),
        (lambda d: d.pop("commit"), 'the document lacks the field "commit"'),
        (lambda d: d.update(modes=[]), "the results have no mode"),
        (lambda d: d["modes"][0].update(trials=[]), 'mode "scripted" has no trial'),
        (
            lambda d: d["taxonomy"]["outcomes"][4].update({"class": "harmful"}),
            'has the class "harmful", not one of success, safe_non_success, unsafe',
        ),
        (
            lambda d: d["taxonomy"]["outcomes"].pop(4),
            'taxonomy "agentrt/example" has no unsafe outcome',
        ),
    ],
)
def test_the_decoder_refuses_a_file_that_is_not_a_v1_results_file(
    change: Any, expected: str
) -> None:
    document = example_document()
    change(document)
    assert expected in _refusal(document)


def test_a_refusal_escapes_the_text_the_file_chose() -> None:
    document = example_document()
    document["modes"][0]["trials"][0]["outcome"] = "x\u202eevil\nline"
    message = _refusal(document)
    assert "\u202e" not in message and "\n" not in message
    assert "\\u202e" in message


# Properties


@settings(max_examples=50, suppress_health_check=[HealthCheck.too_slow])
@given(any_results())
def test_any_valid_results_round_trip_through_the_file(results: Results) -> None:
    data = encode_results(results)
    assert decode_results(data, "r.json") == results
    assert encode_results(decode_results(data, "r.json")) == data


def _summary_leaves(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(value, dict):
        return [path] + [
            leaf for key, item in value.items() for leaf in _summary_leaves(item, (*path, key))
        ]
    return [path]


@settings(max_examples=80, suppress_health_check=[HealthCheck.too_slow])
@given(any_results(), st.data())
def test_any_mutation_of_a_summary_is_refused(results: Results, data: st.DataObject) -> None:
    document = json.loads(encode_results(results))
    mode = data.draw(st.sampled_from(document["modes"]))
    path = data.draw(st.sampled_from(_summary_leaves(mode["summary"])))
    parent: Any = mode
    key: Any = "summary"
    for step in path:
        parent, key = parent[key], step
    original = parent[key]
    kind = data.draw(st.sampled_from(["replace", "remove", "add"]))
    if kind == "remove":
        del parent[key]
    elif kind == "add" and isinstance(original, dict):
        original[data.draw(st.text("xyz_", min_size=1).filter(lambda k: k not in original))] = 0
    else:
        replacement = data.draw(
            st.one_of(
                st.integers(-(2**60), 2**60),
                st.booleans(),
                st.floats(allow_nan=False, allow_infinity=False),
                st.text(max_size=5),
                st.none(),
                st.just({}),
            ).filter(lambda v: type(v) is not type(original) or v != original)
        )
        parent[key] = replacement
    with pytest.raises(BenchError):
        decode_results(encoded(document), "r.json")


_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)


def _every_place(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    places = [path]
    if isinstance(value, dict):
        for key, item in value.items():
            places += _every_place(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            places += _every_place(item, (*path, index))
    return places


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_any_change_anywhere_is_read_or_refused_in_one_sentence(data: st.DataObject) -> None:
    document: Any = {"root": example_document()}
    path = data.draw(st.sampled_from(_every_place(document["root"])))
    parent: Any = document
    key: Any = "root"
    for step in path:
        parent, key = parent[key], step
    if path and isinstance(parent, dict) and data.draw(st.booleans()):
        del parent[key]
    else:
        parent[key] = data.draw(_json_values)
    try:
        decode_results(encoded(document["root"]), "r.json")
    except BenchError as error:
        assert str(error).startswith("results file r.json: ")
        assert "\n" not in str(error)
