"""Passkey mode's mark on a database: the `passkeys` extension.

A database whose proxy or inbox once ran with `"approval_auth": "passkey"` holds
this extension, and from then on the command's `approve`/`reject` and the signed
approver channel refuse to decide in it: only an approver's passkey may.  The
mark is a convenience for people, not the control: whoever writes the database
can decide anyway, and `agentrt verify --approvers` names every such decision
(docs/identity.md).  The assertions themselves live in the chain
(`approver_decided` events), so they need no table.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from ._store import Store

__all__ = ["enable_passkey_mode", "in_passkey_mode"]

EXTENSION: Final = "passkeys"

_MIGRATIONS: Final[Sequence[str]] = ("CREATE TABLE passkey_mode (enabled_at TEXT NOT NULL)",)


def enable_passkey_mode(store: Store) -> None:
    """Mark the database as decided by passkeys only (a write; nothing if it already is)."""
    store.migrate_extension(EXTENSION, _MIGRATIONS)


def in_passkey_mode(store: Store) -> bool:
    """Whether decisions in this database are made with approvers' passkeys only."""
    return store.extension_version(EXTENSION) > 0
