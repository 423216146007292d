"""Evidence a third party can check: one file holding a run's events, the hash path that
links them to a signed statement (a checkpoint, or an archived segment's manifest), and
the public key, which `verify_evidence` checks offline with nothing else.

The hash path is every event from the run's first to the one the statement seals, each
whole (an event's hash covers its content, so an event of another run in between cannot
be given by its hash alone: a forger could restate any hash after a change).  A path is
as long as the time from the run to the next checkpoint: a day, with daily checkpoints.
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from ..canonical import JSONBoundaryError, canonical_json, parse_json
from ..errors import AgentrtError, RunNotFound
from ..sanitize import sanitize
from ..store import Store, archive, event_hash
from ._archive import check_archive, read_manifest
from ._checkpoints import SignedCheckpoint, read_checkpoint_log, statement_bytes
from ._keys import PublicKey, public_key_from_pem

__all__ = [
    "EVIDENCE_KIND",
    "EvidenceRefused",
    "EvidenceReport",
    "build_evidence",
    "verify_evidence",
    "write_evidence",
]

EVIDENCE_KIND: Final = "agentrt evidence"
_FIELDS: Final = frozenset(
    {"kind", "version", "run_id", "approval_id", "public_key", "anchor", "events"}
)
_EVENT_FIELDS: Final = ("seq", "run_id", "type", "payload", "created_at", "prev_hash", "hash")


class EvidenceRefused(AgentrtError):
    """Evidence cannot be written for this run, or an evidence file does not hold."""


def build_evidence(
    store: Store,
    log_path: str,
    public_key: PublicKey,
    run_id: str | None = None,
    approval_id: str | None = None,
    archive_directory: str | None = None,
) -> dict[str, Any]:
    """The evidence document for a run (or the run of an approval): its events and the
    path to the first signed checkpoint after its last one, or, for an archived run, to
    its segment's signed manifest."""
    if approval_id is not None:
        run_id = _run_of_approval(store, approval_id, archive_directory)
    assert run_id is not None
    recorded = store.list_events(run_id, limit=1)
    if recorded:
        first = recorded[0].seq
        last = _last_seq(store, run_id)
        anchor = _checkpoint_after(log_path, last, run_id)
        events = list(archive.raw_events(store, first, anchor.seq))
        kind = "checkpoint"
    else:
        if archive_directory is None:
            raise EvidenceRefused(
                f"run {sanitize(run_id)} is not in the database: give --archive DIR if it was "
                "archived"
            )
        anchor, events = _from_archive(archive_directory, run_id, public_key)
        kind = "segment"
    if str(anchor.statement["key"]) != public_key.id:
        raise EvidenceRefused(
            f"the statement that seals run {sanitize(run_id)} is signed by key "
            f"{sanitize(str(anchor.statement['key']))[:16]}, not the key given"
        )
    return {
        "kind": EVIDENCE_KIND,
        "version": 1,
        "run_id": run_id,
        "approval_id": approval_id,
        "public_key": public_key.pem,
        "anchor": {"kind": kind, **anchor.payload()},
        "events": events,
    }


def _last_seq(store: Store, run_id: str) -> int:
    total = store.count_events(run_id)
    return store.list_events(run_id, limit=1, offset=total - 1)[0].seq


def _checkpoint_after(log_path: str, last: int, run_id: str) -> SignedCheckpoint:
    for entry in read_checkpoint_log(log_path):
        if entry.seq >= last:
            return entry
    raise EvidenceRefused(
        f"run {sanitize(run_id)}'s last event ({last}) comes after the last signed checkpoint: "
        "run agentrt checkpoint first"
    )


def _run_of_approval(store: Store, approval_id: str, archive_directory: str | None) -> str:
    try:
        return store.get_approval(approval_id).run_id
    except RunNotFound:
        pass
    if archive_directory is not None:
        for line in _archived_lines(archive_directory):
            if line["type"] == "approval_requested" and (
                parse_json(line["payload"]).get("approval_id") == approval_id
            ):
                return str(line["run_id"])
    raise EvidenceRefused(f"no approval {sanitize(approval_id)} in the database or the archive")


def _archived_lines(directory: str) -> Iterator[dict[str, Any]]:
    for name in sorted(os.listdir(directory)):
        if name.endswith(".jsonl.gz"):
            with gzip.open(os.path.join(directory, name), "rb") as lines:
                for line in lines:
                    yield parse_json(line)


def _from_archive(
    directory: str, run_id: str, public_key: PublicKey
) -> tuple[SignedCheckpoint, list[dict[str, Any]]]:
    check_archive(directory, [public_key])
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".manifest"):
            continue
        manifest = read_manifest(os.path.join(directory, name))
        events: list[dict[str, Any]] = []
        with gzip.open(os.path.join(directory, str(manifest.statement["file"])), "rb") as lines:
            for line in lines:
                record = parse_json(line)
                if events or record["run_id"] == run_id:
                    events.append(record)
        if events:
            return manifest, events
    raise EvidenceRefused(f"run {sanitize(run_id)} is in neither the database nor the archive")


# -- checking -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EvidenceReport:
    """What an evidence file proves, once it holds."""

    run_id: str
    approval_id: str | None
    key_id: str
    anchor_kind: str
    anchor_seq: int
    anchor_time: str
    run_events: Sequence[Mapping[str, Any]]
    path_length: int
    policy_ids: Sequence[str]


def verify_evidence(data: bytes, expected_key: PublicKey | None = None) -> EvidenceReport:
    """Check an evidence file on its own: the statement's signature by the key it carries
    (and, if given, that this is `expected_key`), every event's hash and link along the
    path, the path ending at the event the statement seals, the run whole from its first
    event, and the approval's events among them.  Raises `EvidenceRefused` naming what
    does not hold."""
    try:
        document = parse_json(data)
    except JSONBoundaryError as exc:
        raise EvidenceRefused(f"the evidence file is not JSON: {exc}") from None
    if (
        not isinstance(document, dict)
        or set(document) != _FIELDS
        or document["kind"] != EVIDENCE_KIND
        or not isinstance(document["events"], list)
        or not isinstance(document["anchor"], dict)
        or not isinstance(document["run_id"], str)
        or not isinstance(document["public_key"], str)
    ):
        raise EvidenceRefused("the file is not an agentrt evidence file")
    key = public_key_from_pem(document["public_key"], "the evidence file's public key")
    if expected_key is not None and key.id != expected_key.id:
        raise EvidenceRefused(
            f"the evidence is signed by key {key.id[:16]}, not the operator's key "
            f"{expected_key.id[:16]}"
        )
    anchor = dict(document["anchor"])
    anchor_kind = anchor.pop("kind", None)
    if anchor_kind not in ("checkpoint", "segment") or set(anchor) != {"signature", "statement"}:
        raise EvidenceRefused("the evidence's anchor is neither a checkpoint nor a segment")
    statement = anchor["statement"]
    if not isinstance(statement, dict) or statement.get("key") != key.id:
        raise EvidenceRefused("the evidence's statement does not name the key it carries")
    if not isinstance(anchor["signature"], str) or not key.verifies(
        anchor["signature"], statement_bytes(statement)
    ):
        raise EvidenceRefused(
            "the evidence's signed statement does not verify with its key: it was forged or altered"
        )
    sealed_seq, sealed_hash = (
        (statement.get("seq"), statement.get("hash"))
        if anchor_kind == "checkpoint"
        else (statement.get("last_seq"), statement.get("last_hash"))
    )
    events = document["events"]
    run_id = document["run_id"]
    _check_path(events, run_id, sealed_seq, sealed_hash)
    run_events = [event for event in events if event["run_id"] == run_id]
    approval_id = document["approval_id"]
    if approval_id is not None and not any(
        parse_json(event["payload"]).get("approval_id") == approval_id for event in run_events
    ):
        raise EvidenceRefused(
            f"the evidence holds no event of approval {sanitize(str(approval_id))}"
        )
    policy_ids = sorted(
        {
            str(parse_json(event["payload"]).get("policy_id"))
            for event in run_events
            if event["type"] == "policy_decided" and "policy_id" in event["payload"]
        }
    )
    return EvidenceReport(
        run_id, approval_id, key.id, anchor_kind, int(str(sealed_seq)),
        str(statement.get("time", "")), run_events, len(events), policy_ids,
    )  # fmt: skip


def _check_path(events: list[Any], run_id: str, sealed_seq: Any, sealed_hash: Any) -> None:
    if not events:
        raise EvidenceRefused("the evidence holds no events")
    previous: Mapping[str, Any] | None = None
    for event in events:
        if not isinstance(event, dict) or tuple(sorted(event)) != tuple(sorted(_EVENT_FIELDS)):
            raise EvidenceRefused("an event of the evidence is not a whole stored event")
        seq = event["seq"]
        if previous is not None and (
            seq != previous["seq"] + 1 or event["prev_hash"] != previous["hash"]
        ):
            raise EvidenceRefused(
                f"the evidence's hash path skips from event {previous['seq']} to event "
                f"{sanitize(str(seq))}: an event is missing or out of order"
            )
        try:
            digest = event_hash(
                str(event["prev_hash"]), int(seq), str(event["run_id"]), str(event["type"]),
                str(event["payload"]), str(event["created_at"]),
            )  # fmt: skip
            parse_json(str(event["payload"]))
        except (ValueError, TypeError):
            raise EvidenceRefused(
                f"event {sanitize(str(seq))} of the evidence is malformed"
            ) from None
        if digest != event["hash"]:
            raise EvidenceRefused(
                f"event {sanitize(str(seq))} of the evidence does not match its hash: it was "
                "altered"
            )
        previous = event
    assert previous is not None
    if previous["seq"] != sealed_seq or previous["hash"] != sealed_hash:
        raise EvidenceRefused(
            f"the evidence's hash path ends at event {previous['seq']}, not at the event the "
            f"signed statement seals ({sanitize(str(sealed_seq))}) with its hash"
        )
    first = events[0]
    if first["run_id"] != run_id or first["type"] != "run_started":
        raise EvidenceRefused(
            f"the evidence does not begin with run {sanitize(run_id)}'s first event"
        )


def write_evidence(path: str, document: Mapping[str, Any]) -> None:
    """Write the evidence file (owner-only; it may hold other runs' events on its path)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    with os.fdopen(os.open(path, flags, 0o600), "wb") as file:
        file.write(canonical_json(document).encode("utf-8") + b"\n")
