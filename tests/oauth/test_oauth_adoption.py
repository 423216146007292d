"""Adoption: a host's remote server behind OAuth is carried over by `agentrt init` and
marked as waiting for `agentrt login NAME`; `check`, `classify` and the proxy's start-up
say the same instead of failing to start; after the login, it pins and serves."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from oauth_support import OAuthServer, click_consent

from agentrt.mcp._login import login
from agentrt.mcp._tokens import AuthSettings

pytestmark = pytest.mark.slow

AGENTRT = Path(sys.executable).parent / "agentrt"


def _agentrt(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(AGENTRT), *args],
        env={**os.environ, "XDG_STATE_HOME": str(state)},
        capture_output=True,
        text=True,
        timeout=90,
    )


def test_init_marks_a_server_answering_401_and_every_command_names_agentrt_login(
    authorization_server: OAuthServer, tmp_path: Path, state_home: Path
) -> None:
    host_file = tmp_path / "claude_desktop_config.json"
    host_file.write_text(
        json.dumps({"mcpServers": {"tracker": {"url": authorization_server.endpoint}}})
    )
    out = tmp_path / "agentrt"
    init = _agentrt(state_home, "init", "--from", str(host_file), "--out", str(out))
    assert init.returncode == 0, init.stderr
    said = init.stdout + init.stderr
    assert "needs `agentrt login tracker`" in said
    config = out / "proxy.json"
    entry = json.loads(config.read_text())["servers"][0]
    assert entry["endpoint"] == authorization_server.endpoint
    assert "needs `agentrt login tracker`" in entry["note"]

    check = _agentrt(state_home, "check", "--config", str(config))
    assert "needs `agentrt login tracker`" in check.stdout + check.stderr
    classify = _agentrt(state_home, "classify", "--config", str(config), "tracker")
    assert "needs `agentrt login tracker`" in classify.stdout + classify.stderr

    proxy = subprocess.Popen(
        [str(AGENTRT), "proxy", "--config", str(config)],
        env={**os.environ, "XDG_STATE_HOME": str(state_home)},
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        _, stderr = proxy.communicate(input="", timeout=60)
    finally:
        proxy.kill()
    assert "server tracker did not load" in stderr and "needs `agentrt login tracker`" in stderr

    async def log_in() -> None:
        async def browser(url: str) -> None:
            group.start_soon(click_consent, url)

        async with anyio.create_task_group() as group:
            await login("tracker", authorization_server.endpoint, AuthSettings(), show_url=browser)

    os.environ["XDG_STATE_HOME"] = str(state_home)
    anyio.run(log_in)
    pinned = _agentrt(state_home, "pin", "--config", str(config), "tracker")
    assert pinned.returncode == 0, pinned.stderr
    assert (out / "tracker.manifest.json").exists()
