"""The approver: one run's approvals shown and decided where the person already is.

- `Approver(store, run_id)`: a run's pending approval, one approval's view (JSON and
  sanitized plain text), approve / reject bound to the hash shown, cancel; never across
  runs.
- `approver_app(store, secret)`: the signed HTTP channel as an ASGI app (Starlette), which
  `agentrt approver serve` serves; `signed_request` signs a client's requests for it.
- The signature scheme (`sign`, `signing_input`, `read_secret`) is shared with the
  notifications the proxy sends (`"notify"` in proxy.json).

docs/approvals.md describes the channel, the scheme and the notifications.
"""

from __future__ import annotations

from ._app import MAX_BODY, ChannelLimits, approver_app
from ._client import signed_request
from ._interface import ApprovalView, Approver, ApproverRefusal, Decided, approval_path
from ._signing import (
    DEFAULT_SKEW,
    NONCE_HEADER,
    SECRET_FILE_VARIABLE,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    SecretError,
    read_secret,
    sign,
    signing_input,
)

__all__ = [
    "DEFAULT_SKEW",
    "MAX_BODY",
    "NONCE_HEADER",
    "SECRET_FILE_VARIABLE",
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "ApprovalView",
    "Approver",
    "ApproverRefusal",
    "ChannelLimits",
    "Decided",
    "SecretError",
    "approval_path",
    "approver_app",
    "read_secret",
    "sign",
    "signed_request",
    "signing_input",
]
