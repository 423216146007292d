"""Group commit: the store's one writer thread gathers the `Store.write` units of
concurrent callers into one transaction, each in its own savepoint, and answers every
caller only after that transaction's COMMIT returned.

A batch is scoped when its first unit is (`Store.write_scoped`, decision 0065): then only
scoped units join it, and an unscoped one waits, first in line, for the next batch."""

from __future__ import annotations

import collections
import contextlib
import functools
import queue
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

import anyio.to_thread

if TYPE_CHECKING:
    import asyncio

    from ._backend import Scope
    from ._store import Store


class _Unit:
    """One caller's `Store.write`: the function, then its outcome once its batch settled."""

    __slots__ = (
        "_done", "_future", "_loop", "args", "error", "function", "scope", "submitted", "value",
    )  # fmt: skip

    def __init__(
        self, function: Callable[..., Any], args: tuple[Any, ...], scope: Scope | None = None
    ) -> None:
        self.function = function
        self.args = args
        self.scope = scope  # what a scoped write reads and writes, or None
        self.submitted = time.monotonic()
        self.value: Any = None
        self.error: BaseException | None = None
        # On asyncio the writer wakes the caller's loop directly, through a bare
        # future (no thread per waiter, no event object between them); on another
        # backend the caller waits in a worker thread.  Without asyncio imported no
        # asyncio loop runs: the command's synchronous callers do not import it
        # (10 MiB and 0.08 s with ssl, issue 36).
        self._loop: asyncio.AbstractEventLoop | None = _running_asyncio_loop()
        if self._loop is not None:
            self._future: asyncio.Future[None] | None = self._loop.create_future()
            self._done: threading.Event | None = None
        else:
            self._future = None
            self._done = threading.Event()

    def release(self) -> None:
        """Called by the writer once the unit's outcome is final and durable."""
        if self._done is not None:
            self._done.set()
        elif self._loop is not None and self._future is not None:
            with contextlib.suppress(RuntimeError):  # the caller's loop already closed
                self._loop.call_soon_threadsafe(_resolve, self._future)

    async def settled(self) -> None:
        if self._future is not None:
            await self._future
        elif self._done is not None:
            await anyio.to_thread.run_sync(self._done.wait)


def _running_asyncio_loop() -> asyncio.AbstractEventLoop | None:
    imported = sys.modules.get("asyncio")
    if imported is None:
        return None
    try:
        loop: asyncio.AbstractEventLoop = imported.get_running_loop()
    except RuntimeError:
        return None
    return loop


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


# Enough to share one fsync among many callers, few enough that one batch's
# savepoints keep the write lock only briefly.
_MAX_BATCH: Final = 256


class _Writer:
    """The store's one writer thread: takes the queued `write` units, commits them in
    groups, and answers their callers after each group's COMMIT."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._queue: queue.SimpleQueue[_Unit | None] = queue.SimpleQueue()
        # Units taken from the queue but left for a later batch (an unscoped one met while
        # gathering a scoped batch, a scoped one whose scope another write held), in order.
        self._held: collections.deque[_Unit] = collections.deque()
        self._stopping = False  # the queue's end was taken: no unit follows it
        self._thread = threading.Thread(
            target=self._loop, name=f"agentrt-writer {store.path}", daemon=True
        )
        self.batches = 0
        self._thread.start()

    def submit(self, unit: _Unit) -> None:
        self._queue.put(unit)

    def stop(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def _queued(self, room: int, scoped: bool = False) -> list[_Unit]:
        """The units waiting now, at most `room`: those held back first, then the queue's
        (none of the queue's once its end was taken).  For a `scoped` batch only scoped
        units; an unscoped one is held back, in order, for the next batch.

        This thread is the queue's only reader: not empty means a get succeeds."""
        units: list[_Unit] = []
        passed: list[_Unit] = []
        while self._held and len(units) < room:
            held = self._held.popleft()
            (passed if scoped and held.scope is None else units).append(held)
        while not self._stopping and len(units) < room and not self._queue.empty():
            queued = self._queue.get_nowait()
            if queued is None:
                self._stopping = True
            elif scoped and queued.scope is None:
                passed.append(queued)
            else:
                units.append(queued)
        self.give_back(passed)
        return units

    def give_back(self, units: list[_Unit]) -> None:
        """Hold `units` for the next batch, ahead of every unit waiting, in their order."""
        self._held.extendleft(reversed(units))

    def _next(self) -> _Unit | None:
        """The first unit of the next batch (held back ones first), or None at the end."""
        if self._held:
            return self._held.popleft()
        if self._stopping:
            return None
        return self._queue.get()

    def _loop(self) -> None:
        while True:
            first = self._next()
            if first is None:
                return
            scoped = first.scope is not None
            # Whatever queued while the last batch committed joins this one:
            # nobody waits for a timer, and under load every fsync is shared.
            units = [first, *self._queued(_MAX_BATCH - 1, scoped)]
            # Readers and sync transactions waiting for the store's lock go first.
            for _ in range(20):
                if not self._store._lock_waiters:
                    break
                time.sleep(0.0001)
            try:
                # And whatever queued while it waited for the write lock joins it too.
                self._store._commit_batch(
                    units, functools.partial(self._queued, scoped=scoped), self.give_back
                )
            except BaseException as exc:  # never leave a caller waiting
                for unit in units:
                    if unit.error is None:
                        unit.error, unit.value = exc, None
            self.batches += 1
            for unit in units:  # last: each wakes a caller, who wants the lock next
                unit.release()
