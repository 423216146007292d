"""The HTTP proxy as an OAuth 2.1 protected resource: who is calling, proven (issue 35).

With `"principals"` in proxy.json, the proxy over streamable HTTP serves its protected
resource metadata (RFC 9728) naming the operator's authorization server, and admits a
request only with a bearer JWT access token (RFC 9068) that it checks itself against
the issuer's published keys: the signature (asymmetric algorithms only; `alg: none`
and shared-secret HMAC never), `iss`, `aud` equal to this proxy's resource URI, `exp`
and `nbf` within `LEEWAY_SECONDS`, a subject, and the required scopes.  The token is
never passed on to a server, nor any server's token to the host: the proxy is the
audience, and the upstream servers keep their own credentials (docs/identity.md).

The keys (JWKS) are found through the issuer's metadata (RFC 8414, then OpenID
Connect discovery) unless `jwks_uri` is given; they are kept and fetched again only
for a key id not seen yet, at most once every `REFRESH_SECONDS` (so a stream of tokens
naming made-up key ids cannot make the proxy hammer the issuer), each fetch bounded in
time (`FETCH_SECONDS`) and size (`MAX_DOCUMENT_BYTES`).  A token once validated is
remembered by its SHA-256 until it expires (at most `CACHED_TOKENS`), so a host's
every request costs a dictionary look-up, not a signature check.  Decision 0040.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit

import anyio

from ..sanitize import sanitize

if TYPE_CHECKING:
    from ..principals import Principal

__all__ = [
    "CACHED_TOKENS",
    "LEEWAY_SECONDS",
    "PRINCIPAL_SCOPE_KEY",
    "REFRESH_SECONDS",
    "PrincipalsConfig",
    "ProtectedResource",
    "Refusal",
    "parse_principals",
    "principal_key",
    "same_principal",
]

# Where the doorkeeper leaves a request's validated principal in its ASGI scope.
PRINCIPAL_SCOPE_KEY: Final = "agentrt.principal"
# Clock difference tolerated between the issuer and this host for `exp`, `nbf` and `iat`.
LEEWAY_SECONDS: Final = 60
# The longest a fetch of the issuer's metadata or keys may take, and how large it may be.
FETCH_SECONDS: Final = 5.0
MAX_DOCUMENT_BYTES: Final = 256 * 1024
# The keys are fetched again for an unknown key id at most this often.
REFRESH_SECONDS: Final = 30.0
# Validated tokens remembered (by hash) until they expire; the oldest go first beyond this.
CACHED_TOKENS: Final = 10_000
# The longest bearer token looked at: a JWT is a few kilobytes; longer is not one.
MAX_TOKEN_CHARS: Final = 16 * 1024
# Asymmetric signatures only: a JWKS is public, so a shared-secret HMAC "verified" with a
# public key would be a forgery anyone could make; `none` is no signature at all.
ALGORITHMS: Final = (
    "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA",
)  # fmt: skip

_FIELDS: Final = frozenset({"issuer", "audience", "required_scopes", "jwks_uri"})


@dataclass(frozen=True, slots=True)
class PrincipalsConfig:
    """`"principals"` in proxy.json: whose tokens the HTTP proxy accepts, for what."""

    issuer: str
    # This proxy's resource URI: a token's `aud` must name it.
    audience: str
    required_scopes: tuple[str, ...] = ()
    # The issuer's keys, when not found through its metadata.
    jwks_uri: str | None = None


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _url(raw: Any, where: str, fail: Callable[[str, str], Exception]) -> str:
    if not isinstance(raw, str) or not raw:
        raise fail(where, "must be a URL")
    parts = urlsplit(raw)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise fail(where, f"must be an https URL, not {sanitize(raw)!r}")
    if parts.scheme == "http" and not _loopback(parts.hostname):
        # Keys fetched in the clear could be swapped on the way: anyone could sign tokens.
        raise fail(where, "must be an https URL (http only for a loopback address)")
    if parts.fragment or parts.query:
        raise fail(where, "must have no query or fragment")
    return raw


def parse_principals(raw: Any, fail: Callable[[str, str], Exception]) -> PrincipalsConfig:
    """Check `"principals"`; `fail(where, problem)` builds the configuration's error."""
    if not isinstance(raw, dict):
        raise fail("principals", "must be an object with issuer, audience and required_scopes")
    for name in raw:
        if name not in _FIELDS:
            raise fail("principals", f'has the unknown field "{sanitize(name)}"')
    for name in ("issuer", "audience"):
        if name not in raw:
            raise fail(f"principals.{name}", "is required")
    scopes = raw.get("required_scopes", [])
    if not isinstance(scopes, list) or not all(
        isinstance(scope, str) and scope and " " not in scope for scope in scopes
    ):
        raise fail("principals.required_scopes", "must be a list of scope names without spaces")
    return PrincipalsConfig(
        issuer=_url(raw["issuer"], "principals.issuer", fail),
        audience=_url(raw["audience"], "principals.audience", fail),
        required_scopes=tuple(scopes),
        jwks_uri=(
            _url(raw["jwks_uri"], "principals.jwks_uri", fail) if "jwks_uri" in raw else None
        ),
    )


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request's token is not accepted: its HTTP status, the RFC 6750 error code
    (empty when no token came), and one sentence for the caller."""

    status: int
    error: str
    description: str


class _Unusable(Exception):
    """The issuer's metadata or keys could not be had (the sentence says which and why)."""


def _segment(text: str) -> Any:
    padded = text + "=" * (-len(text) % 4)
    return json.loads(base64.urlsafe_b64decode(padded.encode("ascii")))


def _header_of(token: str) -> Mapping[str, Any]:
    """The JOSE header of a compact JWS, before anything trusts it."""
    parts = token.split(".")
    if len(parts) != 3:
        raise ValueError("it is not a signed JWT (three dot-separated parts)")
    try:
        header = _segment(parts[0])
    except (ValueError, UnicodeError) as exc:
        raise ValueError("its header is not base64url JSON") from exc
    if not isinstance(header, dict):
        raise ValueError("its header is not a JSON object")
    return header


def _scopes_of(claims: Mapping[str, Any]) -> tuple[str, ...]:
    # RFC 9068: `scope`, space-separated; some issuers send `scp` as a list instead.
    scope = claims.get("scope")
    if isinstance(scope, str):
        return tuple(part for part in scope.split(" ") if part)
    scp = claims.get("scp")
    if isinstance(scp, list):
        return tuple(str(part) for part in scp)
    if isinstance(scp, str):
        return tuple(part for part in scp.split(" ") if part)
    return ()


def _groups_of(claims: Mapping[str, Any]) -> tuple[str, ...]:
    groups = claims.get("groups")
    if isinstance(groups, list):
        return tuple(str(group) for group in groups if isinstance(group, str | int))
    return ()


def _optional_text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _metadata_urls(issuer: str) -> list[str]:
    """Where the issuer's metadata is: RFC 8414's well-known path (inserted before the
    issuer's own path), then OpenID Connect discovery's (appended to it)."""
    parts = urlsplit(issuer)
    path = parts.path.rstrip("/")
    origin = f"{parts.scheme}://{parts.netloc}"
    return [
        f"{origin}/.well-known/oauth-authorization-server{path}",
        f"{origin}{path}/.well-known/openid-configuration",
    ]


class _Keys:
    """The issuer's keys, fetched when first needed and again for an unknown key id."""

    def __init__(self, config: PrincipalsConfig, fetch_seconds: float) -> None:
        self.config = config
        self.fetch_seconds = fetch_seconds
        self.key_set: Any = None  # a joserfc KeySet once fetched
        self.kids: frozenset[str] = frozenset()
        self.fetched_at = -REFRESH_SECONDS
        self.jwks_uri = config.jwks_uri
        self._lock = anyio.Lock()
        self.last_problem: str | None = None

    async def for_kid(self, kid: str | None) -> Any:
        """The key set holding `kid`, fetched again if it does not and the last fetch is
        old enough; None when no key set could be had."""
        if self.key_set is not None and (kid is None or kid in self.kids):
            return self.key_set
        async with self._lock:
            if self.key_set is not None and (kid is None or kid in self.kids):
                return self.key_set  # another request fetched it meanwhile
            if time.monotonic() - self.fetched_at < REFRESH_SECONDS:
                return self.key_set
            self.fetched_at = time.monotonic()
            try:
                with anyio.fail_after(self.fetch_seconds):
                    await self._fetch()
                self.last_problem = None
            except TimeoutError:
                self.last_problem = (
                    f"the issuer's keys did not arrive within {self.fetch_seconds:g} s"
                )
            except _Unusable as exc:
                self.last_problem = str(exc)
        return self.key_set

    async def _fetch(self) -> None:
        from joserfc.errors import JoseError
        from joserfc.jwk import KeySet

        if self.jwks_uri is None:
            self.jwks_uri = await self._discover()
        document = await _get_json(self.jwks_uri, "the issuer's keys")
        keys = document.get("keys")
        if not isinstance(keys, list):
            raise _Unusable(f"the issuer's keys at {sanitize(self.jwks_uri)} hold no key list")
        # Signing keys only, of the kinds JWT signatures use; a key it cannot read is skipped.
        usable = [
            key for key in keys
            if isinstance(key, dict) and key.get("use", "sig") == "sig"
            and key.get("kty") in ("RSA", "EC", "OKP")
        ]  # fmt: skip
        try:
            key_set = KeySet.import_key_set({"keys": usable})
        except (JoseError, ValueError, TypeError) as exc:
            raise _Unusable(
                f"the issuer's keys at {sanitize(self.jwks_uri)} cannot be read: "
                f"{sanitize(str(exc))[:200]}"
            ) from None
        self.key_set = key_set
        self.kids = frozenset(str(key["kid"]) for key in usable if "kid" in key)

    async def _discover(self) -> str:
        problems = []
        for url in _metadata_urls(self.config.issuer):
            try:
                metadata = await _get_json(url, "the issuer's metadata")
            except _Unusable as exc:
                problems.append(str(exc))
                continue
            # RFC 8414 section 3.3: metadata naming another issuer is not this issuer's.
            if metadata.get("issuer") != self.config.issuer:
                problems.append(f"the metadata at {sanitize(url)} names another issuer")
                continue
            jwks_uri = metadata.get("jwks_uri")
            if not isinstance(jwks_uri, str):
                problems.append(f"the metadata at {sanitize(url)} names no jwks_uri")
                continue
            return _url(jwks_uri, "jwks_uri", lambda where, problem: _Unusable(
                f"the issuer's {where} {problem}"))  # fmt: skip
        raise _Unusable("; ".join(problems))


async def _get_json(url: str, what: str) -> dict[str, Any]:
    """GET `url` as a JSON object, no redirects, at most MAX_DOCUMENT_BYTES."""
    import httpx2

    try:
        async with (
            httpx2.AsyncClient(follow_redirects=False, timeout=FETCH_SECONDS) as client,
            client.stream("GET", url, headers={"accept": "application/json"}) as response,
        ):
            if response.status_code != 200:
                raise _Unusable(f"{what} at {sanitize(url)} answered {response.status_code}")
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > MAX_DOCUMENT_BYTES:
                    raise _Unusable(
                        f"{what} at {sanitize(url)} is larger than {MAX_DOCUMENT_BYTES} bytes"
                    )
    except httpx2.HTTPError as exc:
        raise _Unusable(
            f"{what} at {sanitize(url)} cannot be fetched: {type(exc).__name__}"
        ) from None
    try:
        document = json.loads(bytes(body))
    except ValueError:
        raise _Unusable(f"{what} at {sanitize(url)} is not JSON") from None
    if not isinstance(document, dict):
        raise _Unusable(f"{what} at {sanitize(url)} is not a JSON object")
    return document


class ProtectedResource:
    """Checks bearer tokens for the proxy's HTTP listener and describes it (RFC 9728)."""

    def __init__(
        self,
        config: PrincipalsConfig,
        *,
        fetch_seconds: float = FETCH_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self._keys = _Keys(config, fetch_seconds)
        self._clock = clock
        # SHA-256 of a token -> (its principal, its `exp`), oldest first.
        self._validated: OrderedDict[bytes, tuple[Principal, float]] = OrderedDict()
        parts = urlsplit(config.audience)
        path = parts.path.rstrip("/")
        # RFC 9728 section 3.1: the well-known name inserted before the resource's path.
        self.metadata_path = f"/.well-known/oauth-protected-resource{path}"
        self.metadata_url = f"{parts.scheme}://{parts.netloc}{self.metadata_path}"

    def metadata(self) -> dict[str, Any]:
        """The protected resource metadata document (RFC 9728 section 2)."""
        document: dict[str, Any] = {
            "resource": self.config.audience,
            "authorization_servers": [self.config.issuer],
            "bearer_methods_supported": ["header"],
        }
        if self.config.required_scopes:
            document["scopes_supported"] = list(self.config.required_scopes)
        return document

    def challenge(self, refusal: Refusal) -> str:
        """The `WWW-Authenticate` value for `refusal` (RFC 6750 section 3, RFC 9728 section 5.1)."""
        parts = [f'resource_metadata="{self.metadata_url}"']
        if refusal.error:
            parts.append(f'error="{refusal.error}"')
            description = refusal.description.replace("\\", "").replace('"', "'")
            parts.append(f'error_description="{description}"')
        if self.config.required_scopes:
            parts.append(f'scope="{" ".join(self.config.required_scopes)}"')
        return "Bearer " + ", ".join(parts)

    async def principal(self, authorization: str | None) -> Principal | Refusal:
        """The principal an `Authorization` header proves, or why it proves none."""
        if not authorization:
            return Refusal(401, "", "a bearer token is required")
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return Refusal(401, "invalid_request", "the Authorization header is not a bearer token")
        if len(token) > MAX_TOKEN_CHARS:
            return Refusal(401, "invalid_token", "the bearer token is too long to be a JWT")
        digest = hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()
        now = self._clock()
        cached = self._validated.get(digest)
        if cached is not None:
            principal, expires = cached
            if now < expires + LEEWAY_SECONDS:
                return principal
            del self._validated[digest]
        checked = await self._check(token, now)
        if isinstance(checked, Refusal):
            return checked
        principal, expires = checked
        self._validated[digest] = (principal, expires)
        while len(self._validated) > CACHED_TOKENS:
            self._validated.popitem(last=False)
        return principal

    async def _check(self, token: str, now: float) -> tuple[Principal, float] | Refusal:
        from joserfc import jwt
        from joserfc.errors import (
            ExpiredTokenError,
            InvalidClaimError,
            InvalidKeyIdError,
            JoseError,
            MissingClaimError,
        )

        try:
            header = _header_of(token)
        except ValueError as exc:
            return _invalid(f"the bearer token is not a JWT: {exc}")
        algorithm = header.get("alg")
        if algorithm not in ALGORITHMS:
            return _invalid(
                f"the bearer token is signed with {sanitize(repr(algorithm))[:40]}, "
                "not an asymmetric algorithm the proxy accepts"
            )
        kid = header.get("kid")
        kid = kid if isinstance(kid, str) else None
        key_set = await self._keys.for_kid(kid)
        if key_set is None:
            problem = self._keys.last_problem or "they could not be fetched"
            return Refusal(
                401, "invalid_token",
                f"the bearer token cannot be checked: the issuer's keys are unavailable "
                f"({sanitize(problem)[:300]})",
            )  # fmt: skip
        if kid is not None and kid not in self._keys.kids:
            if self._keys.last_problem is not None:
                return _invalid(
                    f"the bearer token is signed by key {sanitize(repr(kid))[:80]}, which the "
                    "proxy does not hold, and the issuer's keys could not be fetched again "
                    f"({sanitize(self._keys.last_problem)[:300]})"
                )
            return _invalid(
                f"the bearer token is signed by key {sanitize(repr(kid))[:80]}, "
                "which the issuer does not publish"
            )
        try:
            decoded = jwt.decode(token, key_set, algorithms=ALGORITHMS)
        except InvalidKeyIdError:
            return _invalid("the bearer token is signed by a key the issuer does not publish")
        except JoseError as exc:
            return _invalid(f"the bearer token's signature does not verify ({exc.error})")
        except (ValueError, TypeError):
            return _invalid("the bearer token's claims are not a JSON object")
        claims = decoded.claims
        registry = jwt.JWTClaimsRegistry(
            now=int(now),
            leeway=LEEWAY_SECONDS,
            iss={"essential": True, "value": self.config.issuer},
            aud={"essential": True, "value": self.config.audience},
            exp={"essential": True},
            sub={"essential": True},
        )
        try:
            registry.validate(claims)
        except ExpiredTokenError:
            return _invalid("the bearer token has expired")
        except MissingClaimError as exc:
            return _invalid(f"the bearer token has no {exc.claim} claim")
        except InvalidClaimError as exc:
            if exc.claim == "aud":
                return _invalid(
                    "the bearer token is for another audience, not "
                    f"{sanitize(self.config.audience)}"
                )
            if exc.claim == "iss":
                return _invalid("the bearer token is from another issuer")
            return _invalid(f"the bearer token's {exc.claim} claim is not valid now")
        except JoseError as exc:
            return _invalid(f"the bearer token's claims do not hold ({exc.error})")
        subject = claims.get("sub")
        if not isinstance(subject, str) or not subject:
            return _invalid("the bearer token's sub claim is not a name")
        expires = claims.get("exp")
        if not isinstance(expires, int | float) or isinstance(expires, bool):
            return _invalid("the bearer token's exp claim is not a time")
        scopes = _scopes_of(claims)
        missing = [scope for scope in self.config.required_scopes if scope not in scopes]
        if missing:
            return Refusal(
                403, "insufficient_scope",
                f"the bearer token lacks the scope {' '.join(sanitize(s) for s in missing)}",
            )  # fmt: skip
        from ..principals import Principal  # the store's records: loaded once serving HTTP

        principal = Principal(
            issuer=self.config.issuer,
            subject=subject,
            client_id=_optional_text(claims.get("client_id")) or _optional_text(claims.get("azp")),
            jti=_optional_text(claims.get("jti")),
            scopes=scopes,
            groups=_groups_of(claims),
        )
        return principal, float(expires)


def _invalid(description: str) -> Refusal:
    return Refusal(401, "invalid_token", description)


def same_principal(first: object, second: object) -> bool:
    """Whether two requests' principals are one person (issuer and subject; a refreshed
    token of the same person is the same principal).  Two without one are the same."""
    if first is None or second is None:
        return first is None and second is None
    return bool(
        getattr(first, "issuer", None) == getattr(second, "issuer", None)
        and getattr(first, "subject", None) == getattr(second, "subject", None)
    )


def principal_key(principal: Principal) -> str:
    """A short stable name for a principal, for keys that must tell principals apart."""
    named = json.dumps([principal.issuer, principal.subject], separators=(",", ":"))
    return hashlib.sha256(named.encode("utf-8", "surrogatepass")).hexdigest()[:24]
