"""`agentrt proxy` with its store's write counters written out, for the scaling benchmark.

    BENCH_STORE_COUNTS=FILE python _counted_proxy.py --config FILE

Every 100 ms (and at exit) FILE is replaced with the totals so far over every store
the proxy opened: COMMITs, seconds its writes waited for the write lock and seconds
they held it (`Store.commits`, `write_lock_wait_s`, `write_lock_held_s`; a scoped
write, decision 0065, holds it shared), the seconds scoped writes waited for and held
the chain's lock (`chain_lock_wait_s`, `chain_lock_held_s`), the times
the write lock was taken (`write_locks`) and the `Store.write` units the writer
thread's transactions carried (`units`: units / write locks is the group commit's
batch), and the CPU seconds the writer thread spent in them (`writer_cpu_s`: nearly
all of it holding the write lock; the rest of a hold is waiting for the database,
for the interpreter lock, or for a core).
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from agentrt.proxy.__main__ import main
from agentrt.store._store import Store

_stores: list[Store] = []
_original_init = Store.__init__
_original_commit_batch = Store._commit_batch
_original_begin = Store._begin
_counts = {"units": 0, "write_locks": 0, "writer_cpu_s": 0.0}


def _registering_init(self: Store, *args: Any, **kwargs: Any) -> None:
    _original_init(self, *args, **kwargs)
    _stores.append(self)


def _counting_commit_batch(self: Store, units: list[Any], *joining: Any) -> None:
    began = time.thread_time()
    try:
        _original_commit_batch(self, units, *joining)  # (an earlier build: no `joining`)
    finally:
        # (On the writer thread only; `units` now holds those that joined once the
        # write lock was held too.)
        _counts["units"] += len(units)
        _counts["writer_cpu_s"] += time.thread_time() - began


def _counting_begin(self: Store, *args: Any) -> Any:
    # (deadline, and a scope since decision 0065; the scopes held since session 19)
    held = _original_begin(self, *args)
    _counts["write_locks"] += 1  # (holding the store's lock)
    return held


def _dump(target: Path) -> None:
    totals = {
        "commits": sum(store.commits for store in _stores),
        "lock_wait_s": sum(store.write_lock_wait_s for store in _stores),
        "lock_held_s": sum(store.write_lock_held_s for store in _stores),
        # Scoped writes' waits for, and holds of, the chain's lock (0 before decision 0065).
        "chain_wait_s": sum(getattr(store, "chain_lock_wait_s", 0.0) for store in _stores),
        "chain_held_s": sum(getattr(store, "chain_lock_held_s", 0.0) for store in _stores),
        **_counts,
    }
    partial = target.with_suffix(".part")
    partial.write_text(json.dumps(totals))
    partial.replace(target)


def _every(target: Path) -> None:
    while True:
        threading.Event().wait(0.1)
        _dump(target)


_count_file = os.environ.get("BENCH_STORE_COUNTS")
if _count_file:
    Store.__init__ = _registering_init  # type: ignore[method-assign]
    Store._commit_batch = _counting_commit_batch  # type: ignore[method-assign]
    Store._begin = _counting_begin  # type: ignore[method-assign]
    threading.Thread(target=_every, args=(Path(_count_file),), daemon=True).start()
    atexit.register(_dump, Path(_count_file))

if __name__ == "__main__":
    sys.exit(main())
