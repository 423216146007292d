"""`agentrt proxy` with its store's write counters written out, for the scaling benchmark.

    BENCH_STORE_COUNTS=FILE python _counted_proxy.py --config FILE

Every 100 ms (and at exit) FILE is replaced with the totals so far over every store
the proxy opened: COMMITs, seconds its writes waited for the write lock and seconds
they held it (`Store.commits`, `write_lock_wait_s`, `write_lock_held_s`).
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

from agentrt.proxy.__main__ import main
from agentrt.store._store import Store

_stores: list[Store] = []
_original_init = Store.__init__


def _registering_init(self: Store, *args: Any, **kwargs: Any) -> None:
    _original_init(self, *args, **kwargs)
    _stores.append(self)


def _dump(target: Path) -> None:
    totals = {
        "commits": sum(store.commits for store in _stores),
        "lock_wait_s": sum(store.write_lock_wait_s for store in _stores),
        "lock_held_s": sum(store.write_lock_held_s for store in _stores),
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
    threading.Thread(target=_every, args=(Path(_count_file),), daemon=True).start()
    atexit.register(_dump, Path(_count_file))

if __name__ == "__main__":
    sys.exit(main())
