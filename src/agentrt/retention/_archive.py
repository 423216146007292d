"""Archives that stay verifiable: a prefix of the chain moved into sealed segment files.

A **segment** is `segment-<first>-<last>.jsonl.gz`: one line per event, as the database
held it (the payload's text verbatim, so each line hashes as the chain did).  Its
**manifest** (`segment-<first>-<last>.manifest`) is signed like a checkpoint: the
database's identity, the first and last seq and hash, the count, the file's SHA-256.
`archive` writes both (each to a temporary name, fsynced, renamed), then in one
transaction deletes the events and their runs' rows and appends an `archived` event
carrying the manifest (`store.archive`), then shrinks the SQLite file.  Killed anywhere,
it leaves either nothing done in the database or everything; run again, it finishes
with the segment it already wrote, never with an event twice.

`check_archive` reads a directory of segments with the database as one chain.
"""

from __future__ import annotations

import gzip
import os
import re
import stat
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from ..canonical import JSONBoundaryError, canonical_json, parse_json
from ..errors import AgentrtError
from ..sanitize import sanitize
from ..store import GENESIS_HASH, Event, Store, archive, event_hash, utc_now
from ._checkpoints import SignedCheckpoint, logged_checkpoints, statement_bytes
from ._keys import PublicKey, SigningKey

__all__ = [
    "SEGMENT_KIND",
    "ArchiveCheck",
    "ArchiveRefused",
    "ArchiveResult",
    "archive_before",
    "check_archive",
    "check_continues",
    "check_directory",
    "manifests_recorded",
    "read_manifest",
]

SEGMENT_KIND: Final = "agentrt archive segment"
_MANIFEST_FIELDS: Final = frozenset(
    {
        "kind", "version", "database", "file", "sha256", "first_seq", "prev_hash",
        "last_seq", "last_hash", "count", "key", "time",
    }
)  # fmt: skip
_NAME: Final = re.compile(r"segment-(\d{12})-(\d{12})\.manifest")
_CHUNK: Final = 1 << 20


class ArchiveRefused(AgentrtError):
    """An archive cannot be made here, or a segment does not match its manifest or the chain."""


def _segment_name(first: int, last: int) -> str:
    return f"segment-{first:012d}-{last:012d}.jsonl.gz"


def _manifest_name(first: int, last: int) -> str:
    return f"segment-{first:012d}-{last:012d}.manifest"


def check_directory(directory: str) -> None:
    """Refuse an archive directory that is missing, not this user's, or writable by others
    (who could replace a segment: its signature would then fail, but the evidence is lost)."""
    try:
        info = os.stat(directory)
    except OSError as exc:
        raise ArchiveRefused(
            f"archive directory {sanitize(directory)} cannot be used: {exc.strerror}"
        ) from None
    if not stat.S_ISDIR(info.st_mode):
        raise ArchiveRefused(f"archive directory {sanitize(directory)} is not a directory")
    if info.st_uid != os.geteuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ArchiveRefused(
            f"archive directory {sanitize(directory)} is owned or writable by someone else "
            f"(mode {stat.S_IMODE(info.st_mode):04o}); make it this user's with chmod 700"
        )


def _write_file(directory: str, name: str, chunks: Iterator[bytes]) -> str:
    """Write `name` in `directory` through a temporary file, fsynced and renamed; its SHA-256."""
    import hashlib

    final = os.path.join(directory, name)
    temporary = os.path.join(directory, f".{name}.{os.getpid()}.tmp")
    digest = hashlib.sha256()
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    descriptor = os.open(temporary, flags, 0o600)
    try:
        for chunk in chunks:
            digest.update(chunk)
            view = memoryview(chunk)
            while view:
                written = os.write(descriptor, view)
                view = view[written:]
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
    os.replace(temporary, final)
    return digest.hexdigest()


def _fsync_directory(directory: str) -> None:
    descriptor = os.open(directory, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _gzip_lines(lines: Iterator[dict[str, Any]]) -> Iterator[bytes]:
    """The events as gzip'd JSON Lines, in chunks (mtime 0: the same events, the same bytes)."""
    import io

    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as compressed:
        for line in lines:
            compressed.write(canonical_json(line).encode("utf-8") + b"\n")
            if buffer.tell() >= _CHUNK:
                yield buffer.getvalue()
                buffer.seek(0)
                buffer.truncate()
    yield buffer.getvalue()


@dataclass(frozen=True, slots=True)
class ArchiveResult:
    """What `archive_before` did: the segment's manifest, or why nothing was archived."""

    manifest: Mapping[str, Any] | None
    reason: str
    resumed: bool = False
    blocked: bool = False


def read_manifest(path: str) -> SignedCheckpoint:
    """A manifest file as a statement and signature (the shape checkpoints have)."""
    try:
        with open(path, "rb") as file:
            document = parse_json(file.read(1 << 16))
    except (OSError, JSONBoundaryError) as exc:
        raise ArchiveRefused(f"segment manifest {sanitize(path)} cannot be read: {exc}") from None
    return _parse_manifest(document, f"segment manifest {sanitize(path)}")


def _parse_manifest(document: Any, where: str) -> SignedCheckpoint:
    if (
        not isinstance(document, dict)
        or set(document) != {"signature", "statement"}
        or not isinstance(document["statement"], dict)
        or set(document["statement"]) != _MANIFEST_FIELDS
        or document["statement"]["kind"] != SEGMENT_KIND
        or not isinstance(document["signature"], str)
        or not all(
            type(document["statement"][name]) is int for name in ("first_seq", "last_seq", "count")
        )
    ):
        raise ArchiveRefused(f"{where} is not an agentrt segment manifest")
    return SignedCheckpoint(document["statement"], document["signature"])


def archive_before(
    store: Store,
    key: SigningKey,
    log_path: str,
    directory: str,
    before: str,
    index_since: float,
) -> ArchiveResult:
    """Archive the events written before `before` (an ISO time) that may be archived
    (`store.archive.plan_cut`, ending no later than the last signed checkpoint) into a
    segment in `directory`, signed with `key`; finish an archive a kill interrupted."""
    check_directory(directory)
    checkpoints = logged_checkpoints(store, log_path) if store.checkpoint_events() else []
    if not checkpoints:
        raise ArchiveRefused(
            f"database {sanitize(store.path)} has no signed checkpoint, and nothing after the "
            "last one may be archived: run agentrt checkpoint first"
        )
    last = checkpoints[-1]
    first = archive.first_seq(store)
    resumed = _written_before(store, key, directory, first)
    if resumed is not None:
        cut, manifest = resumed
    else:
        planned = archive.plan_cut(store, before, last.seq, index_since)
        if isinstance(planned, archive.NothingToArchive):
            if first > 1:
                archive.shrink(store)  # an archive killed after its commit, before this
            return ArchiveResult(None, planned.reason, blocked=planned.blocked)
        cut = planned
        manifest = _write_segment(store, key, directory, cut, str(last.statement["database"]))
    with store.transaction() as connection:
        archive.archive_prefix(store, connection, cut, manifest)
    archive.shrink(store)
    return ArchiveResult(manifest, cut.limited_by, resumed is not None)


def _write_segment(
    store: Store, key: SigningKey, directory: str, cut: archive.ArchiveCut, database: str
) -> dict[str, Any]:
    name = _segment_name(cut.first_seq, cut.last_seq)
    # A segment another run wrote and never finished (killed before its manifest) starts
    # here too; it is not referenced by anything, and is replaced.
    for stale in os.listdir(directory):
        if stale.startswith(f"segment-{cut.first_seq:012d}-") and stale != name:
            os.unlink(os.path.join(directory, stale))
    digest = _write_file(
        directory, name, _gzip_lines(archive.raw_events(store, cut.first_seq, cut.last_seq))
    )
    statement = {
        "kind": SEGMENT_KIND,
        "version": 1,
        "database": database,
        "file": name,
        "sha256": digest,
        "first_seq": cut.first_seq,
        "prev_hash": cut.prev_hash,
        "last_seq": cut.last_seq,
        "last_hash": cut.last_hash,
        "count": cut.count,
        "key": key.public.id,
        "time": utc_now(),
    }
    manifest = SignedCheckpoint(statement, key.sign(statement_bytes(statement))).payload()
    manifest_text = canonical_json(manifest).encode("utf-8") + b"\n"
    _write_file(directory, _manifest_name(cut.first_seq, cut.last_seq), iter([manifest_text]))
    _fsync_directory(directory)
    return manifest


def _written_before(
    store: Store, key: SigningKey, directory: str, first: int
) -> tuple[archive.ArchiveCut, dict[str, Any]] | None:
    """A segment an interrupted archive wrote for the events the database still begins
    with, whole, signed and matching the database: finished rather than written again."""
    for name in sorted(os.listdir(directory)):
        match = _NAME.fullmatch(name)
        if match is None or int(match.group(1)) != first:
            continue
        try:
            signed = read_manifest(os.path.join(directory, name))
        except ArchiveRefused:
            return None
        statement = signed.statement
        if not key.public.verifies(signed.signature, statement_bytes(statement)):
            return None
        last_seq = int(statement["last_seq"])
        held = store.event_at(last_seq)
        segment = os.path.join(directory, str(statement["file"]))
        if held is None or held.hash != statement["last_hash"] or not os.path.exists(segment):
            return None
        if _file_sha256(segment) != statement["sha256"]:
            return None
        cut = archive.ArchiveCut(
            first, last_seq, str(statement["prev_hash"]), str(statement["last_hash"]),
            "the segment an interrupted archive wrote",
        )  # fmt: skip
        return cut, signed.payload()
    return None


def _file_sha256(path: str) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


# -- checking -----------------------------------------------------------------


@dataclass
class ArchiveCheck:
    """What `check_archive` read: the segments, where the database must take the chain
    up, and the checkpoint and `archived` events inside the segments."""

    segments: int = 0
    events: int = 0
    next_seq: int = 1
    prev_hash: str = GENESIS_HASH
    checkpoints: dict[int, Event] = field(default_factory=dict)
    manifests: list[dict[str, Any]] = field(default_factory=list)
    archived: list[dict[str, Any]] = field(default_factory=list)


def check_archive(directory: str, keys: Sequence[PublicKey]) -> ArchiveCheck:
    """Check every segment in `directory`: its manifest signed by one of `keys` and naming
    it, its SHA-256, each line's hash and link, and the segments one unbroken chain from
    event 1.  Raises `ArchiveRefused` naming the first segment that does not hold."""
    try:
        names = sorted(name for name in os.listdir(directory) if _NAME.fullmatch(name))
    except OSError as exc:
        raise ArchiveRefused(
            f"archive directory {sanitize(directory)} cannot be read: {exc.strerror}"
        ) from None
    by_id = {key.id: key for key in keys}
    found = ArchiveCheck()
    for name in names:
        where = f"segment manifest {sanitize(name)}"
        signed = read_manifest(os.path.join(directory, name))
        statement = signed.statement
        key = by_id.get(str(statement["key"]))
        if key is None or not key.verifies(signed.signature, statement_bytes(statement)):
            raise ArchiveRefused(
                f"{where}: its signature does not verify with the public keys given (the "
                "manifest was forged or altered)"
            )
        first, last = int(statement["first_seq"]), int(statement["last_seq"])
        if statement["file"] != _segment_name(first, last) or name != _manifest_name(first, last):
            raise ArchiveRefused(f"{where} does not name its own segment: files were renamed")
        if first != found.next_seq or statement["prev_hash"] != found.prev_hash:
            missing = f"events {found.next_seq}..{first - 1}" if first > found.next_seq else ""
            raise ArchiveRefused(
                f"{where} does not follow the segment before it"
                + (f": {missing} are in no segment (a segment is missing)" if missing else "")
            )
        segment = os.path.join(directory, str(statement["file"]))
        if not os.path.exists(segment):
            raise ArchiveRefused(f"segment {sanitize(str(statement['file']))} is missing")
        if _file_sha256(segment) != statement["sha256"]:
            raise ArchiveRefused(
                f"segment {sanitize(str(statement['file']))} does not match its manifest's "
                "SHA-256: it was altered or replaced"
            )
        _check_segment_lines(segment, statement, found)
        found.segments += 1
        found.manifests.append(signed.payload())
    return found


def manifests_recorded(found: ArchiveCheck, database_archived: Sequence[Event]) -> None:
    """Every segment's manifest is the payload of an `archived` event (in the database or
    in a later segment), so a segment signed but never committed is not taken for history."""
    recorded = {canonical_json(manifest) for manifest in found.archived}
    recorded.update(canonical_json(event.payload) for event in database_archived)
    for manifest in found.manifests:
        if canonical_json(manifest) not in recorded:
            raise ArchiveRefused(
                f"segment {sanitize(str(manifest['statement']['file']))} is recorded by no "
                "archived event: it is not part of this database's history"
            )


def _check_segment_lines(path: str, statement: Mapping[str, Any], found: ArchiveCheck) -> None:
    name = sanitize(str(statement["file"]))
    expected, prev_hash, count = int(statement["first_seq"]), str(statement["prev_hash"]), 0
    try:
        with gzip.open(path, "rb") as lines:
            for line in lines:
                record = parse_json(line)
                seq = record["seq"]
                if seq != expected or record["prev_hash"] != prev_hash:
                    raise ArchiveRefused(
                        f"segment {name}: event {expected} is missing or out of order"
                    )
                digest = event_hash(
                    prev_hash, seq, record["run_id"], record["type"], record["payload"],
                    record["created_at"],
                )  # fmt: skip
                if digest != record["hash"]:
                    raise ArchiveRefused(
                        f"segment {name}: event {seq} does not match its hash (it was altered)"
                    )
                if record["run_id"] == "" and record["type"] in ("checkpoint", "archived"):
                    payload = parse_json(record["payload"])
                    if record["type"] == "archived":
                        found.archived.append(payload)
                    else:
                        found.checkpoints[seq] = Event(
                            seq, "", "checkpoint", payload, record["created_at"], prev_hash,
                            digest,
                        )  # fmt: skip
                prev_hash, expected, count = digest, expected + 1, count + 1
    except (OSError, EOFError, JSONBoundaryError, KeyError, TypeError) as exc:
        raise ArchiveRefused(f"segment {name} cannot be read whole: {exc}") from None
    if count != statement["count"] or prev_hash != statement["last_hash"]:
        raise ArchiveRefused(f"segment {name} does not hold the events its manifest names")
    found.events += count
    found.next_seq, found.prev_hash = expected, prev_hash


def check_continues(store: Store, found: ArchiveCheck, directory: str) -> int:
    """The database takes the chain up where the segments leave it: its first event
    follows their last.  Returns that first event's seq."""
    first = archive.first_seq(store)
    if first != found.next_seq:
        raise ArchiveRefused(
            f"events {min(first, found.next_seq)}..{max(first, found.next_seq) - 1} are "
            f"in neither the database nor archive {sanitize(directory)}"
            if first > found.next_seq
            else f"archive {sanitize(directory)} holds events the database still holds "
            f"(from {first}): it is not this database's archive"
        )
    event = store.event_at(first)
    if event is not None and event.prev_hash != found.prev_hash:
        raise ArchiveRefused(
            f"event {first} of the database does not chain to the last archived event "
            f"({found.next_seq - 1}) in {sanitize(directory)}"
        )
    return first
