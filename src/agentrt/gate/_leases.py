"""The leases one gate holds: the token of each acquisition, their renewal while a
call or a loop runs, their release, and the runs it let go of unrecorded.

A run's lease is `(owner, expires_at, token)` in its row, taken by compare-and-set
(`ledger.acquire_lease`).  The token is per acquisition: a take-over mints a new
one, so a call started under the old one can no longer record its result.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import anyio.to_thread
from anyio.abc import TaskGroup

from ..store import DATABASE_ERRORS, Connection, RunRecord, Store, ledger

__all__ = ["Leases"]


class Leases:
    """The leases of one owner (a gate) on one store, each run's under one token."""

    def __init__(self, store: Store, owner: str, ttl: float) -> None:
        self.store = store
        self.owner = owner
        self.ttl = ttl
        # The token of each lease this owner acquired and still holds.
        self._tokens: dict[str, str] = {}
        # Runs whose lease this owner let go of without the database knowing (its
        # release could not be written): nothing here works on them any more, so
        # this owner may take them over before the stale lease runs out.
        self._let_go: set[str] = set()

    @property
    def held_runs(self) -> frozenset[str]:
        """The runs whose lease this owner holds a token for."""
        return frozenset(self._tokens)

    def token(self, run_id: str) -> str:
        """The token of the acquisition this owner holds the run under."""
        return self._tokens[run_id]

    def let_go_of(self, run_id: str) -> bool:
        """Whether this owner gave the run up without the database knowing."""
        return run_id in self._let_go

    def acquire(
        self,
        connection: Connection,
        run: RunRecord,
        now: float,
        *,
        take_over: bool = False,
        current_token: object = ledger.UNREAD,
        recording: tuple[int, str] | None = None,
    ) -> str:
        """Inside a write: take (or extend) the run's lease; its token (`ledger.acquire_lease`)."""
        token = ledger.acquire_lease(
            self.store, connection, run, now, owner=self.owner, ttl=self.ttl,
            held=self._tokens.get(run.run_id), take_over=take_over,
            current_token=current_token, recording=recording,
        )  # fmt: skip
        self.adopt(run.run_id, token)
        return token

    def adopt(self, run_id: str, token: str) -> None:
        """This owner holds the run under `token` (a run inserted already leased)."""
        self._tokens[run_id] = token
        self._let_go.discard(run_id)  # this owner works on it again

    def forget(self, run_id: str) -> None:
        """The run ended or waits and holds no lease: keep no token for it."""
        self._tokens.pop(run_id, None)

    def abandon(self, run_id: str) -> None:
        """Give the run up without writing (the database stayed locked): its lease expires."""
        self._tokens.pop(run_id, None)
        self._let_go.add(run_id)

    def renew(self, run_id: str) -> bool:
        """Extend this owner's lease on a run; False if it no longer holds it (blocking)."""
        token = self._tokens.get(run_id)
        if token is None:
            return False
        with self.store.transaction() as connection:
            return ledger.renew_lease(
                self.store, connection, run_id, owner=self.owner, token=token, ttl=self.ttl
            )

    async def release(self, run_id: str) -> None:
        """Let go of the run, so another process may take it at once."""
        token = self._tokens.pop(run_id, None)
        if token is None:
            return
        try:
            await self.store.write(self._clear, run_id, token)
        except DATABASE_ERRORS:
            self._let_go.add(run_id)  # the lease then simply expires (or is taken over here)

    def _clear(self, connection: Connection, run_id: str, token: str) -> None:
        ledger.release_lease(connection, run_id, owner=self.owner, token=token)

    @asynccontextmanager
    async def hold(self, run_id: str) -> AsyncIterator[None]:
        """Hold the run's lease, renewed in the background, and release it on the way out."""
        await self.store.write(self._take, run_id, time.time())
        failure: BaseException | None = None
        async with anyio.create_task_group() as group:
            group.start_soon(self.heartbeat, run_id)
            try:
                yield
            except BaseException as exc:
                # Re-raised below, outside the task group, so the caller sees
                # the loop's own exception rather than an ExceptionGroup.
                failure = exc
            finally:
                group.cancel_scope.cancel()
        with anyio.CancelScope(shield=True):
            await self.release(run_id)
        if failure is not None:
            raise failure

    def _take(self, connection: Connection, run_id: str, now: float) -> None:
        run = self.store.get_run(run_id)
        if not run.status.terminal:
            self.acquire(connection, run, now)

    async def heartbeat(self, run_id: str, *, due_now: bool = False) -> None:
        """Renew the run's lease every third of its time (the first renewal at once
        when `due_now`) until a renewal finds it no longer this owner's.

        A renewal that fails, for whatever reason, is tried again at the next
        beat and never fails the call it keeps: the tool's own outcome is what
        gets recorded, and the result's compare-and-set on the lease token
        still decides whether this owner holds the run when it is written.

        Cancelled, the heartbeat ends at once, even while a renewal waits on a
        database another writer holds (up to the store's busy deadline): that
        renewal is left to finish in its worker.  Waiting for it would hold the
        call's answer one deadline more before its result's write waits its own.
        Landing late, it can only extend this acquisition's lease (its update
        names the token), and never past a result that could not be written: it
        began waiting before the result's write did, with the same deadline, so
        it gives up first.
        """
        while True:
            if not due_now:
                await anyio.sleep(self.ttl / 3)
            due_now = False
            try:
                renewed = await anyio.to_thread.run_sync(self.renew, run_id, abandon_on_cancel=True)
            except Exception:  # noqa: S112 - bookkeeping must never falsify the call's outcome
                continue
            if not renewed:
                return

    def kept(self, run_id: str) -> LeaseKept:
        """The lease of `run_id` kept renewed through one call (`async with`)."""
        return LeaseKept(self, run_id)


class LeaseKept:
    """Keeps a run's lease renewed while a call that may outlast half of it runs.

    On asyncio the renewing task starts only when its first renewal falls due,
    a third of the lease into the call, and a timer stands in for it until then:
    a call that returns sooner (nearly every call) costs no task, no task group
    and no cancellation.  On another event loop the renewing task runs for the
    whole call, as a task group's child.  Either way it is stopped before the
    call's result is recorded, without waiting for a renewal stuck on a locked
    database, and a renewal that failed has not failed the call
    (`Leases.heartbeat` tries again at the next beat).
    """

    __slots__ = ("_group", "_leases", "_run_id", "_scope", "_task", "_timer")

    def __init__(self, leases: Leases, run_id: str) -> None:
        self._leases = leases
        self._run_id = run_id
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None
        self._scope: anyio.CancelScope | None = None
        self._group: TaskGroup | None = None

    async def __aenter__(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._group = anyio.create_task_group()
            await self._group.__aenter__()
            self._group.start_soon(self._leases.heartbeat, self._run_id)
            return
        self._timer = loop.call_later(self._leases.ttl / 3, self._start, loop)

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        self._task = loop.create_task(self._renew())

    async def _renew(self) -> None:
        with anyio.CancelScope() as self._scope:
            await self._leases.heartbeat(self._run_id, due_now=True)

    async def __aexit__(self, *exc_info: object) -> None:
        # Returns None: the call's own exception, if any, goes on unwrapped.
        if self._group is not None:
            self._group.cancel_scope.cancel()
            await self._group.__aexit__(None, None, None)
            return
        if self._timer is not None:
            self._timer.cancel()
        task = self._task
        if task is None:
            return
        if self._scope is not None:
            self._scope.cancel()
        else:
            task.cancel()  # started, not yet running: nothing of it ran
        with anyio.CancelScope(shield=True):
            await asyncio.wait({task})
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]
