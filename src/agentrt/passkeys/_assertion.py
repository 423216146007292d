"""A WebAuthn assertion over one decision: its challenge, its parts, and checking it.

The challenge is derived, not stored: SHA-256 over the approval's id and hash,
the verdict and the standing grant's scope hash (decision 0041).  An assertion
therefore signs exactly one decision on exactly one approval, and the server
keeps no nonce; the same derivation lets `agentrt verify` check it again years
later against the registered public key.  `webauthn` (py_webauthn) does the
verification; it is imported only when an assertion is checked.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any, Final

from ..errors import AgentrtError
from ..sanitize import sanitize
from ._registry import (
    RP_ID,
    Approver,
    Registry,
    RegistryError,
    b64url,
    from_b64url,
    require_webauthn,
)

__all__ = [
    "Assertion",
    "CheckedAssertion",
    "PasskeyRefused",
    "check_assertion",
    "decision_challenge",
]

_DOMAIN: Final = b"agentrt approval decision v1\x00"
# The inbox is served at http://localhost:PORT; `agentrt verify` accepts any port (the
# inbox's port changes between starts), never another host.
_LOCAL_ORIGIN: Final = re.compile(r"^https?://localhost(:[0-9]{1,5})?\Z")
_USER_VERIFIED: Final = 0x04  # the UV bit of the authenticator data's flags byte


class PasskeyRefused(AgentrtError):
    """A decision's passkey assertion was refused; the message says why, in one sentence."""


def decision_challenge(
    approval_id: str,
    approval_hash: str,
    verdict: str,
    scope_hash: str | None,
    required: int = 1,
) -> bytes:
    """The challenge an approver's authenticator signs for one decision: the approval, the
    verdict, a standing grant's scope and the quorum the approver was asked to join (so a
    quorum cannot be lowered afterwards without breaking every assertion over it)."""
    parts = [approval_id, approval_hash, verdict, scope_hash or "", str(required)]
    return hashlib.sha256(_DOMAIN + "\x00".join(parts).encode()).digest()


@dataclass(frozen=True, slots=True)
class Assertion:
    """The parts of a WebAuthn assertion kept with a decision, as the browser sent them."""

    credential_id: bytes
    authenticator_data: bytes
    client_data: bytes
    signature: bytes

    @classmethod
    def from_json(cls, value: Any) -> Assertion:
        """From the browser's `PublicKeyCredential` (its `rawId` and `response`) or a stored
        record (this class's `to_json`); ValueError names the missing part."""
        if not isinstance(value, dict):
            raise ValueError("the passkey assertion must be a JSON object")
        response = value.get("response", value)
        if not isinstance(response, dict):
            raise ValueError("the passkey assertion has no response")
        fields = {
            "credential_id": value.get("rawId", value.get("credential_id")),
            "authenticator_data": response.get(
                "authenticatorData", response.get("authenticator_data")
            ),
            "client_data": response.get("clientDataJSON", response.get("client_data")),
            "signature": response.get("signature"),
        }
        decoded: dict[str, bytes] = {}
        for name, text in fields.items():
            if not isinstance(text, str) or not text or len(text) > 16384:
                raise ValueError(f"the passkey assertion has no {name.replace('_', ' ')}")
            try:
                decoded[name] = from_b64url(text)
            except ValueError:
                raise ValueError(
                    f"the passkey assertion's {name.replace('_', ' ')} is not base64url"
                ) from None
        return cls(**decoded)

    def to_json(self) -> dict[str, str]:
        return {
            "credential_id": b64url(self.credential_id),
            "authenticator_data": b64url(self.authenticator_data),
            "client_data": b64url(self.client_data),
            "signature": b64url(self.signature),
        }


@dataclass(frozen=True, slots=True)
class CheckedAssertion:
    """An assertion that verified: whose it is, and the authenticator's signature count."""

    approver: Approver
    sign_count: int


def _client_data(assertion: Assertion) -> dict[str, Any]:
    try:
        client_data = json.loads(assertion.client_data)
    except ValueError:
        raise PasskeyRefused("the passkey assertion's client data is not JSON") from None
    if not isinstance(client_data, dict):
        raise PasskeyRefused("the passkey assertion's client data is not a JSON object")
    return client_data


def check_assertion(
    registry: Registry,
    assertion: Assertion,
    challenge: bytes,
    *,
    origin: str | None = None,
    sign_count: int = 0,
) -> CheckedAssertion:
    """Verify `assertion` over `challenge` with the registered key of its credential, user
    verification required; `origin` is the inbox's own (None: any http://localhost port, for
    `agentrt verify`).  Every refusal is one `PasskeyRefused` sentence."""
    approver = registry.by_credential(assertion.credential_id)
    if approver is None:
        raise PasskeyRefused(
            f"the passkey {b64url(assertion.credential_id)[:16]}… is not registered to any "
            "approver; add it with agentrt approvers add"
        )
    client_data = _client_data(assertion)
    if client_data.get("challenge") != b64url(challenge):
        raise PasskeyRefused(
            f"the passkey assertion of approver {sanitize(approver.name)} was made for another "
            "decision (another approval, verdict or grant)"
        )
    seen_origin = client_data.get("origin")
    if not isinstance(seen_origin, str) or not _LOCAL_ORIGIN.match(seen_origin):
        raise PasskeyRefused(
            f"the passkey assertion of approver {sanitize(approver.name)} was made on "
            f"{sanitize(str(seen_origin))}, not on the inbox at http://localhost"
        )
    if origin is not None and seen_origin != origin:
        raise PasskeyRefused(
            f"the passkey assertion of approver {sanitize(approver.name)} was made on "
            f"{sanitize(seen_origin)}, not on this inbox ({sanitize(origin)})"
        )
    flags = assertion.authenticator_data[32] if len(assertion.authenticator_data) > 32 else 0
    if not flags & _USER_VERIFIED:
        raise PasskeyRefused(
            f"the passkey assertion of approver {sanitize(approver.name)} was made without "
            "user verification (a PIN or a biometric); a decision needs it"
        )
    try:
        require_webauthn()
    except RegistryError as exc:
        raise PasskeyRefused(str(exc)) from None
    from webauthn import verify_authentication_response
    from webauthn.helpers.exceptions import InvalidAuthenticationResponse

    credential = {
        "id": b64url(assertion.credential_id),
        "rawId": b64url(assertion.credential_id),
        "type": "public-key",
        "response": {
            "authenticatorData": b64url(assertion.authenticator_data),
            "clientDataJSON": b64url(assertion.client_data),
            "signature": b64url(assertion.signature),
        },
    }
    try:
        verified = verify_authentication_response(
            credential=credential,
            expected_challenge=challenge,
            expected_rp_id=RP_ID,
            expected_origin=seen_origin,
            credential_public_key=approver.public_key,
            credential_current_sign_count=sign_count,
            require_user_verification=True,
        )
    except InvalidAuthenticationResponse as exc:
        raise PasskeyRefused(
            f"the passkey assertion of approver {sanitize(approver.name)} does not verify: "
            f"{sanitize(str(exc))}"
        ) from None
    return CheckedAssertion(approver, verified.new_sign_count)
