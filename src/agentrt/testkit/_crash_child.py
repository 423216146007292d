"""The child of `crash_at_every_write`: runs a scenario and kills itself at its crash point.

`python -m agentrt.testkit._crash_child MODULE:FUNCTION DATABASE EFFECTS start|resume`,
with `AGENTRT_TESTKIT_CRASH_AT=N:before|after` for the start.  The store's two
write paths (the group commit and `transaction()`) are wrapped so that the
Nth write kills this process with SIGKILL just before its transaction begins
(`before`: whatever the process did since the last write is not recorded) or
just after it committed (`after`).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import signal
import sys
from collections.abc import Callable, Iterator
from typing import Any

import anyio

from ..store._store import Store
from ._crash import CRASH_AT_VARIABLE


def _arm(crash_at: str) -> None:
    number, _, moment = crash_at.partition(":")
    target = int(number)
    writes = 0

    def reached(when: str) -> None:
        if writes == target and when == moment:
            sys.stdout.flush()
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    batch: Callable[..., Any] = Store._commit_batch

    @functools.wraps(batch)
    def commit_batch(self: Any, units: Any, joining: Any = None, give_back: Any = None) -> None:
        nonlocal writes
        writes += 1
        reached("before")
        batch(self, units, joining, give_back)
        reached("after")

    transaction: Callable[..., Any] = Store.transaction.__wrapped__  # type: ignore[attr-defined]

    @contextlib.contextmanager
    def counted_transaction(self: Any) -> Iterator[Any]:
        nonlocal writes
        writes += 1
        reached("before")
        with contextlib.contextmanager(transaction)(self) as connection:
            yield connection
        reached("after")

    Store._commit_batch = commit_batch  # type: ignore[method-assign]
    Store.transaction = counted_transaction  # type: ignore[method-assign,assignment]


def main(argv: list[str]) -> int:
    scenario, database, effects, mode = argv
    module_name, _, function_name = scenario.partition(":")
    function = getattr(importlib.import_module(module_name), function_name)
    crash_at = os.environ.get(CRASH_AT_VARIABLE)
    if crash_at and mode == "start":
        _arm(crash_at)
    anyio.run(function, database, effects, mode == "resume")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
