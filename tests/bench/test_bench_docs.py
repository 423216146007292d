"""docs/bench.md is a claim: its example file is one the reader accepts, its bound the code's."""

from __future__ import annotations

import re
from pathlib import Path

from agentrt.bench import MAX_COUNT, OutcomeClass, decode_results, summarize

DOC = Path(__file__).resolve().parents[2] / "docs" / "bench.md"


def test_the_documented_example_is_a_valid_results_file() -> None:
    text = DOC.read_text(encoding="utf-8")
    example = text.split("### A complete example", 1)[1]
    block = re.search(r"```json\n(.*?)```", example, re.DOTALL)
    assert block is not None
    results = decode_results(block.group(1).encode(), "docs/bench.md")
    summary = summarize(results.taxonomy, results.modes[0])
    assert (summary.trials, summary.judged, summary.excluded) == (3, 2, 1)
    classes = {outcome.outcome_class for outcome in results.taxonomy.outcomes}
    assert classes == set(OutcomeClass)


def test_the_documented_bound_is_the_codes() -> None:
    assert f"{MAX_COUNT:,}" in DOC.read_text(encoding="utf-8")
