"""Keeping the audit trail for years: signed checkpoints of the chain's head (`_checkpoints.py`)
with an operator's Ed25519 keys (`_keys.py`).  See docs/retention.md."""

from ._checkpoints import (
    STATEMENT_KIND,
    CheckpointCheck,
    CheckpointRefused,
    SignedCheckpoint,
    check_checkpoints,
    read_checkpoint_log,
    statement_digest,
    write_checkpoint,
)
from ._keys import KeyRefused, PublicKey, SigningKey, load_private_key, load_public_key

__all__ = [
    "STATEMENT_KIND",
    "CheckpointCheck",
    "CheckpointRefused",
    "KeyRefused",
    "PublicKey",
    "SignedCheckpoint",
    "SigningKey",
    "check_checkpoints",
    "load_private_key",
    "load_public_key",
    "read_checkpoint_log",
    "statement_digest",
    "write_checkpoint",
]
