"""`agentrt login`'s flow against a real authorization server built from the SDK's
server-side auth, and the tokens at work on a real connection."""

from __future__ import annotations

import contextlib
import stat
import subprocess
import sys
import time
import urllib.parse
from typing import Any

import anyio
import httpx2
import pytest
from oauth_support import OAuthServer, click_consent, oauth_server

from agentrt.mcp import Server
from agentrt.mcp._connection import connect
from agentrt.mcp._login import AuthSettings, LoginError, login
from agentrt.mcp._oauth import NeedsLogin, OAuthClientFactory, OAuthSession
from agentrt.mcp._tokens import TokenRecord, token_directory

pytestmark = pytest.mark.anyio


async def _login(server: OAuthServer, name: str = "remote", **kwargs: Any) -> TokenRecord:
    def browser(start: Any) -> Any:
        async def open_url(url: str) -> None:
            assert "code_challenge_method=S256" in url and "state=" in url
            assert "resource=" in url
            start(click_consent(url))

        return open_url

    return await _beside_a_browser(
        lambda start: login(name, server.endpoint, AuthSettings(**kwargs), show_url=browser(start))
    )


async def _beside_a_browser(work: Any) -> Any:
    """Run `work(start)` (a login whose browser `start`s beside it); its error leaves as
    itself, not inside a task group's."""
    outcome: list[Any] = []
    async with anyio.create_task_group() as group:

        def start(coroutine: Any) -> None:
            group.start_soon(_quietly, coroutine)

        try:
            outcome.append(await work(start))
        except Exception as exc:
            outcome.append(exc)
        group.cancel_scope.cancel()
    if isinstance(outcome[0], Exception):
        raise outcome[0]
    return outcome[0]


async def _whoami(server: OAuthServer, session: OAuthSession) -> str:
    connection = await connect(
        Server(
            name=session.name,
            endpoint=server.endpoint,
            http_client_factory=OAuthClientFactory(session),
        )
    )
    try:
        result = await connection.call_tool("whoami", "{}", timeout=10)
    finally:
        await connection.aclose()
    return str(result["content"][0]["text"])


async def test_login_stores_tokens_owner_only_and_a_connection_uses_them(
    authorization_server: OAuthServer,
) -> None:
    record = await _login(authorization_server)
    directory = token_directory()
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    files = [path for path in directory.iterdir() if path.suffix == ".json"]
    assert len(files) == 1 and stat.S_IMODE(files[0].stat().st_mode) == 0o600
    assert record.access_token not in repr(record)
    session = OAuthSession.for_server("remote", authorization_server.endpoint)
    assert await _whoami(authorization_server, session) == "an authorized client"
    seen = authorization_server.log()["authorization"]
    assert f"Bearer {record.access_token}" in seen


async def test_without_a_login_the_connection_fails_naming_agentrt_login(
    authorization_server: OAuthServer, capsys: pytest.CaptureFixture[str]
) -> None:
    session = OAuthSession.for_server("remote", authorization_server.endpoint)
    with pytest.raises(Exception, match="needs `agentrt login remote`"):
        await _whoami(authorization_server, session)
    assert capsys.readouterr().err.count("agentrt login remote") == 1


async def _login_tampered(server: OAuthServer, tamper: Any) -> None:
    def browser(start: Any) -> Any:
        async def open_url(url: str) -> None:
            start(click_consent(url, tamper=tamper))

        return open_url

    await _beside_a_browser(
        lambda start: login(
            "remote", server.endpoint, AuthSettings(), show_url=browser(start), timeout=20
        )
    )


async def _quietly(work: Any) -> None:
    with contextlib.suppress(Exception):
        await work


def _replace_parameter(name: str, value: str) -> Any:
    def tamper(location: str) -> str:
        parts = urllib.parse.urlsplit(location)
        query = dict(urllib.parse.parse_qsl(parts.query))
        query[name] = value
        return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))

    return tamper


def _no_token_stored() -> bool:
    directory = token_directory()
    return not directory.exists() or not list(directory.glob("*.json"))


async def test_an_authorization_response_with_another_state_is_refused_and_nothing_stored(
    authorization_server: OAuthServer,
) -> None:
    with pytest.raises(LoginError, match="State parameter mismatch"):
        await _login_tampered(authorization_server, _replace_parameter("state", "forged"))
    assert _no_token_stored()


async def test_an_authorization_response_from_another_issuer_is_refused(
    authorization_server: OAuthServer,
) -> None:
    with pytest.raises(LoginError, match="iss mismatch"):
        await _login_tampered(
            authorization_server, _replace_parameter("iss", "http://127.0.0.1:9/evil")
        )
    assert _no_token_stored()


async def test_resource_metadata_naming_another_resource_is_refused_as_a_mix_up() -> None:
    with (
        oauth_server("--prm-resource", "http://127.0.0.1:9/other") as server,
        pytest.raises(LoginError, match="does not match"),
    ):
        await _login(server)
    assert _no_token_stored()


async def test_resource_metadata_on_another_origin_is_refused_before_it_is_fetched() -> None:
    with (
        oauth_server("--metadata-origin", "http://127.0.0.1:9") as server,
        pytest.raises(LoginError, match="resource metadata on another origin"),
    ):
        await _login(server)
    assert _no_token_stored()


async def test_a_token_file_others_can_read_is_refused_and_named(
    authorization_server: OAuthServer,
) -> None:
    await _login(authorization_server)
    session = OAuthSession.for_server("remote", authorization_server.endpoint)
    session.file.path.chmod(0o644)
    with pytest.raises(Exception, match="can be reached by other users"):
        await _whoami(authorization_server, session)
    assert await session.waiting_for_login() is not None
    session.file.path.chmod(0o600)
    session.file.path.parent.chmod(0o755)
    with pytest.raises(NeedsLogin, match=r"token directory .* can be reached by other users"):
        await session.access_token()
    session.file.path.parent.chmod(0o700)
    # Made owner-only again, the same tokens serve (nothing else was harmed).
    assert await _whoami(authorization_server, session) == "an authorized client"


async def test_a_revoked_refresh_token_makes_the_server_wait_for_a_login_with_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with oauth_server("--access-ttl", "1") as server:
        await _login(server)
        server.revoke_all()
        await anyio.sleep(1.1)
        session = OAuthSession.for_server("remote", server.endpoint)
        for _ in range(3):
            reason = await session.preflight()
            assert reason is not None and "needs `agentrt login remote`" in reason
            assert "refused the refresh (HTTP 400, invalid_grant)" in reason
        assert capsys.readouterr().err.count("agentrt login remote") == 1
        # A new login is read by the same session: no restart.
        await _login(server)
        assert await session.preflight() is None
        assert await _whoami(server, session) == "an authorized client"


async def test_an_expired_refresh_token_makes_the_server_wait_for_a_login() -> None:
    with oauth_server("--access-ttl", "1", "--refresh-ttl", "1") as server:
        await _login(server)
        await anyio.sleep(2.1)
        session = OAuthSession.for_server("remote", server.endpoint)
        reason = await session.preflight()
        assert reason is not None and "invalid_grant" in reason


async def test_a_token_endpoint_answering_a_refresh_with_a_redirect_is_not_followed() -> None:
    hits: list[bytes] = []
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)

    async def catch(stream: Any) -> None:
        async with stream:
            hits.append(await stream.receive())

    async with anyio.create_task_group() as group:
        group.start_soon(listener.serve, catch)
        catcher = f"http://127.0.0.1:{port}/steal"
        with oauth_server("--access-ttl", "1", "--token-redirect", catcher) as server:
            await _login(server)
            record = OAuthSession.for_server("remote", server.endpoint).file.read()
            assert record is not None and record.refresh_token is not None
            await anyio.sleep(1.1)
            session = OAuthSession.for_server("remote", server.endpoint)
            reason = await session.preflight()
            assert reason is not None and "redirect, which is not followed" in reason
            await anyio.sleep(0.2)
        group.cancel_scope.cancel()
    assert hits == []


async def test_the_token_goes_only_to_the_servers_own_origin(
    authorization_server: OAuthServer,
) -> None:
    await _login(authorization_server)
    session = OAuthSession.for_server("remote", authorization_server.endpoint)
    record = session.file.read()
    assert record is not None
    seen: list[str] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(request.headers.get("authorization", ""))
        return httpx2.Response(200)

    auth = session.auth()
    async with httpx2.AsyncClient(transport=httpx2.MockTransport(handler), auth=auth) as client:
        # Another origin, and the same host on another port: no token; a host's own
        # Authorization is dropped, never forwarded.
        await client.get("http://127.0.0.2:80/mcp", headers={"authorization": "Bearer host"})
        port = int(authorization_server.port) + 1
        await client.get(f"http://127.0.0.1:{port}/mcp")
        await client.get(authorization_server.endpoint, headers={"authorization": "Bearer host"})
    assert seen == ["", "", f"Bearer {record.access_token}"]


_REFRESHER = """
import sys, time
import anyio
from agentrt.mcp._oauth import OAuthSession

session = OAuthSession.for_server("remote", sys.argv[1])
time.sleep(max(0.0, float(sys.argv[2]) - time.time()))
print(anyio.run(session.preflight))
"""


async def test_two_processes_refreshing_at_once_spend_the_rotating_refresh_token_once() -> None:
    with oauth_server("--access-ttl", "1") as server:
        await _login(server)
        await anyio.sleep(1.1)  # both find the access token at its end
        at = time.time() + 2.0
        processes = [
            subprocess.Popen(
                [sys.executable, "-c", _REFRESHER, server.endpoint, str(at)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)
        ]
        outputs = [process.communicate(timeout=60) for process in processes]
        assert [out.strip() for out, _ in outputs] == ["None", "None"], outputs
        assert server.log()["refreshes"] == 1
        session = OAuthSession.for_server("remote", server.endpoint)
        assert await _whoami(server, session) == "an authorized client"
