"""Keeping the audit trail for years: signed checkpoints of the chain's head
(`_checkpoints.py`) with an operator's Ed25519 keys (`_keys.py`), and archives of the
chain's prefix in signed segment files (`_archive.py`), and evidence files a third party
checks offline (`_evidence.py`).  See docs/retention.md."""

from ._archive import (
    SEGMENT_KIND,
    ArchiveCheck,
    ArchiveRefused,
    ArchiveResult,
    archive_before,
    check_archive,
    check_continues,
    check_directory,
    manifests_recorded,
)
from ._checkpoints import (
    STATEMENT_KIND,
    CheckpointCheck,
    CheckpointRefused,
    SignedCheckpoint,
    check_checkpoints,
    logged_checkpoints,
    read_checkpoint_log,
    statement_digest,
    write_checkpoint,
)
from ._evidence import (
    EVIDENCE_KIND,
    EvidenceRefused,
    EvidenceReport,
    build_evidence,
    verify_evidence,
    write_evidence,
)
from ._keys import KeyRefused, PublicKey, SigningKey, load_private_key, load_public_key
from ._timestamps import TimestampRefused

__all__ = [
    "EVIDENCE_KIND",
    "SEGMENT_KIND",
    "STATEMENT_KIND",
    "ArchiveCheck",
    "ArchiveRefused",
    "ArchiveResult",
    "CheckpointCheck",
    "CheckpointRefused",
    "EvidenceRefused",
    "EvidenceReport",
    "KeyRefused",
    "PublicKey",
    "SignedCheckpoint",
    "SigningKey",
    "TimestampRefused",
    "archive_before",
    "build_evidence",
    "check_archive",
    "check_checkpoints",
    "check_continues",
    "check_directory",
    "load_private_key",
    "load_public_key",
    "logged_checkpoints",
    "manifests_recorded",
    "read_checkpoint_log",
    "statement_digest",
    "verify_evidence",
    "write_checkpoint",
    "write_evidence",
]
