"""Signed checkpoints: an operator's Ed25519 signature over the chain's head, kept in a
log outside the database and recorded in the chain as a `checkpoint` event.

A checkpoint's **statement** names the database (an id drawn at its first checkpoint and
carried by every later one), the head it seals (seq and hash), the time, the signing
key's fingerprint, its number and the digest of the previous checkpoint's statement, so
the log's entries chain too: one removed, reordered or altered no longer follows the one
before it, and one cut from the end leaves a checkpoint event in the chain without its
entry.  The `checkpoint` event's payload and the log line are the same canonical JSON
(`{"signature": ..., "statement": ...}`), so a log entry lost to a crash after the
commit is written again from the chain (`write_checkpoint` completes it first).

Someone who can write the database but does not hold the key can rewrite the history
consistently (every hash recomputed) only after the last checkpoint: any earlier change
alters an event a signed statement names, and `check_checkpoints` names the first
checkpoint contradicted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import re
import stat
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from ..canonical import JSONBoundaryError, canonical_json, parse_json, sha256_hex
from ..errors import AgentrtError
from ..sanitize import sanitize
from ..store import Event, Store, archive, ledger, utc_now
from ._keys import PublicKey, SigningKey
from ._timestamps import (
    TimestampRefused,
    request_timestamp,
    timestamp_digest,
    verify_timestamp,
)

__all__ = [
    "STATEMENT_KIND",
    "CheckpointCheck",
    "CheckpointRefused",
    "SignedCheckpoint",
    "check_checkpoints",
    "logged_checkpoints",
    "read_checkpoint_log",
    "statement_bytes",
    "statement_digest",
    "write_checkpoint",
]

STATEMENT_KIND: Final = "agentrt checkpoint"
"""What every signed statement says it is, so a signature over something else of the
operator's (another program's JSON) is never taken for a checkpoint."""
_STATEMENT_FIELDS: Final = frozenset(
    {"kind", "version", "database", "number", "seq", "hash", "time", "key", "previous"}
)
_HEX64: Final = re.compile(r"[0-9a-f]{64}")
_MAX_LOG_BYTES: Final = 1 << 30


class CheckpointRefused(AgentrtError):
    """A checkpoint cannot be written, or a checkpoint log or the chain contradicts one."""


@dataclass(frozen=True, slots=True)
class SignedCheckpoint:
    """One checkpoint: its statement and signature, as the log line and the event hold them."""

    statement: Mapping[str, Any]
    signature: str
    timestamp: str | None = None
    """An RFC 3161 timestamp reply over the signature (base64), in the log only."""

    @property
    def number(self) -> int:
        return int(self.statement["number"])

    @property
    def seq(self) -> int:
        """The seq of the event it seals (its own `checkpoint` event is the next one)."""
        return int(self.statement["seq"])

    @property
    def hash(self) -> str:
        return str(self.statement["hash"])

    @property
    def time(self) -> str:
        return str(self.statement["time"])

    def payload(self) -> dict[str, Any]:
        """The `checkpoint` event's payload: the statement and its signature."""
        return {"signature": self.signature, "statement": dict(self.statement)}

    def line(self) -> dict[str, Any]:
        """The log's line: the payload, and the timestamp if there is one."""
        if self.timestamp is None:
            return self.payload()
        return {**self.payload(), "timestamp": self.timestamp}


def statement_bytes(statement: Mapping[str, Any]) -> bytes:
    """What is signed: the statement's canonical JSON, in UTF-8."""
    return canonical_json(statement).encode("utf-8")


def statement_digest(statement: Mapping[str, Any]) -> str:
    """The digest the next checkpoint's `previous` names."""
    return sha256_hex(statement_bytes(statement))


def _parse_entry(document: Any, where: str, *, logged: bool = False) -> SignedCheckpoint:
    """A log line's (`logged`: it may carry a timestamp) or an event's payload as a
    checkpoint, refused unless well formed."""
    fields = {"signature", "statement"}
    if logged and isinstance(document, dict) and "timestamp" in document:
        fields.add("timestamp")
    if not isinstance(document, dict) or set(document) != fields:
        raise CheckpointRefused(f"{where} is not a checkpoint entry")
    statement, signature = document["statement"], document["signature"]
    timestamp = document.get("timestamp")
    if timestamp is not None and not isinstance(timestamp, str):
        raise CheckpointRefused(f"{where} has a timestamp that is not text")
    if (
        not isinstance(statement, dict)
        or set(statement) != _STATEMENT_FIELDS
        or statement["kind"] != STATEMENT_KIND
        or statement["version"] != 1
        or not isinstance(signature, str)
        or not all(isinstance(statement[name], str) for name in ("database", "time", "key"))
        or not all(
            type(statement[name]) is int and statement[name] >= 0 for name in ("number", "seq")
        )
        or not isinstance(statement["hash"], str)
        or not _HEX64.fullmatch(statement["hash"])
        or not (statement["previous"] is None or isinstance(statement["previous"], str))
    ):
        raise CheckpointRefused(f"{where} is not a well-formed checkpoint statement")
    return SignedCheckpoint(statement, signature, timestamp)


# -- the log ------------------------------------------------------------------


def _open_log(path: str, flags: int) -> int:
    descriptor = os.open(path, flags | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600)
    info = os.fstat(descriptor)
    if not stat.S_ISREG(info.st_mode) or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        os.close(descriptor)
        raise CheckpointRefused(
            f"checkpoint log {sanitize(path)} is not a regular file only its owner can write"
        )
    return descriptor


def read_checkpoint_log(path: str) -> list[SignedCheckpoint]:
    """The log's entries in order; refused if a line is not a whole checkpoint entry."""
    try:
        descriptor = _open_log(path, os.O_RDONLY)
    except FileNotFoundError:
        raise CheckpointRefused(f"checkpoint log {sanitize(path)} does not exist") from None
    except OSError as exc:
        raise CheckpointRefused(
            f"checkpoint log {sanitize(path)} cannot be read: {exc.strerror}"
        ) from None
    try:
        with os.fdopen(descriptor, "rb", closefd=False) as file:
            data = file.read(_MAX_LOG_BYTES)
    finally:
        os.close(descriptor)
    return _parse_log(data, path)


def _parse_log(data: bytes, path: str) -> list[SignedCheckpoint]:
    entries: list[SignedCheckpoint] = []
    lines = data.split(b"\n")
    if lines[-1]:
        raise CheckpointRefused(
            f"checkpoint log {sanitize(path)} ends in an incomplete line (line {len(lines)}): "
            "the log was cut or altered"
        )
    for number, line in enumerate(lines[:-1], start=1):
        where = f"checkpoint log {sanitize(path)} line {number}"
        try:
            document = parse_json(line)
        except JSONBoundaryError:
            raise CheckpointRefused(f"{where} is not JSON: the log was cut or altered") from None
        entry = _parse_entry(document, where, logged=True)
        if line.decode("utf-8") != canonical_json(entry.line()):
            raise CheckpointRefused(f"{where} is not written as agentrt writes it: it was altered")
        entries.append(entry)
    return entries


def _append_to_log(path: str, entries: Sequence[SignedCheckpoint]) -> None:
    """Append whole lines and fsync them (the log is the evidence that outlives the database)."""
    if not entries:
        return
    data = "".join(canonical_json(entry.line()) + "\n" for entry in entries).encode("utf-8")
    descriptor = _open_log(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(descriptor, data)
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


@contextlib.contextmanager
def _locked_log(path: str) -> Iterator[None]:
    """Hold the log's lock, so two checkpointers append in the order they committed."""
    try:
        descriptor = _open_log(path, os.O_RDWR | os.O_CREAT)
    except OSError as exc:
        raise CheckpointRefused(
            f"checkpoint log {sanitize(path)} cannot be opened: {exc.strerror}"
        ) from None
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)


# -- writing ------------------------------------------------------------------


def logged_checkpoints(store: Store, log_path: str) -> list[SignedCheckpoint]:
    """The database's checkpoints, once the log at `log_path` is found to hold them in order
    (any missing from its end, lost to a crash after their commit, are appended)."""
    with _locked_log(log_path):
        return _logged_checkpoints(store, log_path)


def _logged_checkpoints(store: Store, log_path: str) -> list[SignedCheckpoint]:
    logged = read_checkpoint_log(log_path)
    recorded = [
        _parse_entry(event.payload, f"checkpoint event {event.seq}")
        for event in store.checkpoint_events()
    ]
    # Checkpoints whose events were archived are in the log only (and in the segments).
    archived = recorded[0].number - 1 if recorded else 0
    where = f"checkpoint log {sanitize(log_path)}"
    if archived > len(logged) or (
        archived
        and recorded[0].statement["previous"] != statement_digest(logged[archived - 1].statement)
    ):
        raise CheckpointRefused(
            f"{where} does not hold database {sanitize(store.path)}'s archived checkpoints "
            f"1..{archived}: it is another database's log, or it was cut"
        )
    for line, entry in enumerate(logged):
        index = line - archived
        if entry.number != line + 1 or (
            index >= 0 and (index >= len(recorded) or recorded[index].payload() != entry.payload())
        ):
            raise CheckpointRefused(
                f"{where} line {line + 1} (checkpoint {entry.number}, event {entry.seq}) is "
                f"not database {sanitize(store.path)}'s checkpoint {line + 1}: it is another "
                "database's log, or the database lost or rewrote history"
            )
    _append_to_log(log_path, recorded[len(logged) - archived :])
    return [*logged, *recorded[len(logged) - archived :]]


def write_checkpoint(
    store: Store, key: SigningKey, log_path: str, tsa_url: str | None = None
) -> SignedCheckpoint:
    """Sign the chain's head with `key`, record it as a `checkpoint` event and append it to
    the log at `log_path` (created owner-only if missing).

    First the log must hold only checkpoints the chain holds, in order (a database
    restored from before a checkpoint, or another database's log, is refused); the
    chain's checkpoints missing from its end (a crash after a commit) are appended; and
    the chain since the last checkpoint must verify, so a tampered tail is never signed.
    With `tsa_url`, the signature is then timestamped by that RFC 3161 authority and the
    reply kept in the log line; if the authority fails, the checkpoint is logged without
    it and `TimestampRefused` says so.
    """
    with _locked_log(log_path):
        recorded = _logged_checkpoints(store, log_path)
        last = recorded[-1] if recorded else None
        _check_tail(store, last)

        def seal(
            head_seq: int, head_hash: str, previous: Mapping[str, Any] | None
        ) -> Mapping[str, Any]:
            before = None if previous is None else _parse_entry(previous, "the last checkpoint")
            statement = {
                "kind": STATEMENT_KIND,
                "version": 1,
                "database": str(uuid.uuid4()) if before is None else before.statement["database"],
                "number": 1 if before is None else before.number + 1,
                "seq": head_seq,
                "hash": head_hash,
                "time": utc_now(),
                "key": key.public.id,
                "previous": None if before is None else statement_digest(before.statement),
            }
            return SignedCheckpoint(statement, key.sign(statement_bytes(statement))).payload()

        with store.transaction() as connection:
            event = ledger.record_checkpoint(store, connection, seal)
        checkpoint = _parse_entry(event.payload, f"checkpoint event {event.seq}")
        failure: TimestampRefused | None = None
        if tsa_url is not None:
            try:
                reply = request_timestamp(tsa_url, timestamp_digest(checkpoint.signature))
                checkpoint = dataclasses.replace(checkpoint, timestamp=reply)
            except TimestampRefused as refused:
                failure = refused
        _append_to_log(log_path, [checkpoint])
        if failure is not None:
            raise TimestampRefused(
                f"checkpoint {checkpoint.number} was signed and logged without a timestamp: "
                f"{failure}"
            )
        return checkpoint


def _check_tail(store: Store, last: SignedCheckpoint | None) -> None:
    """Refuse to sign over a chain whose events since `last` do not verify."""
    if last is not None:
        # Its own event follows what it sealed (which an archive may have moved out).
        own = store.event_at(last.seq + 1)
        if own is None or own.prev_hash != last.hash or own.payload != last.payload():
            raise CheckpointRefused(
                f"database {sanitize(store.path)} contradicts its checkpoint {last.number}: "
                f"event {last.seq} no longer has the hash it signed"
            )
    report = store.verify_chain(None if last is None else last.seq + 1)
    if not report.ok:
        raise CheckpointRefused(
            f"database {sanitize(store.path)}: the chain is broken at event "
            f"{report.first_bad_seq} ({report.reason}), so its head is not signed"
        )


# -- checking -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CheckpointCheck:
    """What `check_checkpoints` found: every entry signed, chained and matched by the chain."""

    count: int
    last: SignedCheckpoint | None
    timestamped: int = 0
    last_attested: str | None = None


def check_checkpoints(
    store: Store,
    keys: Sequence[PublicKey],
    log_path: str,
    *,
    archived: Mapping[int, Event] | None = None,
    since: bool = False,
    tsa_certificate: str | None = None,
) -> CheckpointCheck:
    """Check the log at `log_path` with `keys` and the chain against it.

    Each entry must be signed by one of `keys`, numbered in order and name the digest of
    the one before (so an entry forged, altered, removed or reordered is refused); each
    must seal an event the database holds with the hash it signed, followed by its own
    `checkpoint` event; and every `checkpoint` event in the chain must have its entry (so
    a log cut at its end is refused).  With `tsa_certificate`, every entry's RFC 3161
    timestamp must verify with it (an entry without one is counted).  `archived`: the
    checkpoint events read from the archive's segments (without them a checkpoint of
    archived history is refused, or, `since`, left to the verify that read the archive).
    Raises `CheckpointRefused` naming the first entry or checkpoint that does not hold.
    The hashes of the events between checkpoints are the chain's to check.
    """
    where = f"checkpoint log {sanitize(log_path)}"
    entries = read_checkpoint_log(log_path)
    by_id = {key.id: key for key in keys}
    previous: SignedCheckpoint | None = None
    for line, entry in enumerate(entries, start=1):
        key = by_id.get(str(entry.statement["key"]))
        if key is None:
            raise CheckpointRefused(
                f"{where} line {line} is signed by key {sanitize(str(entry.statement['key']))}, "
                "which is not one of the public keys given"
            )
        if not key.verifies(entry.signature, statement_bytes(entry.statement)):
            raise CheckpointRefused(
                f"{where} line {line}: its signature does not verify with key {key.id[:16]} "
                "(the entry was forged or altered)"
            )
        if entry.number != line or entry.statement["previous"] != (
            None if previous is None else statement_digest(previous.statement)
        ):
            raise CheckpointRefused(
                f"{where} line {line} (checkpoint {entry.number}) does not follow the line "
                "before it: entries were removed or reordered"
            )
        if previous is not None and (
            entry.statement["database"] != previous.statement["database"]
            or entry.seq <= previous.seq
        ):
            raise CheckpointRefused(
                f"{where} line {line} (checkpoint {entry.number}) is not a later checkpoint of "
                "the same database as the line before it"
            )
        previous = entry
    timestamped, last_attested = 0, None
    if tsa_certificate is not None:
        for line, entry in enumerate(entries, start=1):
            if entry.timestamp is None:
                continue
            try:
                last_attested = verify_timestamp(
                    entry.timestamp, timestamp_digest(entry.signature), tsa_certificate
                )
            except TimestampRefused as refused:
                raise CheckpointRefused(
                    f"{where} line {line} (checkpoint {entry.number}): {refused}"
                ) from None
            timestamped += 1
    events = {event.seq: event for event in store.checkpoint_events()}
    events.update(archived or {})
    first = archive.first_seq(store)
    for entry in entries:
        if entry.seq + 1 < first and archived is None:
            if since:
                continue  # checked by the verify that read the archive
            raise CheckpointRefused(
                f"signed checkpoint {entry.number}'s event {entry.seq + 1} was archived: give "
                "--archive DIR to check the checkpoints of archived history"
            )
        _check_sealed(store, entry, events.get(entry.seq + 1), first)
    sealed_by = {entry.seq + 1 for entry in entries}
    for seq in sorted(events):
        if seq not in sealed_by:
            raise CheckpointRefused(
                f"the chain's checkpoint event {seq} has no entry in {where}: the log was cut "
                "(or its last entry was never written: `agentrt checkpoint` writes it again)"
            )
    return CheckpointCheck(
        len(entries), entries[-1] if entries else None, timestamped, last_attested
    )


def _check_sealed(store: Store, entry: SignedCheckpoint, own: Event | None, first: int) -> None:
    """The chain still holds what `entry` signed: its own `checkpoint` event, chained to
    the hash it signed (and the sealed event itself, where the database still holds it)."""
    name = f"signed checkpoint {entry.number} (event {entry.seq}, {sanitize(entry.time)})"
    if own is None or own.payload != entry.payload():
        raise CheckpointRefused(
            f"the database contradicts {name}: its checkpoint event {entry.seq + 1} is "
            "missing or differs from the entry in the log"
        )
    sealed_hash = own.prev_hash
    if entry.seq >= first:
        sealed = store.event_at(entry.seq)
        sealed_hash = "missing" if sealed is None else sealed.hash
    if sealed_hash != entry.hash or own.prev_hash != entry.hash:
        raise CheckpointRefused(
            f"the database contradicts {name}: event {entry.seq} has hash "
            f"{sealed_hash[:16]}, the checkpoint signed {entry.hash[:16]}; the history up "
            "to it was rewritten after it was signed"
        )
