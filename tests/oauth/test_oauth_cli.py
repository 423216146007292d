"""`agentrt login SERVER --config FILE` and `agentrt login --status`, as a person runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from oauth_support import OAuthServer, click_consent, oauth_server

pytestmark = pytest.mark.anyio

AGENTRT = Path(sys.executable).parent / "agentrt"


def _config(root: Path, server: OAuthServer, **auth: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    entry: dict[str, object] = {
        "name": "remote",
        "endpoint": server.endpoint,
        "manifest": "remote.manifest.json",
    }
    if auth:
        entry["auth"] = auth
    path = root / "proxy.json"
    path.write_text(json.dumps({"database": "proxy.db", "session": "s", "servers": [entry]}))
    path.chmod(0o600)
    return path


def _environment(state: Path) -> dict[str, str]:
    return {**os.environ, "XDG_STATE_HOME": str(state)}


async def _run_login(config: Path, state: Path, *extra: str) -> tuple[int, str, str]:
    """Run `agentrt login remote`, be the browser on the URL it prints, return its end."""
    process = await anyio.open_process(
        [str(AGENTRT), "login", "remote", "--config", str(config), "--no-browser", *extra],
        env=_environment(state),
    )
    assert process.stderr is not None and process.stdout is not None
    stderr = b""
    async with process:
        while not any(line.startswith(b"http://") for line in stderr.split(b"\n")[:-1]):
            stderr += await process.stderr.receive()
        url = next(line for line in stderr.decode().splitlines() if line.startswith("http://"))
        await click_consent(url)
        stdout = b""
        async for chunk in process.stdout:
            stdout += chunk
        async for chunk in process.stderr:
            stderr += chunk
        await process.wait()
    return process.returncode or 0, stdout.decode(), stderr.decode()


async def test_agentrt_login_prints_the_url_and_stores_the_tokens_then_status_shows_them(
    authorization_server: OAuthServer, tmp_path: Path, state_home: Path
) -> None:
    config = _config(tmp_path / "conf", authorization_server)
    before = subprocess.run(
        [str(AGENTRT), "login", "--status", "--config", str(config)],
        env=_environment(state_home), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert before.returncode == 0, before.stderr
    assert 'server "remote": no login' in before.stdout

    code, stdout, stderr = await _run_login(config, state_home)
    assert code == 0, stderr
    assert "Open this URL in your browser" in stderr
    assert 'server "remote": logged in until' in stdout

    after = subprocess.run(
        [str(AGENTRT), "login", "--status", "--config", str(config)],
        env=_environment(state_home), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert 'server "remote": logged in (until' in after.stdout
    assert "scope read" in after.stdout
    record = json.loads(next((state_home / "agentrt" / "oauth").glob("*.json")).read_text())
    for output in (stdout, stderr, after.stdout, after.stderr):
        assert record["access_token"] not in output
        assert record["refresh_token"] not in output


def test_the_auth_entry_is_checked_and_a_bad_one_refused_naming_it(tmp_path: Path) -> None:
    from agentrt.proxy.config import ConfigError, load_config

    path = tmp_path / "proxy.json"

    def entry(auth: object, **more: object) -> None:
        server = {"name": "r", "endpoint": "https://x.example/mcp", "manifest": "m.json"}
        path.write_text(
            json.dumps(
                {"database": "p.db", "session": "s", "servers": [{**server, "auth": auth, **more}]}
            )
        )
        path.chmod(0o600)

    entry({"grant": "password"})
    with pytest.raises(ConfigError, match=r'auth\.grant must be "authorization_code"'):
        load_config(path)
    entry({"grant": "client_credentials", "client_id": "c"})
    with pytest.raises(ConfigError, match="client_credentials grant needs client_id"):
        load_config(path)
    entry({"scpoe": "read"})
    with pytest.raises(ConfigError, match=r"auth\.scpoe is not a field"):
        load_config(path)
    entry({"scope": "read"}, headers={"Authorization": "Bearer x"})
    with pytest.raises(
        ConfigError, match="auth is only for a server with an endpoint and no headers"
    ):
        load_config(path)
    entry({"scope": "read write", "client_id": "agentrt"})
    config = load_config(path)
    assert config.servers[0].auth is not None
    assert config.servers[0].auth.scope == "read write"


def test_the_client_credentials_grant_logs_in_without_a_person_from_an_owner_only_secret(
    tmp_path: Path, state_home: Path
) -> None:
    with oauth_server("--client", "robot:s3cret-value", "--access-ttl", "1") as server:
        secret = tmp_path / "robot.secret"
        secret.write_text("s3cret-value\n")
        secret.chmod(0o644)
        config = _config(
            tmp_path / "conf", server, grant="client_credentials", client_id="robot",
            client_secret_file=str(secret), scope="read",
        )  # fmt: skip
        environment = _environment(state_home)
        command = [str(AGENTRT), "login", "remote", "--config", str(config)]
        refused = subprocess.run(
            command, env=environment, capture_output=True, text=True, timeout=60
        )
        assert refused.returncode == 1
        assert "can be read by other users" in refused.stderr
        assert "s3cret-value" not in refused.stderr

        secret.chmod(0o600)
        done = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert 'server "remote": logged in until' in done.stdout
        assert "s3cret-value" not in done.stdout + done.stderr

        # No refresh token: when the access token ends, the grant is made again.
        async def call_twice() -> list[str]:
            from agentrt.mcp import Server
            from agentrt.mcp._connection import connect
            from agentrt.mcp._oauth import OAuthClientFactory, OAuthSession

            session = OAuthSession.for_server("remote", server.endpoint)
            texts = []
            for _ in range(2):
                connection = await connect(
                    Server(name="remote", endpoint=server.endpoint,
                           http_client_factory=OAuthClientFactory(session))
                )  # fmt: skip
                try:
                    result = await connection.call_tool("whoami", "{}", timeout=10)
                finally:
                    await connection.aclose()
                texts.append(result["content"][0]["text"])
                await anyio.sleep(1.1)
            return texts

        os.environ["XDG_STATE_HOME"] = str(state_home)
        assert anyio.run(call_twice) == ["an authorized client"] * 2
        used = [header for header in server.log()["authorization"] if header]
        # A new grant when the token ended: the last call's token is not the first's. Two
        # tokens on a quiet machine (the login's, then one granted again); three when the
        # login's 1 s token had already ended before the first call (a loaded machine).
        assert used[-1] != used[0]
        assert len(set(used)) in (2, 3)


def test_a_refused_login_is_one_sentence_without_a_traceback(
    tmp_path: Path, state_home: Path
) -> None:
    with oauth_server("--prm-resource", "http://127.0.0.1:9/other") as server:
        config = _config(tmp_path / "conf", server)
        finished = subprocess.run(
            [str(AGENTRT), "login", "remote", "--config", str(config), "--no-browser",
             "--timeout", "5"],
            env=_environment(state_home), capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert finished.returncode == 1
    lines = finished.stderr.strip().splitlines()
    assert len(lines) == 1, finished.stderr
    assert lines[0].startswith('agentrt: the login to server "remote" failed: Protected resource')
    assert not (state_home / "agentrt" / "oauth").exists() or not list(
        (state_home / "agentrt" / "oauth").glob("*.json")
    )
