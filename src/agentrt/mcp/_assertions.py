"""The grants a machine makes with a signed assertion instead of a person (decision 0045).

- `client_credentials` with `private_key_jwt` (RFC 7523 section 2.2): the
  client proves itself with a short-lived JWT signed by its private key, its
  audience the authorization server's issuer.  The key is read from an
  owner-only PEM file each time an assertion is signed; it is never copied
  into the token file, and the assertion is sent only to the token endpoint.
- `identity_assertion` (SEP-990, enterprise cross-app access): the person's ID
  token from the enterprise identity provider (an owner-only file the
  operator's single sign-on leaves) is exchanged at the provider's token
  endpoint for an identity assertion authorization grant (ID-JAG, RFC 8693
  token exchange), which the MCP authorization server takes in the
  jwt-bearer grant (RFC 7523 section 2.1) for an access token.

Both are made again whenever the access token ends (there is usually no
refresh token), by `agentrt login` and by the proxy alike, through
`grant_request`.  The client assertion carries the claims the SDK's
`PrivateKeyJWTOAuthProvider` gives one (through `SignedJWTParameters`).
Nothing here puts a key, an ID token or an assertion in an error: every
refusal names the file or the endpoint.
"""

from __future__ import annotations

import json
import os
import stat
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import anyio
import httpx2

from ..errors import AgentrtError
from ..sanitize import sanitize

if TYPE_CHECKING:
    from ._tokens import TokenRecord

__all__ = [
    "CLIENT_ASSERTION_TYPE",
    "JWT_BEARER",
    "CredentialError",
    "grant_request",
    "read_owner_only",
    "signing_algorithm",
]

CLIENT_ASSERTION_TYPE: Final = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
JWT_BEARER: Final = "urn:ietf:params:oauth:grant-type:jwt-bearer"
TOKEN_EXCHANGE: Final = "urn:ietf:params:oauth:grant-type:token-exchange"  # noqa: S105 - a name
ID_TOKEN_TYPE: Final = "urn:ietf:params:oauth:token-type:id_token"  # noqa: S105 - a name
ID_JAG_TYPE: Final = "urn:ietf:params:oauth:token-type:id-jag"
# The algorithms a key of each kind signs with, the first one the default.
_ALGORITHMS: Final = {
    "rsa": ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512"),
    "secp256r1": ("ES256",),
    "secp384r1": ("ES384",),
    "secp521r1": ("ES512",),
    "ed25519": ("EdDSA",),
}
SIGNING_ALGORITHMS: Final = frozenset(alg for algs in _ALGORITHMS.values() for alg in algs)
_TIMEOUT: Final = httpx2.Timeout(30.0)
_ASSERTION_LIFE: Final = 300


class CredentialError(AgentrtError):
    """A credential file cannot be used, or the identity provider refused the exchange."""


def read_owner_only(path: Path | str, what: str) -> str:
    """The content of an owner-only file (refused when others can read it)."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise CredentialError(
            f"{what} {sanitize(str(path))} cannot be read: "
            f"{sanitize(exc.strerror or type(exc).__name__)}"
        ) from None
    with os.fdopen(descriptor, "r", encoding="utf-8", errors="replace") as handle:
        info = os.fstat(handle.fileno())
        if info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077:
            raise CredentialError(
                f"{what} {sanitize(str(path))} can be read by other users or is not owned by "
                "this user, so it is not used; make it owner-only (chmod 600)"
            )
        return handle.read().strip()


def signing_algorithm(path: Path | str, alg: str | None) -> tuple[str, str]:
    """The PEM private key in the owner-only file `path` and the algorithm it signs with
    (`alg`, else the one its kind implies); refused when it is not a private key or
    cannot sign with `alg`."""
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    pem = read_owner_only(path, "private key file")
    try:
        key = load_pem_private_key(pem.encode(), password=None)
    except (ValueError, TypeError):
        raise CredentialError(
            f"private key file {sanitize(str(path))} does not hold an unencrypted PEM private key"
        ) from None
    if isinstance(key, rsa.RSAPrivateKey):
        kind = "rsa"
    elif isinstance(key, ec.EllipticCurvePrivateKey):
        kind = key.curve.name
    elif isinstance(key, ed25519.Ed25519PrivateKey):
        kind = "ed25519"
    else:
        kind = type(key).__name__
    usable = _ALGORITHMS.get(kind, ())
    if not usable:
        raise CredentialError(
            f"private key file {sanitize(str(path))} holds a key of a kind that cannot sign "
            "a client assertion (use RSA, EC P-256/384/521 or Ed25519)"
        )
    if alg is not None and alg not in usable:
        raise CredentialError(
            f"private key file {sanitize(str(path))} holds a {kind} key, which cannot sign "
            f"with alg {sanitize(alg)} (it signs with {', '.join(usable)})"
        )
    return pem, alg or usable[0]


def _sign(client_id: str, pem: str, alg: str, audience: str) -> str:
    """A client assertion (RFC 7523 section 3) with the claims the SDK's
    `SignedJWTParameters` gives one: `iss` and `sub` the client, `aud` the authorization
    server's issuer, five minutes of life, a fresh `jti`.  Signed with PyJWT (the SDK's
    own signer) rather than through the SDK's module: importing the SDK from the proxy's
    worker while its servers start deadlocked on the import lock (decision 0045)."""
    import jwt

    now = int(time.time())
    claims = {
        "iss": client_id,
        "sub": client_id,
        "aud": audience,
        "iat": now,
        "exp": now + _ASSERTION_LIFE,
        "jti": str(uuid.uuid4()),
    }
    return jwt.encode(claims, pem, algorithm=alg)


async def client_assertion(record: TokenRecord) -> dict[str, str]:
    """The `client_assertion` fields of a token request of `record`'s client."""
    assert record.private_key_file is not None
    audience = record.issuer or record.token_endpoint

    def sign() -> str:
        pem, alg = signing_algorithm(record.private_key_file or "", record.signing_alg)
        return _sign(record.client_id, pem, alg, audience)

    # A worker thread: reading the key and signing stay off the loop.
    assertion = await anyio.to_thread.run_sync(sign)
    return {"client_assertion_type": CLIENT_ASSERTION_TYPE, "client_assertion": assertion}


async def identity_assertion(record: TokenRecord) -> str:
    """An ID-JAG for `record`'s authorization server and resource, from the identity
    provider's token exchange of the person's ID token (RFC 8693)."""
    assert record.idp_token_endpoint and record.idp_client_id and record.id_token_file
    endpoint = record.idp_token_endpoint
    id_token = await anyio.to_thread.run_sync(
        read_owner_only, record.id_token_file, "ID token file"
    )
    data = {
        "grant_type": TOKEN_EXCHANGE,
        "requested_token_type": ID_JAG_TYPE,
        "subject_token": id_token,
        "subject_token_type": ID_TOKEN_TYPE,
        "audience": record.issuer or "",
        "resource": record.resource,
        "client_id": record.idp_client_id,
    }
    if record.scope:
        data["scope"] = record.scope
    if record.idp_client_secret_file:
        data["client_secret"] = await anyio.to_thread.run_sync(
            read_owner_only, record.idp_client_secret_file, "identity provider secret file"
        )
    where = f"the identity provider's token endpoint {sanitize(endpoint)}"
    try:
        async with httpx2.AsyncClient(follow_redirects=False, timeout=_TIMEOUT) as client:
            response = await client.post(
                endpoint, data=data, headers={"accept": "application/json"}
            )
            await response.aread()
    except httpx2.HTTPError as exc:
        raise CredentialError(f"{where} could not be reached: {sanitize(str(exc))}") from None
    if response.status_code != 200:
        error = _error_code(response)
        raise CredentialError(
            f"{where} refused the token exchange (HTTP {response.status_code}"
            f"{', ' + sanitize(error) if error else ''})"
        )
    try:
        value = json.loads(response.content)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise CredentialError(f"{where} answered the token exchange with no JSON object")
    grant = value.get("access_token")
    if value.get("issued_token_type") != ID_JAG_TYPE or not isinstance(grant, str) or not grant:
        raise CredentialError(f"{where} answered the token exchange without an ID-JAG")
    return grant


async def grant_request(record: TokenRecord) -> dict[str, str]:
    """The form of a token request that makes `record`'s grant again without a person:
    client credentials (with a signed client assertion when its client has a key), or
    the jwt-bearer grant of a fresh ID-JAG."""
    if record.grant == "identity_assertion":
        data = {
            "grant_type": JWT_BEARER,
            "assertion": await identity_assertion(record),
            "resource": record.resource,
        }
    else:
        data = {"grant_type": "client_credentials", "resource": record.resource}
        if record.private_key_file is not None:
            data.update(await client_assertion(record))
    if record.scope:
        data["scope"] = record.scope
    return data


def _error_code(response: httpx2.Response) -> str:
    try:
        value: Any = response.json()
    except ValueError:
        return ""
    error = value.get("error") if isinstance(value, dict) else None
    return error if isinstance(error, str) else ""
