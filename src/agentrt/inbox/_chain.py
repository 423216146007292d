"""The inbox's check of the hash chain: whole now and then, the new events at each refresh.

The page refreshes on every change to the database, and a busy proxy changes
it many times a second.  Verifying the whole chain each time (11–13 µs an
event here, so about 20 s for the 1.8 M events of 300,000 proxied calls) kept
the inbox busy for ever and, holding the store's connection, made approvals
and decisions wait behind it.  `ChainCheck` verifies the whole chain when the
inbox starts and again every `full_every` seconds; in between, each check
confirms that the last event it verified still has the hash it had, then
verifies that event again and the events after it, and no others.  The
chain is read in slices of `chunk` events, the store's connection let go
between them, so nothing waits long for a check.

What this gives up is stated in docs/inbox.md: between two whole checks, a
change to an event before the last one verified (its payload rewritten, its
hash kept) is found only by the next whole check; a change to that last
event, or a chain rebuilt under the inbox, is found at the next refresh.
`agentrt verify` always checks the whole chain.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Final

from ..store import GENESIS_HASH, ChainReport, Store
from ..store.archive import chain_origin, first_seq

__all__ = ["ChainCheck"]

# How often the whole chain is verified again, and how many events one read holds the
# store's connection for (~0.1 s here; a reader waited 0.21 s at most during a whole check).
FULL_EVERY_SECONDS: Final = 300.0
CHUNK_EVENTS: Final = 5_000


class ChainCheck:
    """The chain verified once whole, then extended by the events added since."""

    def __init__(
        self,
        store: Store,
        *,
        full_every: float = FULL_EVERY_SECONDS,
        chunk: int = CHUNK_EVENTS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._full_every = full_every
        self._chunk = chunk
        self._clock = clock
        self._guard = threading.Lock()
        # The last event verified, every one before it verified since the whole check
        # began at `_whole_since` (None: the next check verifies the whole chain).
        self._head: tuple[int, str] = (0, GENESIS_HASH)
        self._origin: tuple[int, str] = (0, GENESIS_HASH)
        self._whole_since: float | None = None

    def report(self) -> ChainReport:
        """The chain as it stands: intact up to its head, or its first break. Blocking."""
        with self._guard:
            now = self._clock()
            if self._whole_since is None or now - self._whole_since >= self._full_every:
                # From where the database's part of the chain begins (after an archive,
                # the last archived event, which its first event must chain to).
                origin = chain_origin(self._store)
                if isinstance(origin, str):
                    self._whole_since = None
                    first = first_seq(self._store)
                    return ChainReport(False, 0, GENESIS_HASH, first, origin, 0)
                self._origin = origin
                self._head, self._whole_since = origin, now
            report = self._extend()
            if not report.ok:
                self._whole_since = None  # whatever comes next is checked whole again
            return report

    def _extend(self) -> ChainReport:
        while True:
            seq, digest = self._head
            origin = self._origin[0]
            if seq > origin:
                event = self._store.event_at(seq)
                if event is None or event.hash != digest:
                    # The event last verified was re-hashed or removed (a chain rebuilt
                    # under the inbox): the whole chain, slice by slice, says where.
                    self._head = self._origin
                    continue
            # From the last event verified, itself verified again (its content against its
            # hash), so a change to it is found at once.
            part = self._store.verify_chain(from_seq=max(seq, origin + 1), to_seq=seq + self._chunk)
            if not part.ok:
                return part
            added = part.checked - (1 if seq > origin else 0)
            if added:
                self._head = (part.head_seq, part.head_hash)
            if added < self._chunk:
                # Every event from the first to the head is verified: as many as the head's seq.
                head_seq, head_hash = self._head
                return ChainReport(
                    True, head_seq, head_hash, None, "intact", head_seq - self._origin[0]
                )
