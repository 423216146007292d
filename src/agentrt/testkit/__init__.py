"""Testing an agent built on agentrt without a model, a network, or luck.

- `crash_at_every_write(scenario)`: kill the consumer's process at every write
  of its run (before and after each commit), resume, and report every side
  effect that happened more than once (`CrashReport.assert_at_most_once`).
- `arguments_for(tool)`: Hypothesis strategies of valid arguments from a
  tool's JSON Schema (the `testkit` extra).
- `check_policy_table` / `assert_policy_table`: a table of requests and the
  outcome each must get, checked against a policy.
- Recorded model answers replay with `agentrt.providers.replay_client`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from .._lazy import lazy_names

if TYPE_CHECKING:
    from ._crash import CrashPoint, CrashReport, crash_at_every_write
    from ._fuzz import arguments_for
    from ._policy_table import PolicyCase, assert_policy_table, check_policy_table

__all__ = [
    "CrashPoint",
    "CrashReport",
    "PolicyCase",
    "arguments_for",
    "assert_policy_table",
    "check_policy_table",
    "crash_at_every_write",
]

_WHERE: Final = {
    "CrashPoint": "._crash",
    "CrashReport": "._crash",
    "crash_at_every_write": "._crash",
    "arguments_for": "._fuzz",
    "PolicyCase": "._policy_table",
    "assert_policy_table": "._policy_table",
    "check_policy_table": "._policy_table",
}

__getattr__ = lazy_names(__name__, _WHERE, globals())
