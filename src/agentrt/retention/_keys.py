"""An operator's Ed25519 keys, read from the PEM files `openssl genpkey -algorithm ed25519`
(PKCS#8) and `openssl pkey -pubout` (SubjectPublicKeyInfo) write.

The `cryptography` package is imported only here, and only when a key is read, so
`import agentrt` and the command stay fast for everything that signs nothing.
"""

from __future__ import annotations

import base64
import os
import stat
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..canonical import sha256_hex
from ..errors import AgentrtError
from ..sanitize import sanitize

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

__all__ = [
    "KeyRefused",
    "PublicKey",
    "SigningKey",
    "key_id",
    "load_private_key",
    "load_public_key",
    "public_key_from_pem",
]

_MAX_KEY_BYTES = 64 * 1024


class KeyRefused(AgentrtError):
    """A key file is refused: others could read or write it, or it is not an Ed25519 key."""


def key_id(public_bytes: bytes) -> str:
    """A key's fingerprint: the SHA-256 of its 32 raw public bytes, in hex."""
    return sha256_hex(public_bytes)


@dataclass(frozen=True, slots=True)
class PublicKey:
    """A public key that checks signatures, with its fingerprint and its PEM text."""

    key: Ed25519PublicKey
    id: str
    pem: str

    def verifies(self, signature: str, message: bytes) -> bool:
        """Whether `signature` (base64) is this key's signature of `message`."""
        from cryptography.exceptions import InvalidSignature

        try:
            raw = base64.b64decode(signature.encode("ascii"), validate=True)
            self.key.verify(raw, message)
        except (InvalidSignature, ValueError, UnicodeError):
            return False
        return True


@dataclass(frozen=True, slots=True)
class SigningKey:
    """A private key that signs checkpoints, and its public half."""

    key: Ed25519PrivateKey
    public: PublicKey

    def sign(self, message: bytes) -> str:
        """The base64 Ed25519 signature of `message`."""
        return base64.b64encode(self.key.sign(message)).decode("ascii")


def _public(key: Ed25519PublicKey) -> PublicKey:
    from cryptography.hazmat.primitives import serialization

    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    pem = key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode("ascii")
    return PublicKey(key, key_id(raw), pem)


def _read_key_file(path: str, what: str, *, owner_only: bool) -> bytes:
    """The file's bytes, refused unless it is a regular file no one else could have
    written (and, for a private key, no one else can read)."""
    try:
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise KeyRefused(f"{what} {sanitize(path)} cannot be read: {exc.strerror}") from None
    try:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            raise KeyRefused(f"{what} {sanitize(path)} is not a regular file")
        mode = stat.S_IMODE(info.st_mode)
        if owner_only and (info.st_uid != os.geteuid() or mode & 0o077):
            raise KeyRefused(
                f"{what} {sanitize(path)} is not owner-only (mode {mode:04o}, owner uid "
                f"{info.st_uid}): anyone else who can read it can sign as you; make it this "
                "user's with chmod 600"
            )
        if mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise KeyRefused(
                f"{what} {sanitize(path)} can be written by others (mode {mode:04o}), so it "
                "proves nothing; keep it where the database's writers cannot write"
            )
        return os.read(descriptor, _MAX_KEY_BYTES)
    finally:
        os.close(descriptor)


def load_private_key(path: str) -> SigningKey:
    """The Ed25519 private key in the PEM (PKCS#8) file `path`, which must be owner-only."""
    data = _read_key_file(path, "private key", owner_only=True)
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    try:
        key: Any = load_pem_private_key(data, password=None)
    except TypeError:
        raise KeyRefused(
            f"private key {sanitize(path)} is encrypted; give an unencrypted PKCS#8 key kept "
            "owner-only"
        ) from None
    except ValueError:
        raise KeyRefused(
            f"private key {sanitize(path)} is not a PEM private key (openssl genpkey "
            "-algorithm ed25519 writes one)"
        ) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyRefused(f"private key {sanitize(path)} is not an Ed25519 key")
    return SigningKey(key, _public(key.public_key()))


def public_key_from_pem(pem: bytes | str, where: str) -> PublicKey:
    """The Ed25519 public key in PEM text (SubjectPublicKeyInfo); `where` names it in errors."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    data = pem.encode("ascii", "replace") if isinstance(pem, str) else pem
    try:
        key: Any = load_pem_public_key(data)
    except ValueError:
        raise KeyRefused(
            f"{where} is not a PEM public key (openssl pkey -pubout writes one)"
        ) from None
    if not isinstance(key, Ed25519PublicKey):
        raise KeyRefused(f"{where} is not an Ed25519 key")
    return _public(key)


def load_public_key(path: str) -> PublicKey:
    """The Ed25519 public key in the PEM file `path`, refused if others can write it."""
    data = _read_key_file(path, "public key", owner_only=False)
    return public_key_from_pem(data, f"public key {sanitize(path)}")
