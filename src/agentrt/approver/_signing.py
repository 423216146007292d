"""The approver channel's signature scheme, its secret, its replay cache and its rate limit.

A request is signed with HMAC-SHA256 under a shared secret over
`timestamp \\n nonce \\n METHOD \\n path \\n body` and carries
`X-Approval-Timestamp` (Unix seconds), `X-Approval-Nonce` (1 to 64 visible
ASCII characters) and `X-Approval-Signature: v1=<hex>`.  The same scheme signs
the notifications the proxy sends (`_notify.py`), so a receiver checks both
with one function.  docs/approvals.md has a worked example to reproduce with
`openssl dgst -sha256 -hmac`.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import stat
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from ..errors import AgentrtError
from ..sanitize import sanitize

__all__ = [
    "DEFAULT_SKEW",
    "MIN_SECRET_BYTES",
    "NONCE_HEADER",
    "SECRET_FILE_VARIABLE",
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "ReplayCache",
    "SecretError",
    "TokenBucket",
    "read_secret",
    "sign",
    "signed_headers",
    "signing_input",
]

TIMESTAMP_HEADER: Final = "X-Approval-Timestamp"
NONCE_HEADER: Final = "X-Approval-Nonce"
SIGNATURE_HEADER: Final = "X-Approval-Signature"
SECRET_FILE_VARIABLE: Final = "AGENTRT_APPROVER_SECRET_FILE"  # noqa: S105 - a variable's name
MIN_SECRET_BYTES: Final = 32
MAX_NONCE: Final = 64
DEFAULT_SKEW: Final = 300.0
"""Seconds a request's timestamp may be from the server's clock, either way."""
_NONCE: Final = re.compile(r"[\x21-\x7e]{1,64}")
_TIMESTAMP: Final = re.compile(r"[0-9]{1,12}")
_SIGNATURE: Final = re.compile(r"v1=([0-9a-f]{64})")


class SecretError(AgentrtError):
    """The secret file cannot be used (missing, shared, too short)."""


def read_secret(path: str | os.PathLike[str]) -> bytes:
    """The shared secret: the file's bytes with one trailing newline removed.

    The file must be a regular file (not a link), the user's own, readable and
    writable by nobody else, and hold at least 32 bytes: whoever holds the
    secret can decide any approval whose run id they know.
    """
    shown = sanitize(os.fspath(path))
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        descriptor = os.open(path, flags)
    except OSError as exc:
        if Path(path).is_symlink():
            raise SecretError(
                f"the secret file {shown} is a symbolic link; name the file"
            ) from None
        raise SecretError(
            f"cannot read the secret file {shown}: {sanitize(exc.strerror or str(exc))}"
        ) from None
    try:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            raise SecretError(f"the secret file {shown} is not a regular file")
        if info.st_uid != os.geteuid():
            raise SecretError(f"the secret file {shown} is owned by another user")
        mode = stat.S_IMODE(info.st_mode)
        if mode & 0o077:
            raise SecretError(
                f"the secret file {shown} can be read or written by others (mode {mode:04o}); "
                "whoever reads it can decide approvals: chmod 600 it"
            )
        data = os.read(descriptor, 1 << 16)
    finally:
        os.close(descriptor)
    if data.endswith(b"\n"):
        data = data[:-1]
    if len(data) < MIN_SECRET_BYTES:
        raise SecretError(
            f"the secret file {shown} holds {len(data)} bytes; a secret is at least "
            f"{MIN_SECRET_BYTES} (e.g. `openssl rand -hex 32 > FILE`)"
        )
    return data


def signing_input(timestamp: str, nonce: str, method: str, path: str, body: bytes) -> bytes:
    """The bytes the signature covers: timestamp, nonce, method, path, body, `\\n` between."""
    return f"{timestamp}\n{nonce}\n{method.upper()}\n{path}\n".encode() + body


def sign(secret: bytes, timestamp: str, nonce: str, method: str, path: str, body: bytes) -> str:
    """The `X-Approval-Signature` value: `v1=` and the hex HMAC-SHA256 of `signing_input`."""
    digest = hmac.new(secret, signing_input(timestamp, nonce, method, path, body), hashlib.sha256)
    return "v1=" + digest.hexdigest()


def signed_headers(
    secret: bytes, method: str, path: str, body: bytes, *, now: float | None = None
) -> dict[str, str]:
    """The three headers of a request signed now, with a fresh nonce."""
    timestamp = str(int(time.time() if now is None else now))
    nonce = secrets.token_hex(16)
    return {
        TIMESTAMP_HEADER: timestamp,
        NONCE_HEADER: nonce,
        SIGNATURE_HEADER: sign(secret, timestamp, nonce, method, path, body),
    }


@dataclass(frozen=True, slots=True)
class Claimed:
    """A request's signing headers, checked for shape and time (not yet for the signature)."""

    timestamp: str
    nonce: str
    signature: str


def claimed(
    timestamp: str | None, nonce: str | None, signature: str | None, now: float, skew: float
) -> Claimed:
    """The headers if they are well formed and the timestamp is within `skew` of `now`;
    `(code, sentence)` as a `ValueError`'s args otherwise."""
    if timestamp is None or nonce is None or signature is None:
        raise ValueError(
            "bad_signature",
            f"the request is not signed ({TIMESTAMP_HEADER}, {NONCE_HEADER} and "
            f"{SIGNATURE_HEADER} are required)",
        )
    if not _TIMESTAMP.fullmatch(timestamp):
        raise ValueError("bad_signature", f"{TIMESTAMP_HEADER} must be whole Unix seconds")
    if not _NONCE.fullmatch(nonce):
        raise ValueError(
            "bad_signature", f"{NONCE_HEADER} must be 1 to {MAX_NONCE} visible ASCII characters"
        )
    match = _SIGNATURE.fullmatch(signature)
    if match is None:
        raise ValueError(
            "bad_signature", f"{SIGNATURE_HEADER} must be v1= and 64 lowercase hex digits"
        )
    if abs(int(timestamp) - now) > skew:
        raise ValueError(
            "stale_timestamp",
            f"{TIMESTAMP_HEADER} is more than {skew:g} seconds from the server's clock",
        )
    return Claimed(timestamp, nonce, match.group(1))


def verify(
    secret: bytes, claim: Claimed, method: str, path: str, body: bytes
) -> bool:  # fmt: skip
    """Whether `claim`'s signature is this request's, compared in constant time."""
    expected = sign(secret, claim.timestamp, claim.nonce, method, path, body)[3:]
    return hmac.compare_digest(expected.encode(), claim.signature.encode())


@dataclass
class ReplayCache:
    """Signatures already accepted, each kept until its timestamp leaves the window.

    Bounded: at most `capacity` entries.  Expired entries are dropped first; if
    the cache is still full, the request is refused (never an entry forgotten
    early, which would let its request be replayed).  With the rate limit in
    front, `capacity` above `rate * 2 * skew + burst` is never reached.
    """

    skew: float = DEFAULT_SKEW
    capacity: int = 20_000
    _seen: OrderedDict[str, float] = field(default_factory=OrderedDict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def admit(self, signature: str, timestamp: int, now: float) -> str | None:
        """Remember `signature`; None, or why it is refused (`replayed`, `replay_cache_full`)."""
        with self._lock:
            while self._seen:
                oldest, until = next(iter(self._seen.items()))
                if until >= now:
                    break
                del self._seen[oldest]
            if signature in self._seen:
                return "replayed"
            if len(self._seen) >= self.capacity:
                # Dropping entries in insertion order above is only a start: a later
                # insertion may carry an earlier timestamp, so sweep them all.
                for key in [key for key, until in self._seen.items() if until < now]:
                    del self._seen[key]
                if len(self._seen) >= self.capacity:
                    return "replay_cache_full"
            self._seen[signature] = timestamp + self.skew
            return None

    def __len__(self) -> int:
        return len(self._seen)


@dataclass
class TokenBucket:
    """A token bucket: `rate` requests a second on average, `burst` at once."""

    rate: float = 10.0
    burst: float = 20.0
    _tokens: float = -1.0
    _updated: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, now: float | None = None) -> bool:
        """Spend one token if there is one (monotonic `now`)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            if self._tokens < 0:
                self._tokens, self._updated = self.burst, now
            self._tokens = min(self.burst, self._tokens + (now - self._updated) * self.rate)
            self._updated = now
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                return True
            return False
