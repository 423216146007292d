"""What the OAuth tests run against: the test authorization server in its own process,
and a scripted browser that clicks its consent button."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2

SERVER = Path(__file__).parent / "servers" / "oauth_server.py"


@dataclass
class OAuthServer:
    process: subprocess.Popen[str]
    port: int

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def endpoint(self) -> str:
        return f"{self.origin}/mcp"

    def log(self) -> dict[str, Any]:
        answer: dict[str, Any] = httpx2.get(f"{self.origin}/test/log").json()
        return answer

    def revoke_all(self) -> None:
        httpx2.post(f"{self.origin}/test/revoke-all")


@contextmanager
def oauth_server(*arguments: str) -> Iterator[OAuthServer]:
    process = subprocess.Popen(
        [sys.executable, str(SERVER), *arguments],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        server = OAuthServer(process, int(line))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                httpx2.get(f"{server.origin}/.well-known/oauth-authorization-server")
                break
            except httpx2.HTTPError:
                time.sleep(0.05)
        yield server
    finally:
        process.terminate()
        process.wait(10)


async def click_consent(url: str, *, tamper: Any = None) -> str:
    """Be the person's browser: open `url`, press Allow on the consent page, and follow the
    authorization server's redirect to the loopback listener.  `tamper` may rewrite the
    redirect's URL first (an attacker's response).  Returns the loopback page's text."""
    async with httpx2.AsyncClient(follow_redirects=False, timeout=10) as browser:
        response = await browser.get(url)
        while response.status_code in (302, 303, 307):
            response = await browser.get(response.headers["location"])
        assert response.status_code == 200, response.text
        request = response.text.split("name='request' value='")[1].split("'")[0]
        origin = str(response.url.copy_with(path="/", query=None)).rstrip("/")
        answer = await browser.post(f"{origin}/consent", data={"request": request})
        assert answer.status_code == 302
        location = answer.headers["location"]
        if tamper is not None:
            location = tamper(location)
        page = await browser.get(location)
        return page.text
