"""The proxy as an OAuth protected resource: which bearer tokens prove a principal, and
which are refused, each in one sentence (issue 35; `proxy/_resource.py`).

Against a real authorization server's signed JWTs and its published keys
(`jwt_issuer.py`); each refusal is followed by a good token, which still passes."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import anyio
import pytest
from joserfc.jwk import RSAKey
from jwt_issuer import Issuer

from agentrt.principals import Principal
from agentrt.proxy._resource import (
    CACHED_TOKENS,
    REFRESH_SECONDS,
    PrincipalsConfig,
    ProtectedResource,
    Refusal,
    parse_principals,
)
from agentrt.proxy.config import ConfigError

pytestmark = pytest.mark.anyio

AUDIENCE = "http://127.0.0.1:9/mcp"


def _resource(issuer: Issuer, **overrides: Any) -> ProtectedResource:
    config = PrincipalsConfig(
        issuer=issuer.origin, audience=AUDIENCE, required_scopes=("mcp:tools",)
    )
    fetch_seconds = overrides.pop("fetch_seconds", 5.0)
    for name, value in overrides.items():
        config = PrincipalsConfig(**{**config.__dict__, name: value})
    return ProtectedResource(config, fetch_seconds=fetch_seconds)


async def _principal(resource: ProtectedResource, token: str) -> Principal | Refusal:
    return await resource.principal(f"Bearer {token}")


async def _still_admits(resource: ProtectedResource, issuer: Issuer) -> None:
    good = await _principal(resource, issuer.mint("alice", AUDIENCE, groups=("release",)))
    assert isinstance(good, Principal), good
    assert good.subject == "alice"


async def test_a_valid_token_proves_its_principal(issuer: Issuer) -> None:
    resource = _resource(issuer)
    principal = await _principal(
        resource, issuer.mint("alice", [AUDIENCE, "other"], groups=("release",))
    )
    assert isinstance(principal, Principal), principal
    assert (principal.issuer, principal.subject, principal.client_id) == (
        issuer.origin, "alice", "test-client",
    )  # fmt: skip
    assert principal.scopes == ("mcp:tools",) and principal.groups == ("release",)
    assert principal.jti
    # Found through the issuer's metadata (RFC 8414), fetched once.
    assert issuer.jwks_fetches == 1


async def test_an_ec_signed_token_is_accepted_too(issuer: Issuer) -> None:
    ec_key = issuer.keys[-1]
    token = issuer.mint("carol", AUDIENCE, key=ec_key, algorithm="ES256")
    principal = await _principal(_resource(issuer), token)
    assert isinstance(principal, Principal) and principal.subject == "carol"


@pytest.mark.parametrize(
    ("case", "status", "error", "sentence"),
    [
        ("another audience", 401, "invalid_token", "for another audience"),
        ("expired", 401, "invalid_token", "has expired"),
        ("unknown key", 401, "invalid_token", "which the issuer does not publish"),
        ("alg none", 401, "invalid_token", "not an asymmetric algorithm"),
        ("hmac with the public key", 401, "invalid_token", "not an asymmetric algorithm"),
        ("another issuer", 401, "invalid_token", "from another issuer"),
        ("not yet valid", 401, "invalid_token", "nbf claim is not valid now"),
        ("no subject", 401, "invalid_token", "has no sub claim"),
        ("missing scope", 403, "insufficient_scope", "lacks the scope mcp:tools"),
        ("tampered claims", 401, "invalid_token", "signature does not verify"),
        ("not a jwt", 401, "invalid_token", "is not a JWT"),
    ],
)
async def test_a_bad_token_is_refused_in_one_sentence(
    issuer: Issuer, case: str, status: int, error: str, sentence: str
) -> None:
    resource = _resource(issuer)
    token = _bad_token(issuer, case)
    refused = await _principal(resource, token)
    assert isinstance(refused, Refusal), f"{case} was accepted"
    assert (refused.status, refused.error) == (status, error)
    assert sentence in refused.description
    assert "\n" not in refused.description
    challenge = resource.challenge(refused)
    assert challenge.startswith("Bearer ")
    assert f'error="{error}"' in challenge
    assert 'resource_metadata="http://127.0.0.1:9/.well-known/oauth-protected-resource/mcp"' in (
        challenge
    )
    # Refused twice alike (nothing cached for it), and a good token still passes.
    again = await _principal(resource, token)
    assert isinstance(again, Refusal)
    await _still_admits(resource, issuer)


def _segment(document: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(document).encode()).rstrip(b"=").decode()


def _bad_token(issuer: Issuer, case: str) -> str:
    if case == "another audience":
        return issuer.mint("mallory", "https://other.example/mcp")
    if case == "expired":
        return issuer.mint("mallory", AUDIENCE, lifetime=-3600)
    if case == "unknown key":
        forger = RSAKey.generate_key(2048, parameters={"kid": "forged"}, private=True)
        return issuer.mint("mallory", AUDIENCE, key=forger)
    if case == "alg none":
        good = issuer.mint("mallory", AUDIENCE)
        return f"{_segment({'alg': 'none', 'typ': 'JWT'})}.{good.split('.')[1]}."
    if case == "hmac with the public key":
        good = issuer.mint("mallory", AUDIENCE)
        header = {"alg": "HS256", "kid": issuer.signing_key.kid}
        return f"{_segment(header)}.{good.split('.')[1]}.{good.split('.')[2]}"
    if case == "another issuer":
        return issuer.mint("mallory", AUDIENCE, iss="https://evil.example/")
    if case == "not yet valid":
        return issuer.mint("mallory", AUDIENCE, nbf=int(time.time()) + 3600)
    if case == "no subject":
        token = issuer.mint("mallory", AUDIENCE)
        from joserfc import jwt

        claims = jwt.decode(token, issuer.signing_key).claims
        del claims["sub"]
        header = {"alg": "RS256", "kid": issuer.signing_key.kid}
        return jwt.encode(header, claims, issuer.signing_key)
    if case == "missing scope":
        return issuer.mint("mallory", AUDIENCE, scope="profile")
    if case == "tampered claims":
        good = issuer.mint("mallory", AUDIENCE)
        header, payload, signature = good.split(".")
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        claims["sub"] = "alice"
        return f"{header}.{_segment(claims)}.{signature}"
    assert case == "not a jwt"
    return "opaque-token-value"


async def test_no_token_is_asked_for_with_the_resource_metadata(issuer: Issuer) -> None:
    resource = _resource(issuer)
    refused = await resource.principal(None)
    assert isinstance(refused, Refusal)
    assert (refused.status, refused.error) == (401, "")
    challenge = resource.challenge(refused)
    assert "error=" not in challenge  # RFC 6750 3.1: no error code when no token came
    assert 'scope="mcp:tools"' in challenge
    assert resource.metadata() == {
        "resource": AUDIENCE,
        "authorization_servers": [issuer.origin],
        "bearer_methods_supported": ["header"],
        "scopes_supported": ["mcp:tools"],
    }
    basic = await resource.principal("Basic dXNlcjpwYXNz")
    assert isinstance(basic, Refusal) and basic.error == "invalid_request"


async def test_a_rotated_key_is_fetched_once_and_unknown_kids_do_not_hammer_the_issuer(
    issuer: Issuer,
) -> None:
    resource = _resource(issuer)
    await _still_admits(resource, issuer)
    assert issuer.jwks_fetches == 1
    issuer.rotate()
    # Within the refresh interval of the last fetch, a new key id is not fetched for ...
    early = await _principal(resource, issuer.mint("bob", AUDIENCE))
    assert isinstance(early, Refusal) and issuer.jwks_fetches == 1
    resource._keys.fetched_at -= REFRESH_SECONDS  # ... and once it has passed, it is, once.
    rotated = await _principal(resource, issuer.mint("bob", AUDIENCE))
    assert isinstance(rotated, Principal) and rotated.subject == "bob"
    assert issuer.jwks_fetches == 2
    # Made-up key ids, many: refused without a fetch each (at most one per 30 s).
    forger = RSAKey.generate_key(2048, parameters={"kid": "made-up"}, private=True)
    assert isinstance(await _principal(resource, issuer.mint("eve", AUDIENCE, key=forger)), Refusal)
    for number in range(20):
        header = {"alg": "RS256", "kid": f"made-up-{number}"}
        token = f"{_segment(header)}.{_segment({'sub': 'x'})}.c2ln"
        assert isinstance(await _principal(resource, token), Refusal)
    assert issuer.jwks_fetches == 2


async def test_a_slow_key_endpoint_refuses_in_bounded_time_and_known_keys_still_work(
    issuer: Issuer,
) -> None:
    resource = _resource(issuer, fetch_seconds=1.0)
    await _still_admits(resource, issuer)
    issuer.jwks_mode = "slow"
    issuer.slow_seconds = 5.0
    resource._keys.fetched_at = -1e9  # past the refresh interval
    # A key the issuer publishes now, which the proxy has not fetched yet.
    unseen = RSAKey.generate_key(2048, parameters={"kid": "unseen"}, private=True)
    issuer.keys.append(unseen)
    started = time.monotonic()
    refused = await _principal(resource, issuer.mint("bob", AUDIENCE, key=unseen))
    assert time.monotonic() - started < 3.0
    assert isinstance(refused, Refusal)
    assert "the issuer's keys could not be fetched again" in refused.description
    assert "did not arrive within 1 s" in refused.description
    # Tokens under the keys already held pass, while the endpoint still hangs.
    await _still_admits(resource, issuer)


@pytest.mark.parametrize("mode", ["garbage", "huge"])
async def test_a_key_endpoint_answering_garbage_admits_no_one_and_says_why(
    issuer: Issuer, mode: str
) -> None:
    issuer.jwks_mode = mode
    resource = _resource(issuer)
    refused = await _principal(resource, issuer.mint("alice", AUDIENCE))
    assert isinstance(refused, Refusal)
    assert "the issuer's keys are unavailable" in refused.description
    assert ("is not JSON" if mode == "garbage" else "is larger than") in refused.description
    # Once it answers again (and the refresh interval has passed), the same token passes.
    issuer.jwks_mode = "ok"
    resource._keys.fetched_at = -1e9
    await _still_admits(resource, issuer)


async def test_a_validated_token_is_remembered_until_it_expires(issuer: Issuer) -> None:
    resource = _resource(issuer)
    token = issuer.mint("alice", AUDIENCE, lifetime=2)
    first = await _principal(resource, token)
    issuer.jwks_mode = "garbage"  # the cache, not the keys, answers now
    resource._keys.key_set = None
    assert await _principal(resource, token) == first
    assert len(resource._validated) == 1 <= CACHED_TOKENS
    resource._clock = lambda: time.time() + 3600  # long expired, leeway included
    expired = await _principal(resource, token)
    assert isinstance(expired, Refusal)


async def test_checking_a_cached_token_is_fast(issuer: Issuer) -> None:
    resource = _resource(issuer)
    token = issuer.mint("alice", AUDIENCE)
    await _principal(resource, token)
    started = time.perf_counter()
    for _ in range(2000):
        await _principal(resource, token)
    per_check = (time.perf_counter() - started) / 2000
    assert per_check < 200e-6, f"{per_check * 1e6:.0f} µs a cached check"


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ({"audience": AUDIENCE}, "principals.issuer: is required"),
        ({"issuer": "http://id.example", "audience": AUDIENCE}, "https URL"),
        ({"issuer": "https://id.example", "audience": "mcp"}, "principals.audience"),
        ({"issuer": "https://id.example", "audience": AUDIENCE, "extra": 1}, '"extra"'),
        (
            {"issuer": "https://id.example", "audience": AUDIENCE, "required_scopes": "a b"},
            "list of scope names",
        ),
    ],
)
def test_a_bad_principals_section_is_one_sentence(raw: dict[str, Any], problem: str) -> None:
    def fail(where: str, text: str) -> ConfigError:
        return ConfigError(f"{where}: {text}")

    with pytest.raises(ConfigError) as raised:
        parse_principals(raw, fail)
    assert problem in str(raised.value)


async def test_a_suspended_calls_state_resumes_only_for_its_own_principal() -> None:
    from types import SimpleNamespace

    from agentrt.proxy._input_required import HostCall, Question, Suspended
    from agentrt.proxy._proxy import principal_of_request
    from agentrt.proxy._resource import PRINCIPAL_SCOPE_KEY, same_principal

    def request_by(principal: Principal | None) -> object:
        scope = {} if principal is None else {PRINCIPAL_SCOPE_KEY: principal}
        return SimpleNamespace(request=SimpleNamespace(scope=scope))

    alice = Principal(issuer="https://id.example/", subject="alice", jti="one")
    alice_again = Principal(issuer="https://id.example/", subject="alice", jti="two")
    bob = Principal(issuer="https://id.example/", subject="bob")
    suspended = Suspended()
    call = HostCall(request_by(alice), "ask_name", {"who": "me"})
    answered: list[dict[str, object] | None] = []

    async def server_asks() -> None:
        answered.append(await call.ask("elicitation/create", {"message": "name?"}, 10.0))

    async with anyio.create_task_group() as group:
        group.start_soon(server_asks)
        question = await call.next_round()  # handed to the host, as the handler does
        assert isinstance(question, Question)
        state = suspended.issue(call, question, 30.0)
        answers = {question.key: {"action": "accept", "content": {"name": "ada"}}}

        def retry_by(principal: Principal | None) -> HostCall | str:
            caller = principal_of_request(request_by(principal))  # type: ignore[arg-type]
            return suspended.resume(
                state, "ask_name", {"who": "me"}, answers,
                lambda held: same_principal(principal_of_request(held.ctx), caller),
            )  # fmt: skip

        # bob (or a caller with no principal) holding alice's state learns nothing and
        # spends nothing; alice, with a fresh token, resumes her call with her answer.
        refused = retry_by(bob)
        assert isinstance(refused, str) and "unknown" in refused
        assert isinstance(retry_by(None), str)
        assert retry_by(alice_again) is call
    assert answered == [{"action": "accept", "content": {"name": "ada"}}]
