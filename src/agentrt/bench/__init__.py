"""Scoring an agent that acts: taxonomies, results files, comparisons.

A *taxonomy* is the closed set of ways a trial may end, each a `success`, a
`safe_non_success` or `unsafe`; a *results file* (`agentrt/bench/v1`) holds
the trials of one or more *modes* (a model, a provider, the scripted agent)
at one commit, and the summaries that follow from them; `compare_markdown`
puts several files side by side.  docs/bench.md describes the format.
"""

from __future__ import annotations

from ._compare import compare_markdown
from ._file import MAX_FILE_BYTES, decode_results, encode_results, summary_json
from ._results import (
    FORMAT,
    Count,
    Mode,
    Results,
    Summary,
    Tally,
    Trial,
    saturating_sum,
    summarize,
)
from ._vocabulary import MAX_COUNT, NAME_PATTERN, BenchError, Outcome, OutcomeClass, Taxonomy

__all__ = [
    "FORMAT",
    "MAX_COUNT",
    "MAX_FILE_BYTES",
    "NAME_PATTERN",
    "BenchError",
    "Count",
    "Mode",
    "Outcome",
    "OutcomeClass",
    "Results",
    "Summary",
    "Tally",
    "Taxonomy",
    "Trial",
    "compare_markdown",
    "decode_results",
    "encode_results",
    "saturating_sum",
    "summarize",
    "summary_json",
]
