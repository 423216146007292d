"""The approvers' registry: who may decide in passkey mode, and with which public key.

One owner-only JSON file the proxy, the inbox and `agentrt verify` read: each
approver has a name, the principal subject they are (so separation of duties
can compare them with a run's principal) and one WebAuthn credential (its id and
COSE public key).  Whoever can write this file can add a key of their own, so a
file others can read or write is refused, as the other operator files are.
"""

from __future__ import annotations

import base64
import json
import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from ..errors import AgentrtError
from ..sanitize import sanitize

__all__ = [
    "RP_ID",
    "Approver",
    "Registry",
    "RegistryError",
    "b64url",
    "from_b64url",
    "read_registry",
    "require_webauthn",
    "write_registry",
]

RP_ID: Final = "localhost"
"""The WebAuthn relying party: the inbox is served at http://localhost:PORT (a browser
refuses an IP address as an RP id, and localhost is a secure context over plain HTTP)."""
_FORMAT: Final = "agentrt/approvers/v1"
_MAX_BYTES: Final = 1024 * 1024


class RegistryError(AgentrtError):
    """The approvers' registry cannot be used as it is; the message names the file."""


def require_webauthn() -> None:
    """Refuse, in one sentence, where the `passkeys` extra (py_webauthn) is not installed."""
    try:
        import webauthn  # noqa: F401
    except ImportError:
        raise RegistryError(
            "passkeys need py_webauthn, which is not installed: pip install 'agentrt[passkeys]'"
        ) from None


def b64url(data: bytes) -> str:
    """Unpadded base64url, as WebAuthn writes its binary fields."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def from_b64url(text: str) -> bytes:
    """The bytes of unpadded (or padded) base64url `text`; ValueError if it is not."""
    if not isinstance(text, str) or not text.isascii():
        raise ValueError("is not base64url text")
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except ValueError:
        raise ValueError("is not base64url text") from None


@dataclass(frozen=True, slots=True)
class Approver:
    """A person who may decide: a name shown and recorded, the principal subject they are,
    and their passkey (credential id, COSE public key)."""

    name: str
    subject: str
    credential_id: bytes
    public_key: bytes
    added_at: str

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "subject": self.subject,
            "credential_id": b64url(self.credential_id),
            "public_key": b64url(self.public_key),
            "added_at": self.added_at,
        }


@dataclass(frozen=True, slots=True)
class Registry:
    """The approvers, looked up by name or by credential id."""

    path: Path
    approvers: tuple[Approver, ...] = ()

    def by_credential(self, credential_id: bytes) -> Approver | None:
        for approver in self.approvers:
            if approver.credential_id == credential_id:
                return approver
        return None

    def by_name(self, name: str) -> Approver | None:
        for approver in self.approvers:
            if approver.name == name:
                return approver
        return None


def _approver(entry: Any, where: str) -> Approver:
    if not isinstance(entry, dict):
        raise ValueError(f"{where} is not an object")
    fields = {}
    for name in ("name", "subject", "credential_id", "public_key", "added_at"):
        value = entry.get(name)
        if not isinstance(value, str) or not value:
            raise ValueError(f"{where} has no {name}")
        fields[name] = value
    return Approver(
        name=fields["name"],
        subject=fields["subject"],
        credential_id=from_b64url(fields["credential_id"]),
        public_key=from_b64url(fields["public_key"]),
        added_at=fields["added_at"],
    )


def _check_owner(path: Path, info: os.stat_result, shown: str) -> None:
    """The user's own file, owner-only; or (installed out of the host's reach) root's, in a
    directory of root's, that only root can write — it holds public keys, not secrets."""
    mode = stat.S_IMODE(info.st_mode)
    if info.st_uid == os.geteuid():
        if mode & 0o077:
            raise RegistryError(
                f"the approvers' registry {shown} can be read or written by others (mode "
                f"{mode:04o}); whoever writes it can add a key of their own: chmod 600 it"
            )
        return
    if info.st_uid != 0:
        raise RegistryError(f"the approvers' registry {shown} is owned by another user")
    if mode & 0o022:
        raise RegistryError(
            f"the approvers' registry {shown} can be written by others than root (mode "
            f"{mode:04o}); whoever writes it can add a key of their own"
        )
    directory = os.stat(path.parent)
    if directory.st_uid != 0 or stat.S_IMODE(directory.st_mode) & 0o022:
        raise RegistryError(
            f"the approvers' registry {shown} is in a directory others than root can write; "
            "whoever writes it can put another registry in its place"
        )


def read_registry(path: str | os.PathLike[str], *, missing_ok: bool = False) -> Registry:
    """The registry in `path`: a regular file of this user's, that nobody else can read or
    write (`missing_ok`: a file not there yet is an empty registry)."""
    registry_path = Path(path)
    shown = sanitize(str(registry_path))
    flags = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        descriptor = os.open(registry_path, flags)
    except FileNotFoundError:
        if missing_ok:
            return Registry(registry_path)
        raise RegistryError(
            f"the approvers' registry {shown} does not exist; add an approver with "
            "agentrt approvers add"
        ) from None
    except OSError as exc:
        raise RegistryError(
            f"cannot read the approvers' registry {shown}: {exc.strerror}"
        ) from None
    try:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            raise RegistryError(f"the approvers' registry {shown} is not a regular file")
        _check_owner(registry_path, info, shown)
        data = os.read(descriptor, _MAX_BYTES + 1)
    finally:
        os.close(descriptor)
    if len(data) > _MAX_BYTES:
        raise RegistryError(f"the approvers' registry {shown} is larger than a registry can be")
    try:
        document = json.loads(data)
        if not isinstance(document, dict) or document.get("format") != _FORMAT:
            raise ValueError(f'is not an "{_FORMAT}" document')
        entries = document.get("approvers")
        if not isinstance(entries, list):
            raise ValueError("has no list of approvers")
        approvers = tuple(
            _approver(entry, f"approver {index + 1}") for index, entry in enumerate(entries)
        )
    except ValueError as exc:
        raise RegistryError(
            f"the approvers' registry {shown} cannot be read: {sanitize(str(exc))}"
        ) from None
    names = [approver.name for approver in approvers]
    if len(set(names)) != len(names):
        raise RegistryError(f"the approvers' registry {shown} names an approver twice")
    return Registry(registry_path, approvers)


def write_registry(registry: Registry) -> None:
    """Write `registry` whole, owner-only (0600), replacing the file in one rename."""
    document = {
        "format": _FORMAT,
        "rp_id": RP_ID,
        "approvers": [approver.to_json() for approver in registry.approvers],
    }
    directory = registry.path.parent
    descriptor, temporary = tempfile.mkstemp(prefix=".approvers-", dir=directory)
    try:
        os.fchmod(descriptor, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            json.dump(document, handle, indent=2)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, registry.path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
