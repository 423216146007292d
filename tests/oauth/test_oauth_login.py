"""`agentrt login`'s flow against a real authorization server built from the SDK's
server-side auth, and the tokens at work on a real connection."""

from __future__ import annotations

import stat

import anyio
import pytest
from oauth_support import OAuthServer, click_consent

from agentrt.mcp import Server
from agentrt.mcp._connection import connect
from agentrt.mcp._login import AuthSettings, login
from agentrt.mcp._oauth import OAuthClientFactory, OAuthSession
from agentrt.mcp._tokens import token_directory

pytestmark = pytest.mark.anyio


async def _login(server: OAuthServer, name: str = "remote", **kwargs: object) -> object:
    async def browser(url: str) -> None:
        assert "code_challenge_method=S256" in url and "state=" in url and "resource=" in url
        group.start_soon(click_consent, url)

    async with anyio.create_task_group() as group:
        return await login(name, server.endpoint, AuthSettings(**kwargs), show_url=browser)  # type: ignore[arg-type]


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
    assert record.access_token not in repr(record)  # type: ignore[attr-defined]
    session = OAuthSession.for_server("remote", authorization_server.endpoint)
    assert await _whoami(authorization_server, session) == "an authorized client"
    seen = authorization_server.log()["authorization"]
    assert f"Bearer {record.access_token}" in seen  # type: ignore[attr-defined]


async def test_without_a_login_the_connection_fails_naming_agentrt_login(
    authorization_server: OAuthServer, capsys: pytest.CaptureFixture[str]
) -> None:
    session = OAuthSession.for_server("remote", authorization_server.endpoint)
    with pytest.raises(Exception, match="needs `agentrt login remote`"):
        await _whoami(authorization_server, session)
    assert capsys.readouterr().err.count("agentrt login remote") == 1
