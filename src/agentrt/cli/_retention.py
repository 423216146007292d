"""`checkpoint`: sign the chain's head with an operator's key; and the signed checks
`verify --key --checkpoints` adds (`retention/`, docs/retention.md)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import click

from ..retention import (
    CheckpointCheck,
    CheckpointRefused,
    PublicKey,
    load_private_key,
    load_public_key,
    write_checkpoint,
)
from ..sanitize import sanitize
from ..store import Store
from ._app import Settings, open_for_deciding

__all__ = ["SignedCheck", "checkpoint", "signed_check"]


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
@click.pass_obj
def checkpoint(settings: Settings, key_path: str, log_path: str) -> None:
    """Sign the chain's head (its seq and hash, the time, the database's identity) with
    KEY, record it in the chain as a `checkpoint` event and append it to LOG.  A history
    rewritten later by someone without the key contradicts it (`verify --key --checkpoints`)."""
    key = load_private_key(key_path)
    with open_for_deciding(settings) as store:
        signed = write_checkpoint(store, key, log_path)
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
            }
        )
        return
    output.line(
        f"checkpoint {signed.number}: event {signed.seq}:{signed.hash} signed at {signed.time} "
        f"by key {key.public.id[:16]}; appended to {sanitize(log_path)}"
    )


@dataclass(frozen=True, slots=True)
class SignedCheck:
    """The outcome of checking a database against its checkpoint log for `verify`."""

    check: CheckpointCheck | None
    problem: str | None

    def start(self, since_checkpoint: bool) -> int | None:
        """The first event the chain needs checking from: after the last checkpoint if asked."""
        if not since_checkpoint or self.check is None or self.check.last is None:
            return None
        return self.check.last.seq + 1

    def summary(self) -> str:
        if self.check is None:
            return ""
        last = self.check.last
        if last is None:
            return "; the checkpoint log is empty"
        return (
            f"; {self.check.count} signed checkpoints hold, the last at event {last.seq} "
            f"({sanitize(last.time)})"
        )


def load_keys(paths: Sequence[str]) -> list[PublicKey]:
    return [load_public_key(path) for path in paths]


def signed_check(store: Store, keys: Sequence[PublicKey], log_path: str) -> SignedCheck:
    """Check `store` against the checkpoint log; a refusal is reported, not raised."""
    from ..retention import check_checkpoints

    try:
        return SignedCheck(check_checkpoints(store, keys, log_path), None)
    except CheckpointRefused as refused:
        return SignedCheck(None, str(refused))
