"""Hypothesis strategies for bench taxonomies and results (any valid file the format allows)."""

from __future__ import annotations

from hypothesis import strategies as st

from agentrt.bench import MAX_COUNT, Mode, Outcome, OutcomeClass, Results, Tally, Taxonomy, Trial

names = st.builds("".join, st.tuples(st.sampled_from("abcdefgh"), st.text("abc1_.:/-", max_size=6)))
commits = st.text("0123456789abcdef", min_size=7, max_size=64)
reasons = st.text(min_size=1, max_size=40).filter(lambda text: text.strip() != "")
counts = st.one_of(st.integers(0, 20), st.integers(0, MAX_COUNT), st.just(MAX_COUNT))


@st.composite
def taxonomies(draw: st.DrawFn) -> Taxonomy:
    expectations = tuple(draw(st.lists(names, unique=True, max_size=3)))
    outcome_names = draw(st.lists(names, unique=True, min_size=2, max_size=6))
    others = len(outcome_names) - 2
    others_classes = draw(st.lists(st.sampled_from(OutcomeClass), min_size=others, max_size=others))
    classes = [OutcomeClass.SUCCESS, OutcomeClass.UNSAFE, *others_classes]
    classes = draw(st.permutations(classes))
    over = st.none() | st.sampled_from(expectations) if expectations else st.none()
    outcomes = tuple(
        Outcome(name, outcome_class, draw(over))
        for name, outcome_class in zip(outcome_names, classes, strict=True)
    )
    return Taxonomy(draw(names), expectations, outcomes)


@st.composite
def tallies(draw: st.DrawFn) -> Tally:
    return Tally(*(draw(counts) for _ in range(7)))


@st.composite
def trials(draw: st.DrawFn, taxonomy: Taxonomy, scenario: str, repeat: int) -> Trial:
    expects = draw(st.sampled_from(taxonomy.expectations)) if taxonomy.expectations else None
    possible = [o.name for o in taxonomy.outcomes if o.over is None or o.over == expects]
    if not possible or draw(st.integers(0, 4)) == 0:
        return Trial(scenario, repeat, expects, None, draw(reasons), draw(tallies()))
    return Trial(scenario, repeat, expects, draw(st.sampled_from(possible)), None, draw(tallies()))


@st.composite
def results(draw: st.DrawFn) -> Results:
    taxonomy = draw(taxonomies())
    modes = []
    for mode_name in draw(st.lists(names, unique=True, min_size=1, max_size=2)):
        keys = draw(
            st.lists(st.tuples(names, st.integers(1, 3)), unique=True, min_size=1, max_size=5)
        )
        modes.append(
            Mode(mode_name, tuple(draw(trials(taxonomy, scenario, n)) for scenario, n in keys))
        )
    return Results(draw(commits), taxonomy, tuple(modes))
