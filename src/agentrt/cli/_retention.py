"""`checkpoint`: sign the chain's head with an operator's key; and the signed checks
`verify --key --checkpoints` adds (`retention/`, docs/retention.md)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import click

from ..retention import (
    ArchiveCheck,
    ArchiveRefused,
    CheckpointCheck,
    CheckpointRefused,
    PublicKey,
    archive_before,
    check_archive,
    check_checkpoints,
    check_continues,
    load_private_key,
    load_public_key,
    manifests_recorded,
    write_checkpoint,
)
from ..sanitize import sanitize
from ..store import Store, archive, utc_at
from ._app import CommandError, Settings, open_for_deciding, open_for_reading

__all__ = [
    "SignedCheck",
    "archive_command",
    "chain_start",
    "checkpoint",
    "evidence",
    "signed_check",
    "verify_evidence_command",
]


@click.command(short_help="Sign the chain's head and append it to a checkpoint log.")
@click.option(
    "--key",
    "key_path",
    required=True,
    metavar="PRIV",
    help="The operator's Ed25519 private key (PEM, as openssl genpkey -algorithm ed25519 "
    "writes it), owner-only.",
)
@click.option(
    "--log",
    "log_path",
    required=True,
    metavar="LOG",
    help="The checkpoint log, kept outside the database (created owner-only if missing).",
)
@click.option(
    "--tsa",
    "tsa_url",
    metavar="URL",
    help="An RFC 3161 timestamp authority to countersign the checkpoint's time.",
)
@click.pass_obj
def checkpoint(settings: Settings, key_path: str, log_path: str, tsa_url: str | None) -> None:
    """Sign the chain's head (its seq and hash, the time, the database's identity) with
    KEY, record it in the chain as a `checkpoint` event and append it to LOG.  A history
    rewritten later by someone without the key contradicts it (`verify --key --checkpoints`)."""
    key = load_private_key(key_path)
    with open_for_deciding(settings) as store:
        signed = write_checkpoint(store, key, log_path, tsa_url)
    output = settings.output
    if output.json:
        output.record(
            {
                "record": "checkpoint",
                "number": signed.number,
                "seq": signed.seq,
                "hash": signed.hash,
                "time": signed.time,
                "key": key.public.id,
                "log": log_path,
                "timestamped": signed.timestamp is not None,
            }
        )
        return
    output.line(
        f"checkpoint {signed.number}: event {signed.seq}:{signed.hash} signed at {signed.time} "
        f"by key {key.public.id[:16]}; appended to {sanitize(log_path)}"
        + ("; timestamped by the authority" if signed.timestamp is not None else "")
    )


@dataclass(frozen=True, slots=True)
class SignedCheck:
    """The outcome of checking a database against its checkpoint log (and its archive)
    for `verify`."""

    check: CheckpointCheck | None
    archive: ArchiveCheck | None
    problem: str | None

    def summary(self) -> str:
        archived = (
            ""
            if self.archive is None
            else f"; {self.archive.events} archived events in {self.archive.segments} "
            "signed segments chain to it"
        )
        if self.check is None:
            return archived
        last = self.check.last
        if last is None:
            return archived + "; the checkpoint log is empty"
        plural = "" if self.check.count == 1 else "s"
        attested = ""
        if self.check.last_attested is not None:
            attested = (
                f"; {self.check.timestamped} timestamped by the authority, the last at "
                f"{self.check.last_attested}"
            )
        return (
            f"{archived}; {self.check.count} signed checkpoint{plural} hold, the last at "
            f"event {last.seq} ({sanitize(last.time)})" + attested
        )


def load_keys(paths: Sequence[str]) -> list[PublicKey]:
    return [load_public_key(path) for path in paths]


def signed_check(
    store: Store,
    keys: Sequence[PublicKey],
    log_path: str,
    archive_directory: str | None,
    since: bool,
    tsa_certificate: str | None = None,
) -> SignedCheck:
    """Check the archive's segments (if given) and `store` against the checkpoint log; a
    refusal is reported, not raised."""
    found: ArchiveCheck | None = None
    try:
        if archive_directory is not None:
            found = check_archive(archive_directory, keys)
            check_continues(store, found, archive_directory)
            manifests_recorded(found, archive.archived_events(store))
        check = check_checkpoints(
            store,
            keys,
            log_path,
            archived=None if found is None else found.checkpoints,
            since=since,
            tsa_certificate=tsa_certificate,
        )
        return SignedCheck(check, found, None)
    except (CheckpointRefused, ArchiveRefused) as refused:
        return SignedCheck(None, found, str(refused))


def chain_start(
    store: Store, signed: SignedCheck | None, since: bool
) -> tuple[int | None, str | None]:
    """Where `verify` starts checking hashes, and a problem with it: after the last signed
    checkpoint (`--since-checkpoint`), at the database's first event after an archive (its
    link to the archived events checked against the archive, or the last `archived`
    event's manifest), else at event 1."""
    if since and signed is not None and signed.check is not None and signed.check.last:
        return signed.check.last.seq + 1, None
    origin = archive.chain_origin(store)
    if isinstance(origin, str):
        return archive.first_seq(store), origin
    return (None if origin[0] == 0 else origin[0] + 1), None


def _duration(text: str, option: str) -> float:
    match = re.fullmatch(r"(\d+)([smhd])", text.strip())
    if match is None:
        raise click.BadParameter(
            "expected a duration such as 90d, 12h, 30m or 0s", param_hint=option
        )
    return int(match.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86_400}[match.group(2)]


@click.command(short_help="Move old history into signed segment files.")
@click.option(
    "--before",
    "age",
    required=True,
    metavar="AGE",
    help="Archive the events older than AGE (90d, 12h, 30m, 0s).",
)
@click.option(
    "--to",
    "directory",
    required=True,
    metavar="DIR",
    help="The archive directory (this user's, not writable by others).",
)
@click.option("--key", "key_path", required=True, metavar="PRIV", help="The signing key.")
@click.option("--log", "log_path", required=True, metavar="LOG", help="The checkpoint log.")
@click.option(
    "--index-window",
    "index_window",
    default="1d",
    show_default=True,
    metavar="AGE",
    help="Never archive a proxied call younger than this: the proxy's index may still read "
    "it (keep it longer than every rule's repeat_window).",
)
@click.pass_obj
def archive_command(
    settings: Settings,
    age: str,
    directory: str,
    key_path: str,
    log_path: str,
    index_window: str,
) -> None:
    """Move the events older than AGE, up to the last signed checkpoint and never through
    a run that is not settled, into a sealed segment in DIR with a signed manifest; delete
    them and their runs from the database in the transaction that records the archive."""
    seconds = _duration(age, "--before")
    window = _duration(index_window, "--index-window")
    key = load_private_key(key_path)
    with open_for_deciding(settings) as store:
        now = store.clock()
        result = archive_before(
            store, key, log_path, directory, utc_at(now - seconds), now - window
        )
    output = settings.output
    manifest = None if result.manifest is None else result.manifest["statement"]
    if output.json:
        output.record(
            {
                "record": "archive",
                "archived": manifest is not None,
                "first_seq": None if manifest is None else manifest["first_seq"],
                "last_seq": None if manifest is None else manifest["last_seq"],
                "count": 0 if manifest is None else manifest["count"],
                "file": None if manifest is None else manifest["file"],
                "resumed": result.resumed,
                "reason": result.reason,
            }
        )
    elif manifest is None and not result.blocked:
        output.line(f"nothing archived: {result.reason}")
    if result.blocked:
        raise CommandError(f"nothing archived: {result.reason}")
    if output.json or manifest is None:
        return
    resumed = " (an interrupted archive, finished)" if result.resumed else ""
    output.line(
        f"archived events {manifest['first_seq']}..{manifest['last_seq']} "
        f"({manifest['count']} events) into {sanitize(str(manifest['file']))}{resumed}; "
        f"the cut is {result.reason}"
    )


@click.command(short_help="Write one run's evidence file, checkable offline.")
@click.argument("run_id", metavar="RUN", required=False)
@click.option("--approval", "approval_id", metavar="ID", help="The run of this approval.")
@click.option("-o", "--output", "path", required=True, metavar="FILE", help="Where to write it.")
@click.option("--key", "key_path", required=True, metavar="PUB", help="The public key.")
@click.option("--log", "log_path", required=True, metavar="LOG", help="The checkpoint log.")
@click.option(
    "--archive", "archive_directory", metavar="DIR", help="The archive, for an archived run."
)
@click.pass_obj
def evidence(
    settings: Settings,
    run_id: str | None,
    approval_id: str | None,
    path: str,
    key_path: str,
    log_path: str,
    archive_directory: str | None,
) -> None:
    """Write RUN's events (or the run of --approval), the hash path linking them to a
    signed checkpoint (or, archived, to its segment's signed manifest) and the public key
    into FILE, which `agentrt verify-evidence FILE` checks with nothing else."""
    from ..retention import build_evidence, write_evidence

    if (run_id is None) == (approval_id is None):
        raise click.UsageError("give a RUN or --approval ID")
    key = load_public_key(key_path)
    with open_for_reading(settings) as store:
        document = build_evidence(
            store, log_path, key, run_id=run_id, approval_id=approval_id,
            archive_directory=archive_directory,
        )  # fmt: skip
    write_evidence(path, document)
    anchor = document["anchor"]
    settings.output.line(
        f"evidence for run {sanitize(str(document['run_id']))}: {len(document['events'])} "
        f"events sealed by a signed {anchor['kind']} into {sanitize(path)}"
    )


@click.command("verify-evidence", short_help="Check an evidence file offline.")
@click.argument("path", metavar="FILE")
@click.option(
    "--key",
    "key_path",
    metavar="PUB",
    help="The operator's public key: fail unless the evidence is signed by it.",
)
@click.pass_obj
def verify_evidence_command(settings: Settings, path: str, key_path: str | None) -> None:
    """Check FILE on its own: its signed statement, every event's hash and link up to the
    event the statement seals, the run whole from its first event.  Needs no database."""
    from ..retention import EvidenceRefused, verify_evidence

    expected = None if key_path is None else load_public_key(key_path)
    try:
        with open(path, "rb") as file:
            data = file.read()
    except OSError as exc:
        raise CommandError(
            f"evidence file {sanitize(path)} cannot be read: {exc.strerror}"
        ) from None
    try:
        report = verify_evidence(data, expected)
    except EvidenceRefused as refused:
        raise CommandError(str(refused)) from None
    output = settings.output
    if output.json:
        output.record(
            {
                "record": "evidence",
                "ok": True,
                "run_id": report.run_id,
                "approval_id": report.approval_id,
                "key": report.key_id,
                "anchor": report.anchor_kind,
                "anchor_seq": report.anchor_seq,
                "anchor_time": report.anchor_time,
                "run_events": [event["type"] for event in report.run_events],
                "policy_ids": list(report.policy_ids),
            }
        )
        return
    types = ", ".join(str(event["type"]) for event in report.run_events)
    output.line(
        f"holds: run {sanitize(report.run_id)}, {len(report.run_events)} events ({types}), "
        f"sealed by a {report.anchor_kind} of event {report.anchor_seq} signed at "
        f"{sanitize(report.anchor_time)} by key {report.key_id}"
    )
