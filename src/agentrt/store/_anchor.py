"""The head anchor: the last committed event's seq and hash, kept beside a SQLite
database (`<db>.anchor`) or, for PostgreSQL, in this host's state directory, so a
database whose chain is behind it (a WAL deleted after a crash, an old copy restored, a
truncated file, a database emptied) is refused rather than trusted."""

from __future__ import annotations

import contextlib
import json
import os
import stat
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from ..canonical import sha256_hex
from ..errors import StoreError, UnsafeDatabase
from ..sanitize import sanitize
from ._chain import GENESIS_HASH
from ._records import AnchorReport

if TYPE_CHECKING:
    from ._backend import Backend


class _Anchoring:
    """The store's part that keeps and checks its head anchor (a mixin of `Store`)."""

    # The store's, set by `Store.__init__`.
    path: str
    read_only: bool
    anchor_path: str | None
    _anchor: _AnchorFile | None
    _backend: Backend

    def _query(self, sql: str, parameters: Sequence[Any] = ()) -> list[Any]:
        raise NotImplementedError  # `Store._query`

    def _advance_anchor(self, seq: int, digest: str) -> None:
        """Record a committed head in the anchor, unless it already holds a later one.

        Called after COMMIT, so the anchor is never ahead of what the database
        durably holds.  A failure here only leaves the anchor behind (less to
        compare with, never a false refusal), so it is not the caller's error.
        """
        if self.anchor_path is None:
            return
        if self._anchor is None:
            self._anchor = _AnchorFile(self.anchor_path)
        self._anchor.advance(seq, digest)

    def head(self) -> tuple[int, str]:
        """The last event's seq and hash: `(0, GENESIS_HASH)` for an empty chain."""
        rows = self._query("SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1")
        return (int(rows[0][0]), str(rows[0][1])) if rows else (0, GENESIS_HASH)

    def check_anchor(self) -> AnchorReport:
        """Compare the chain with the anchor beside the database: is anything lost?"""
        head_seq, head_hash = self.head()
        if self.anchor_path is None:
            return AnchorReport(True, None, None, head_seq, head_hash, "in memory: no anchor")
        anchor = _read_anchor(self.anchor_path)
        label = sanitize(self.path)
        where = sanitize(self.anchor_path)
        if anchor is None and self._backend.anchor_per_host:
            # Each host keeps its own: one that never wrote here has none, and that is
            # no fault of the database's.
            return AnchorReport(
                True, None, None, head_seq, head_hash,
                f"no head anchor on this host ({where}): a restored older backup is not "
                "detected here",
            )  # fmt: skip
        if anchor is None:
            return AnchorReport(
                False, None, None, head_seq, head_hash,
                f"database {label} has no head anchor ({where}), so lost commits cannot be "
                "detected; copy the anchor with the database",
            )  # fmt: skip
        seq, digest = anchor
        if head_seq < seq:
            how = self._backend.lost_events(where)
            return AnchorReport(
                False, seq, digest, head_seq, head_hash,
                f"database {label} ends at event {head_seq} ({head_hash[:16]}) but its anchor "
                f"records event {seq} ({digest[:16]}): committed events were lost {how}, and "
                "calls that ran could run again",
            )  # fmt: skip
        stored = (
            GENESIS_HASH
            if seq == 0
            else next(
                (row[0] for row in self._query("SELECT hash FROM events WHERE seq = ?", (seq,))),
                None,
            )
        )
        if stored != digest:
            return AnchorReport(
                False, seq, digest, head_seq, head_hash,
                f"database {label} has hash {str(stored)[:16]} at event {seq} but its anchor "
                f"records {digest[:16]}: the chain was replaced",
            )  # fmt: skip
        return AnchorReport(True, seq, digest, head_seq, head_hash, "the chain reaches its anchor")

    def write_anchor(self) -> None:
        """Anchor the current head (a database opened for the first time by this build)."""
        if self.anchor_path is None or self.read_only:
            return
        seq, digest = self.head()
        _write_anchor(self.anchor_path, seq, digest)


def _read_anchor(path: str) -> tuple[int, str] | None:
    """The anchor's (seq, hash), None if there is none; refuses one others could have written."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UnsafeDatabase(f"head anchor {sanitize(path)} cannot be read: {exc}") from None
    try:
        info = os.fstat(descriptor)
        if info.st_uid != os.geteuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise UnsafeDatabase(
                f"head anchor {sanitize(path)} is owned or writable by someone else"
            )
        data = os.read(descriptor, 4096)
    finally:
        os.close(descriptor)
    return _parse_anchor(data, path)


def _parse_anchor(data: bytes, path: str) -> tuple[int, str] | None:
    if not data.strip():
        return None  # a power cut between its creation and its data: as if missing
    try:
        record = json.loads(data)
        seq, digest = record["seq"], record["hash"]
        if not isinstance(seq, int) or seq < 0 or not isinstance(digest, str) or len(digest) != 64:
            raise ValueError("bad fields")
    except (ValueError, KeyError, TypeError):
        raise UnsafeDatabase(
            f"head anchor {sanitize(path)} is not an agentrt anchor; remove it to start "
            "anchoring afresh"
        ) from None
    return seq, digest


def _write_anchor(path: str, seq: int, digest: str) -> None:
    """Replace the anchor atomically: write a private file beside it, rename it over.

    Neither the file nor the directory is fsynced, which keeps an anchor
    write to a few tens of microseconds after each commit rather than a
    second fsync (measured in docs/decisions/0002).  Nothing is lost by it:
    the anchor is written after COMMIT, whose own fsync made the database
    hold what it names, so a power cut can leave the anchor behind the
    database, or empty (read as missing, and rewritten), never ahead of it.
    A process crash loses nothing, the page cache keeps it.  (After each
    commit the anchor is rewritten in place instead, by `_AnchorFile`.)
    """
    temporary = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    descriptor = os.open(temporary, flags, 0o600)
    try:
        os.fchmod(descriptor, 0o600)
        os.write(descriptor, _anchor_record(seq, digest))
    finally:
        os.close(descriptor)
    os.replace(temporary, path)


# Every anchor record has this length (JSON padded with spaces), so rewriting it
# in place always covers the whole previous one.
_ANCHOR_BYTES: Final = 128


def _anchor_record(seq: int, digest: str) -> bytes:
    # json.dumps({"seq": seq, "hash": digest}) for an int and a hex digest, by hand
    # (written after every commit).
    if not (type(seq) is int and len(digest) == 64 and digest.isalnum() and digest.isascii()):
        return json.dumps({"seq": seq, "hash": digest}).ljust(_ANCHOR_BYTES).encode("ascii")
    return f'{{"seq": {seq}, "hash": "{digest}"}}'.ljust(_ANCHOR_BYTES).encode("ascii")


class _AnchorFile:
    """The head anchor, kept open and rewritten in place after each commit.

    A rename per commit cost ~0.5 ms here (more than the commit's own fsync
    on this disk); one `pwrite` of a fixed-length record within one sector
    costs a few microseconds.  A process crash cannot tear it (the page cache
    holds the whole write); a power cut leaves the old record or the new one
    (one sector), or, at worst, a record read as missing — never one ahead of
    the database, since it is written after COMMIT.  If the file is replaced
    or removed (another build renames over it), it is opened afresh.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._descriptor: int | None = None
        self._inode: tuple[int, int] | None = None
        # The record this object last wrote and its seq: a file still holding
        # exactly those bytes need not be parsed again.
        self._written: tuple[bytes, int] | None = None

    def _open(self) -> int:
        try:
            info = os.stat(self.path, follow_symlinks=False)
            current: tuple[int, int] | None = (info.st_dev, info.st_ino)
        except FileNotFoundError:
            current = None
        if self._descriptor is not None and current == self._inode:
            return self._descriptor
        self.close()
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        descriptor = os.open(self.path, flags, 0o600)
        info = os.fstat(descriptor)
        if info.st_uid != os.geteuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            os.close(descriptor)
            raise UnsafeDatabase(
                f"head anchor {sanitize(self.path)} is owned or writable by someone else"
            )
        self._descriptor, self._inode = descriptor, (info.st_dev, info.st_ino)
        return descriptor

    def advance(self, seq: int, digest: str) -> None:
        """Record a committed head unless the anchor already holds a later one
        (several processes may share the database)."""
        try:
            descriptor = self._open()
            data = os.pread(descriptor, 4096, 0)
            written = self._written
            if written is not None and data == written[0]:
                current_seq: int | None = written[1]
            else:
                current = _parse_anchor(data, self.path)
                current_seq = None if current is None else current[0]
            if current_seq is not None and current_seq >= seq:
                return
            record = _anchor_record(seq, digest)
            os.pwrite(descriptor, record, 0)
            self._written = (record, seq)
        except (OSError, StoreError):
            return  # the anchor only lags: less to compare with, never a false refusal

    def close(self) -> None:
        if self._descriptor is not None:
            with contextlib.suppress(OSError):
                os.close(self._descriptor)
        self._descriptor = self._inode = None
        self._written = None


def postgres_anchor_path(label: str) -> str:
    """This host's head anchor for the PostgreSQL database named `label` (its redacted URL):
    in `AGENTRT_ANCHOR_DIR`, else `$XDG_STATE_HOME/agentrt/anchors` (~/.local/state)."""
    directory = os.environ.get("AGENTRT_ANCHOR_DIR") or os.path.join(
        os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state"),
        "agentrt",
        "anchors",
    )
    return os.path.join(directory, sha256_hex(label.encode("utf-8"))[:32] + ".anchor")


def _anchor_directory(anchor_path: str, label: str) -> None:
    """Create the directory of this host's anchors if missing: it and every directory
    made on the way to it private to this user (0700, whatever the umask, as the XDG
    base directory specification asks), so no one else can swap an anchor."""
    directory = os.path.dirname(anchor_path)
    missing: list[str] = []
    path = directory
    while path and not os.path.isdir(path) and os.path.dirname(path) != path:
        missing.append(path)
        path = os.path.dirname(path)
    try:
        for path in reversed(missing):
            try:
                os.mkdir(path, 0o700)
            except FileExistsError:
                if path != directory or os.path.isdir(path):
                    continue  # made meanwhile; or a file on the way, which the next names
                raise
            os.chmod(path, 0o700)  # the umask may have taken bits away
    except OSError as exc:
        raise StoreError(
            f"database {sanitize(label)}: the head anchor directory {sanitize(directory)} "
            f"cannot be created ({exc.strerror}); set AGENTRT_ANCHOR_DIR to a directory of "
            "this user's"
        ) from None


def _refuse_if_anchored(anchor_path: str, label: str, state: str, lost: str) -> None:
    """Refuse to create a database (`label` `state`: missing, or without a schema) whose
    anchor says one held committed events there."""
    anchored = _read_anchor(anchor_path)
    if anchored is not None and anchored[0] > 0:
        where = sanitize(anchor_path)
        raise UnsafeDatabase(
            f"database {sanitize(label)} {state} but its anchor ({where}) records event "
            f"{anchored[0]}: the database was {lost}, and calls that ran could run again; if "
            f"it was reset on purpose, remove {where} to start afresh"
        )
