"""The grants without a person (decision 0045): `client_credentials` with `private_key_jwt`
(a client assertion signed by a key in an owner-only file) and the identity assertion
grant (the person's ID token exchanged at the enterprise identity provider for an ID-JAG,
taken by the MCP authorization server in the jwt-bearer grant), against the test
authorization server (`servers/oauth_server.py --jwt-client/--idp-key`)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from oauth_support import OAuthServer, oauth_server

from agentrt.mcp import Server
from agentrt.mcp._connection import connect
from agentrt.mcp._login import LoginError, login
from agentrt.mcp._oauth import NeedsLogin, OAuthClientFactory, OAuthSession, canonical_resource
from agentrt.mcp._tokens import AuthSettings, token_file

pytestmark = pytest.mark.anyio

AGENTRT = Path(sys.executable).parent / "agentrt"
RULES = {"whoami": {"side_effect": "read_only"}, "admin_reset": {"side_effect": "read_only"}}


def _pem(key: Any) -> bytes:
    return bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


def _owner_only(path: Path, content: str | bytes, mode: int = 0o600) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    path.chmod(mode)
    return path


def _key_pair(directory: Path, name: str) -> tuple[Path, Path]:
    """A P-256 key: its private PEM (owner-only) and its public PEM."""
    key = ec.generate_private_key(ec.SECP256R1())
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return (
        _owner_only(directory / f"{name}.key", _pem(key)),
        _owner_only(directory / f"{name}.pub", public, 0o644),
    )


def _id_token(idp_key: Path, server: OAuthServer, *, lifetime: int = 3600) -> str:
    """The ID token the person's single sign-on at the identity provider left."""
    now = int(time.time())
    claims = {
        "iss": f"{server.origin}/idp", "sub": "person@example.com", "aud": "idp-client",
        "iat": now, "exp": now + lifetime,
    }  # fmt: skip
    return jwt.encode(claims, idp_key.read_text(), algorithm="ES256")


def _jwt_settings(key: Path, **more: Any) -> AuthSettings:
    return AuthSettings(grant="client_credentials", client_id="robot", private_key_file=key, **more)


def _assertion_settings(root: Path, id_token: str) -> AuthSettings:
    return AuthSettings(
        grant="identity_assertion",
        client_id="app",
        client_secret_file=_owner_only(root / "app.secret", "app-secret-value"),
        idp_token_endpoint="",  # set per server below
        idp_client_id="idp-client",
        id_token_file=_owner_only(root / "id.token", id_token),
    )


def _with_idp(settings: AuthSettings, server: OAuthServer) -> AuthSettings:
    return dataclasses.replace(settings, idp_token_endpoint=f"{server.origin}/idp/token")


async def _call_whoami(name: str, endpoint: str) -> str:
    connection = await connect(
        Server(
            name=name,
            endpoint=endpoint,
            http_client_factory=OAuthClientFactory(OAuthSession.for_server(name, endpoint)),
        )
    )
    try:
        result = await connection.call_tool("whoami", "{}", timeout=10)
    finally:
        await connection.aclose()
    return str(result["content"][0]["text"])


async def _no_browser(url: str) -> None:
    raise AssertionError(f"a grant without a person opened a browser: {url}")


async def test_private_key_jwt_logs_in_with_a_signed_assertion_and_grants_again_at_the_end(
    tmp_path: Path,
) -> None:
    key, public = _key_pair(tmp_path / "keys", "robot")
    with oauth_server("--jwt-client", f"robot:{public}", "--access-ttl", "1") as server:
        record = await login("r", server.endpoint, _jwt_settings(key), show_url=_no_browser)
        assert record.token_endpoint_auth_method == "private_key_jwt"
        assert record.signing_alg == "ES256"  # from the key's kind
        stored = token_file("r", canonical_resource(server.endpoint)).path.read_text()
        # The token file names the key's file; neither the key nor an assertion is in it.
        assert str(key) in stored
        assert key.read_text().splitlines()[1] not in stored
        assertion = server.log()["assertions"][0]
        assert assertion not in stored
        claims = jwt.decode(assertion, options={"verify_signature": False})
        assert (claims["iss"], claims["sub"], claims["aud"]) == ("robot", "robot", server.origin)

        # No refresh token: when the access token ends, a new assertion makes a new grant.
        assert await _call_whoami("r", server.endpoint) == "an authorized client"
        await anyio.sleep(1.1)
        assert await _call_whoami("r", server.endpoint) == "an authorized client"
        log = server.log()
        assert len(set(log["assertions"])) == 2
        assert len({header for header in log["authorization"] if header}) == 2


@pytest.mark.parametrize(
    ("bad", "refusal"),
    [
        ("readable", "private key file .* can be read by other users"),
        ("garbage", "private key file .* does not hold an unencrypted PEM private key"),
        (
            "wrong alg",
            "private key file .* holds a secp256r1 key, which cannot sign with alg RS256",
        ),
        ("public key", "private key file .* does not hold an unencrypted PEM private key"),
    ],
)
async def test_a_bad_private_key_is_refused_in_one_sentence_before_anything_is_sent(
    tmp_path: Path, bad: str, refusal: str
) -> None:
    key, public = _key_pair(tmp_path / "keys", "robot")
    original = key.read_bytes()
    secret_line = key.read_text().splitlines()[1]
    settings = _jwt_settings(key)
    if bad == "readable":
        key.chmod(0o644)
    elif bad == "garbage":
        _owner_only(key, "-----BEGIN PRIVATE KEY-----\nbm90IGEga2V5\n-----END PRIVATE KEY-----\n")
        secret_line = "bm90IGEga2V5"
    elif bad == "wrong alg":
        settings = _jwt_settings(key, alg="RS256")
    else:
        _owner_only(key, public.read_text())
    with oauth_server("--jwt-client", f"robot:{public}") as server:
        with pytest.raises(LoginError, match=refusal) as refused:
            await login("r", server.endpoint, settings, show_url=_no_browser)
        message = str(refused.value)
        assert "\n" not in message and secret_line not in message
        assert server.log()["assertions"] == []  # nothing reached the token endpoint
        assert token_file("r", canonical_resource(server.endpoint)).read() is None
        # Nothing else harmed: the registered key, owner-only, logs the same client in.
        _owner_only(key, original)
        record = await login("r", server.endpoint, _jwt_settings(key), show_url=_no_browser)
        assert record.access_token and record.access_token not in message


async def test_the_identity_assertion_grant_exchanges_the_id_token_then_takes_the_id_jag(
    tmp_path: Path,
) -> None:
    idp_key, _ = _key_pair(tmp_path / "keys", "idp")
    with oauth_server(
        "--client", "app:app-secret-value", "--idp-key", str(idp_key), "--access-ttl", "1"
    ) as server:
        id_token = _id_token(idp_key, server)
        settings = _with_idp(_assertion_settings(tmp_path / "conf", id_token), server)
        record = await login("r", server.endpoint, settings, show_url=_no_browser)
        assert record.grant == "identity_assertion"
        assert record.issuer is not None and record.issuer.rstrip("/") == server.origin
        stored = token_file("r", canonical_resource(server.endpoint)).path.read_text()
        log = server.log()
        assert log["idp_exchanges"] == 1
        id_jag = next(item for item in log["assertions"] if item.count(".") == 2)
        claims = jwt.decode(id_jag, options={"verify_signature": False})
        assert claims["aud"] == server.origin and claims["resource"] == server.endpoint
        for secret in (id_token, id_jag):
            assert secret not in stored

        # When the access token ends, the proxy's client makes the whole grant again.
        assert await _call_whoami("r", server.endpoint) == "an authorized client"
        await anyio.sleep(1.1)
        assert await _call_whoami("r", server.endpoint) == "an authorized client"
        assert server.log()["idp_exchanges"] == 2

        # The authorization server named in the entry: the resource server is not asked.
        pinned = dataclasses.replace(settings, authorization_server=server.origin)
        again = await login("r", server.endpoint, pinned, show_url=_no_browser)
        assert again.issuer == record.issuer and again.access_token != record.access_token
        kept = token_file("r", canonical_resource(server.endpoint)).path.read_bytes()
        nowhere = dataclasses.replace(settings, authorization_server="http://127.0.0.1:9")
        with pytest.raises(LoginError, match=r'^the metadata of server "r" could not be fetched'):
            await login("r", server.endpoint, nowhere, show_url=_no_browser)
        assert token_file("r", canonical_resource(server.endpoint)).path.read_bytes() == kept


async def test_an_identity_provider_that_refuses_ends_the_login_and_keeps_the_last_one(
    tmp_path: Path,
) -> None:
    idp_key, _ = _key_pair(tmp_path / "keys", "idp")
    other_key, _ = _key_pair(tmp_path / "keys", "other")
    with oauth_server(
        "--client", "app:app-secret-value", "--idp-key", str(idp_key), "--access-ttl", "1"
    ) as server:
        settings = _with_idp(
            _assertion_settings(tmp_path / "conf", _id_token(idp_key, server)), server
        )
        before = await login("r", server.endpoint, settings, show_url=_no_browser)
        file = token_file("r", canonical_resource(server.endpoint))
        kept = file.path.read_bytes()

        # An ID token the provider did not sign: it refuses the exchange, one sentence.
        forged = _id_token(other_key, server)
        assert settings.id_token_file is not None
        _owner_only(settings.id_token_file, forged)
        with pytest.raises(LoginError) as refused:
            await login("r", server.endpoint, settings, show_url=_no_browser)
        message = str(refused.value)
        assert message == (
            'the login to server "r" failed: the identity provider\'s token endpoint '
            f"{server.origin}/idp/token refused the token exchange (HTTP 400, invalid_grant)"
        )
        assert forged not in message and file.path.read_bytes() == kept

        # The proxy's client, when the token ends: the server waits for a login (one line,
        # the call not sent); the stored login is left for a new ID token.
        lines: list[str] = []
        session = OAuthSession.for_server("r", server.endpoint)
        session.warn = lines.append
        await anyio.sleep(1.1)
        with pytest.raises(NeedsLogin, match="refused the token exchange"):
            await session.access_token()
        assert len(lines) == 1 and "agentrt login r" in lines[0] and forged not in lines[0]

        # A shared ID token file is refused before the provider is asked.
        settings.id_token_file.chmod(0o644)
        exchanges = server.log()["idp_exchanges"]
        with pytest.raises(LoginError, match=r"ID token file .* can be read by other users"):
            await login("r", server.endpoint, settings, show_url=_no_browser)
        assert server.log()["idp_exchanges"] == exchanges

        # A good ID token again: the next login serves, and the session picks it up.
        _owner_only(settings.id_token_file, _id_token(idp_key, server))
        after = await login("r", server.endpoint, settings, show_url=_no_browser)
        assert after.access_token != before.access_token
        assert await session.access_token() == after.access_token


def test_the_auth_entry_of_the_grants_without_a_person_is_checked(tmp_path: Path) -> None:
    from agentrt.proxy.config import ConfigError, load_config

    path = tmp_path / "proxy.json"

    def entry(auth: object) -> None:
        server = {"name": "r", "endpoint": "https://x.example/mcp", "manifest": "m.json"}
        path.write_text(
            json.dumps({"database": "p.db", "session": "s", "servers": [{**server, "auth": auth}]})
        )
        path.chmod(0o600)

    cc = {"grant": "client_credentials", "client_id": "c"}
    refusals = [
        ({**cc, "client_secret_file": "s", "private_key_file": "k"}, "or private_key_file"),
        ({**cc, "private_key_file": "k", "alg": "HS256"}, r"auth\.alg must be one of"),
        ({**cc, "client_secret_file": "s", "alg": "ES256"}, r"auth\.alg needs a private_key_file"),
        ({"private_key_file": "k", "client_id": "c"}, "is for the client_credentials grant"),
        ({**cc, "client_secret_file": "s", "id_token_file": "t"}, "for the identity_assertion"),
        (
            {"grant": "identity_assertion", "client_id": "c", "client_secret_file": "s"},
            "identity_assertion grant needs client_id, client_secret_file, idp_token_endpoint",
        ),
        (
            {"grant": "identity_assertion", "client_id": "c", "client_secret_file": "s",
             "idp_token_endpoint": "ftp://idp", "idp_client_id": "i", "id_token_file": "t"},
            r"auth\.idp_token_endpoint must be an http:// or https:// URL",
        ),
    ]  # fmt: skip
    for auth, refusal in refusals:
        entry(auth)
        with pytest.raises(ConfigError, match=refusal):
            load_config(path)
    entry({**cc, "private_key_file": "robot.key", "alg": "ES256", "scope": "read"})
    settings = load_config(path).servers[0].auth
    assert settings is not None and settings.private_key_file == tmp_path / "robot.key"
    entry(
        {"grant": "identity_assertion", "client_id": "c", "client_secret_file": "c.secret",
         "idp_token_endpoint": "https://idp.example/token", "idp_client_id": "i",
         "id_token_file": "id.token", "authorization_server": "https://as.example"}
    )  # fmt: skip
    settings = load_config(path).servers[0].auth
    assert settings is not None and settings.id_token_file == tmp_path / "id.token"
    assert settings.authorization_server == "https://as.example"


def _proxy_config(root: Path, servers: dict[str, tuple[OAuthServer, dict[str, str]]]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o700)
    entries = [
        {"name": name, "endpoint": server.endpoint, "manifest": f"{name}.manifest.json",
         "rules": RULES, "auth": auth}
        for name, (server, auth) in servers.items()
    ]  # fmt: skip
    path = root / "proxy.json"
    path.write_text(json.dumps({"database": "proxy.db", "session": "s", "servers": entries}))
    path.chmod(0o600)
    return path


def _text(result: Any) -> str:
    return "".join(getattr(block, "text", "") for block in result.content)


@pytest.mark.slow
async def test_a_proxy_session_with_both_grants_keeps_keys_id_tokens_and_assertions_out(
    tmp_path: Path, state_home: Path
) -> None:
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    keys = tmp_path / "keys"
    robot_key, robot_public = _key_pair(keys, "robot")
    idp_key, _ = _key_pair(keys, "idp")
    other_key, _ = _key_pair(keys, "other")
    environment = {
        "PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp"),
        "XDG_STATE_HOME": str(state_home),
        **{k: v for k, v in os.environ.items() if k == "AGENTRT_ANCHOR_DIR"},
    }  # fmt: skip
    with (
        oauth_server("--jwt-client", f"robot:{robot_public}", "--access-ttl", "2") as robot,
        oauth_server(
            "--client", "app:app-secret-value", "--idp-key", str(idp_key), "--access-ttl", "2"
        ) as app,
    ):
        id_token = _id_token(idp_key, app)
        conf = tmp_path / "conf"
        id_token_file = _owner_only(conf / "id.token", id_token)
        config = _proxy_config(
            conf,
            {
                "robot": (robot, {"grant": "client_credentials", "client_id": "robot",
                                  "private_key_file": str(robot_key), "scope": "read"}),
                "app": (app, {"grant": "identity_assertion", "client_id": "app",
                              "client_secret_file": str(_owner_only(conf / "app.secret",
                                                                    "app-secret-value")),
                              "idp_token_endpoint": f"{app.origin}/idp/token",
                              "idp_client_id": "idp-client", "id_token_file": str(id_token_file)}),
            },
        )  # fmt: skip
        outputs = []
        for command in (["login", "robot"], ["login", "app"], ["pin"]):
            done = subprocess.run(
                [str(AGENTRT), *command, "--config", str(config)],
                env=environment, capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            outputs.append(done.stdout + done.stderr)
        assert "logged in until" in outputs[0] and "logged in until" in outputs[1]

        stderr_path = tmp_path / "proxy.stderr"
        parameters = StdioServerParameters(
            command=str(AGENTRT), args=["proxy", "--config", str(config)], env=environment,
            cwd=str(tmp_path),
        )  # fmt: skip
        forged = _id_token(other_key, app)
        with stderr_path.open("a") as errlog:
            async with (
                stdio_client(parameters, errlog=errlog) as (read, write),
                ClientSession(read, write) as host,
            ):
                await host.initialize()
                for _ in range(2):  # the second time after the tokens ended: grants again
                    for name in ("robot", "app"):
                        result = await host.call_tool(f"{name}_whoami", {})
                        assert _text(result) == "an authorized client", _text(result)
                    await anyio.sleep(2.1)
                assert app.log()["idp_exchanges"] >= 2
                assert len(set(robot.log()["assertions"])) >= 2

                # The identity provider refuses the next exchange: that server waits for a
                # login and nothing ran; the other server keeps working.
                _owner_only(id_token_file, forged)
                await anyio.sleep(2.1)
                waiting = await host.call_tool("app_whoami", {})
                assert _text(waiting).startswith("UNAVAILABLE"), _text(waiting)
                assert "needs `agentrt login app`" in _text(waiting)
                assert "Nothing ran." in _text(waiting)
                still = await host.call_tool("robot_whoami", {})
                assert _text(still) == "an authorized client", _text(still)

        database = conf / "proxy.db"
        verified = subprocess.run(
            [str(AGENTRT), "--db", str(database), "verify"],
            env=environment, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert verified.returncode == 0, verified.stdout + verified.stderr
        export = subprocess.run(
            [str(AGENTRT), "--db", str(database), "export"],
            env=environment, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert export.returncode == 0, export.stderr
        assert "robot_whoami" in export.stdout
        key_lines = robot_key.read_text().splitlines()[1:-1]  # the key's base64 lines
        secrets_ = [
            *key_lines,
            id_token, forged, "app-secret-value",
            *robot.log()["assertions"], *app.log()["assertions"],
            *(header.removeprefix("Bearer ") for server in (robot, app)
              for header in server.log()["authorization"] if header),
        ]  # fmt: skip
        assert len(secrets_) > 12
        places = {
            "database": b"".join(
                path.read_bytes() for path in conf.iterdir() if path.name.startswith("proxy.db")
            ),
            "proxy stderr": stderr_path.read_bytes(),
            "login and pin output": "".join(outputs).encode(),
            "export": export.stdout.encode(),
            "manifests": b"".join(path.read_bytes() for path in conf.glob("*.manifest.json")),
            "configuration": config.read_bytes(),
        }
        for where, content in places.items():
            for secret in secrets_:
                assert secret.encode() not in content, f"a secret was found in the {where}"
        # The token files keep the tokens, not the key, the ID token or an assertion.
        stored = b"".join(path.read_bytes() for path in (state_home / "agentrt").rglob("*.json"))
        for secret in (*key_lines, id_token, forged):
            assert secret.encode() not in stored
