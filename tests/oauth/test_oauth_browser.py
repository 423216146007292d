"""`agentrt login` with a real browser: headless Chromium through Selenium opens the URL the
command prints, presses Allow on the authorization server's consent page, and lands on
the command's loopback listener, which stores the tokens."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from oauth_support import OAuthServer

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.timeout(180)]

AGENTRT = Path(sys.executable).parent / "agentrt"
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")


@pytest.fixture
def driver() -> Iterator[Any]:
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        pytest.skip("headless Chromium is not installed (/usr/bin/chromium and chromedriver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="agentrt-chromium-")
    options = Options()
    options.binary_location = str(CHROMIUM)
    for flag in (
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run",
        "--disable-dev-shm-usage", f"--user-data-dir={profile}",
    ):  # fmt: skip
        options.add_argument(flag)
    try:
        opened = webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))
    except BaseException:
        shutil.rmtree(profile, ignore_errors=True)
        raise
    opened.set_page_load_timeout(60)
    try:
        yield opened
    finally:
        opened.quit()
        shutil.rmtree(profile, ignore_errors=True)


def _consent_in_browser(driver: Any, url: str) -> str:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(url)
    WebDriverWait(driver, 30).until(expected_conditions.element_to_be_clickable((By.ID, "allow")))
    scope = driver.find_element(By.ID, "scope").text
    driver.find_element(By.ID, "allow").click()
    WebDriverWait(driver, 30).until(lambda d: "received the authorization" in d.page_source)
    return scope


async def test_a_person_logs_in_through_a_real_browser_and_the_tokens_serve(
    authorization_server: OAuthServer, driver: Any, tmp_path: Path, state_home: Path
) -> None:
    config = tmp_path / "proxy.json"
    entry = {"name": "remote", "endpoint": authorization_server.endpoint, "manifest": "m.json"}
    config.write_text(json.dumps({"database": "p.db", "session": "s", "servers": [entry]}))
    config.chmod(0o600)
    process = await anyio.open_process(
        [str(AGENTRT), "login", "remote", "--config", str(config), "--no-browser"],
        env={**os.environ, "XDG_STATE_HOME": str(state_home)},
    )
    assert process.stderr is not None and process.stdout is not None
    async with process:
        stderr = b""
        while not any(line.startswith(b"http://") for line in stderr.split(b"\n")[:-1]):
            stderr += await process.stderr.receive()
        url = next(line for line in stderr.decode().splitlines() if line.startswith("http://"))
        scope = await anyio.to_thread.run_sync(_consent_in_browser, driver, url)
        assert scope == "read"
        stdout = b"".join([chunk async for chunk in process.stdout])
        await process.wait()
    assert process.returncode == 0
    assert b'server "remote": logged in until' in stdout
    assert driver.current_url.startswith("http://127.0.0.1:")
    assert "/callback?code=" in driver.current_url

    from agentrt.mcp import Server
    from agentrt.mcp._connection import connect
    from agentrt.mcp._oauth import OAuthClientFactory, OAuthSession

    session = OAuthSession.for_server("remote", authorization_server.endpoint)
    connection = await connect(
        Server(name="remote", endpoint=authorization_server.endpoint,
               http_client_factory=OAuthClientFactory(session))
    )  # fmt: skip
    try:
        result = await connection.call_tool("whoami", "{}", timeout=10)
    finally:
        await connection.aclose()
    assert result["content"][0]["text"] == "an authorized client"
