"""RFC 3161 timestamps: a third party's signed word that a checkpoint's signature existed
at a time, asked of a timestamp authority over HTTP and checked against the authority's
certificate.  The ASN.1 (the query, the reply, its CMS signature) is OpenSSL's own
`openssl ts`, run as a program: the `cryptography` package does not read timestamp
tokens, and OpenSSL is on every host that signs or checks."""

from __future__ import annotations

import base64
import hashlib
import os
import re
import subprocess
import tempfile
from typing import Final

from ..errors import AgentrtError
from ..sanitize import sanitize

__all__ = ["TimestampRefused", "request_timestamp", "timestamp_digest", "verify_timestamp"]

_TIMEOUT_S: Final = 15.0
_MAX_REPLY: Final = 1 << 20
_TIME: Final = re.compile(r"^Time stamp: (.+)$", re.MULTILINE)


class TimestampRefused(AgentrtError):
    """A timestamp authority did not grant a timestamp, or a timestamp does not verify."""


def timestamp_digest(signature: str) -> str:
    """What is timestamped: the SHA-256 of a checkpoint's signature bytes (the signature
    covers the statement, so the timestamp covers both)."""
    return hashlib.sha256(base64.b64decode(signature.encode("ascii"))).hexdigest()


def _openssl(*args: str, data: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    try:
        return subprocess.run(
            ["openssl", "ts", *args], input=data, capture_output=True, timeout=30, check=False
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise TimestampRefused(f"openssl ts cannot be run: {exc}") from None


def request_timestamp(url: str, digest: str) -> str:
    """Ask the authority at `url` to timestamp `digest` (SHA-256, hex); its reply, base64."""
    # Here, not at the top: `urllib.request` brings `email` and `http` (issue 36), which
    # the commands that only read checkpoints never need.
    import urllib.error
    import urllib.request

    query = _openssl("-query", "-digest", digest, "-sha256", "-cert")
    if query.returncode != 0:
        raise TimestampRefused(
            f"openssl ts -query failed: {sanitize(query.stderr.decode(errors='replace'))}"
        )
    request = urllib.request.Request(  # noqa: S310 - the operator's own authority's URL
        url,
        data=query.stdout,
        headers={"Content-Type": "application/timestamp-query"},
        method="POST",
    )
    if not url.startswith(("http://", "https://")):
        raise TimestampRefused(f"timestamp authority {sanitize(url)} is not an http(s) URL")
    try:
        with urllib.request.urlopen(request, timeout=_TIMEOUT_S) as answer:  # noqa: S310
            reply = answer.read(_MAX_REPLY)
    except (urllib.error.URLError, OSError) as exc:
        raise TimestampRefused(
            f"timestamp authority {sanitize(url)} did not answer: {sanitize(str(exc))}"
        ) from None
    with tempfile.TemporaryDirectory(prefix="agentrt-tsa-") as directory:
        path = os.path.join(directory, "reply.tsr")
        with open(path, "wb") as file:
            file.write(reply)
        shown = _openssl("-reply", "-in", path, "-text")
    text = shown.stdout.decode(errors="replace")
    if shown.returncode != 0 or "Status: Granted" not in text:
        raise TimestampRefused(f"timestamp authority {sanitize(url)} did not grant a timestamp")
    return base64.b64encode(reply).decode("ascii")


def verify_timestamp(reply: str, digest: str, authority_certificate: str) -> str:
    """Check a timestamp reply (base64) over `digest` against the authority's certificate
    (a PEM file: the authority's, or the root it chains to); the time it attests."""
    try:
        data = base64.b64decode(reply.encode("ascii"), validate=True)
    except (ValueError, UnicodeError):
        raise TimestampRefused("the timestamp is not base64") from None
    with tempfile.TemporaryDirectory(prefix="agentrt-tsa-") as directory:
        path = os.path.join(directory, "reply.tsr")
        with open(path, "wb") as file:
            file.write(data)
        checked = _openssl(
            "-verify", "-digest", digest, "-in", path, "-CAfile", authority_certificate
        )
        if checked.returncode != 0:
            raise TimestampRefused(
                "the timestamp does not verify with the authority's certificate "
                f"{sanitize(authority_certificate)} (forged, altered, or over another checkpoint)"
            )
        shown = _openssl("-reply", "-in", path, "-text")
    found = _TIME.search(shown.stdout.decode(errors="replace"))
    return sanitize(found.group(1).strip()) if found else "unknown"
