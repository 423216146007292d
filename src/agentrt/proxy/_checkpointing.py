"""The proxy signs the chain's head on its own: `"checkpoint"` in proxy.json.

Every `every_events` new events and/or every `every` (when anything is new), a
task of the proxy's own does what `agentrt checkpoint --key --log` does
(`retention.write_checkpoint`: the head signed, a `checkpoint` event, a line in
the log outside the database), in a worker thread, never on a call's path.  The
key is read when the proxy starts (owner-only, or the proxy does not start); a
checkpoint that fails is said once on stderr and tried again 30 s later, and the
calls go on.  docs/retention.md says where the key should live (off the proxy's
host, ideally: whoever holds it can sign a history).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import IO, TYPE_CHECKING, Final

import anyio
import anyio.to_thread

from ..sanitize import sanitize
from ..store import Store
from ._log import log_line

if TYPE_CHECKING:
    from ..retention._keys import SigningKey
    from .config import CheckpointConfig

__all__ = ["checkpointing"]

_POLL_SECONDS: Final = 1.0
_RETRY_SECONDS: Final = 30.0


@contextlib.asynccontextmanager
async def checkpointing(
    store: Store, settings: CheckpointConfig | None, log: IO[str]
) -> AsyncIterator[None]:
    """Sign the head as `settings` asks while the block runs (nothing without settings)."""
    if settings is None:
        yield
        return
    from ..retention._keys import load_private_key

    # Refused (others can read it, not Ed25519, encrypted): the proxy does not start.
    key = load_private_key(str(settings.key))
    async with anyio.create_task_group() as group:
        group.start_soon(_every, store, settings, key, log)
        try:
            yield
        finally:
            group.cancel_scope.cancel()


def _last_checkpoint_seq(store: Store) -> int:
    events = store.checkpoint_events()
    return events[-1].seq if events else 0


async def _every(store: Store, settings: CheckpointConfig, key: SigningKey, log: IO[str]) -> None:
    from ..retention._checkpoints import write_checkpoint

    last_seq = await store.run(_last_checkpoint_seq, store)
    last_time = time.monotonic()
    not_before = 0.0
    said: str | None = None
    while True:
        await anyio.sleep(_POLL_SECONDS)
        now = time.monotonic()
        if now < not_before:
            continue
        try:
            head = await store.run(store.head_seq)
        except Exception:  # noqa: S112 - a busy database: look again at the next poll
            continue
        new = head - last_seq
        by_count = settings.every_events is not None and new >= settings.every_events
        by_time = settings.every_seconds is not None and now - last_time >= settings.every_seconds
        due = by_count or (by_time and new > 0)
        if not due:
            continue
        try:
            signed = await anyio.to_thread.run_sync(write_checkpoint, store, key, str(settings.log))
        except Exception as exc:
            line = f"agentrt proxy: a checkpoint failed: {sanitize(str(exc) or type(exc).__name__)}"
            if line != said:
                log_line(log, line + f"; trying again in {_RETRY_SECONDS:g}s")
                said = line
            not_before = time.monotonic() + _RETRY_SECONDS
            continue
        said = None
        last_seq = signed.seq + 1  # the checkpoint's own event follows what it signed
        last_time = time.monotonic()
        log_line(
            log,
            f"agentrt proxy: checkpoint {signed.number}: event {signed.seq} signed, appended "
            f"to {sanitize(str(settings.log))}",
        )
