"""What the inbox tests run against: a real `agentrt inbox` process, and headless Chromium."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2 as httpx
from proxy_helpers import ProxySetup, write_private

from agentrt.mcp import Server, pin

AGENTRT = Path(sys.executable).with_name("agentrt")
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
REPO = Path(__file__).resolve().parents[2]
HOSTILE = (
    '<script>window.pwned = 1</script><img src=x onerror="window.pwned = 2">'
    " \u202eexe.txt \x1b[31mred\x1b[0m"
)
"""Markup, an event-handler attribute, a bidi override and a terminal escape."""

FORTY_LINES = "".join(f"line {number} of the note\n" for number in range(1, 41))

SCREENSHOTS = os.environ.get("AGENTRT_INBOX_SCREENSHOTS")
"""A directory to save the docs' screenshots in, when set (docs/images when refreshing them)."""


@dataclass
class Inbox:
    """A running `agentrt --db PATH inbox`: its address, token, and process."""

    process: subprocess.Popen[str]
    first_line: str
    base: str
    token: str
    stderr_path: Path

    @property
    def page(self) -> str:
        return f"{self.base}#token={self.token}"

    def client(self, **headers: str) -> httpx.Client:
        return httpx.Client(base_url=self.base, headers=headers, timeout=10.0, trust_env=False)

    def authorized(self) -> httpx.Client:
        return self.client(Authorization=f"Bearer {self.token}")

    def session(self) -> dict[str, Any]:
        with self.authorized() as client:
            answer = client.get("/api/session")
            answer.raise_for_status()
            result: dict[str, Any] = answer.json()
            return result

    def post_decision(self, body: dict[str, Any], **headers: str) -> httpx.Response:
        with self.client(**headers) as client:
            return client.post("/api/decide", json=body)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


def start_inbox(database: Path, *extra: str, stderr_path: Path | None = None) -> Inbox:
    """Start the installed `agentrt` as a real process and read its first line of stdout."""
    stderr_path = stderr_path or database.with_suffix(".inbox.stderr")
    with stderr_path.open("w") as stderr:
        process = subprocess.Popen(
            [str(AGENTRT), "--db", str(database), "inbox", *extra],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
    assert process.stdout is not None
    first = process.stdout.readline().rstrip("\n")
    assert first.startswith("inbox: http://127.0.0.1:"), (first, stderr_path.read_text())
    address = first.removeprefix("inbox: ")
    base, _, token = address.partition("#token=")
    return Inbox(process, first, base, token, stderr_path)


def chromium_options(profile: str) -> Any:
    from selenium.webdriver.chrome.options import Options

    options = Options()
    options.binary_location = str(CHROMIUM)
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--disable-dev-shm-usage",
        "--window-size=1280,1600",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    return options


class Browser:
    """Headless Chromium driven through Selenium, with a fresh profile of its own."""

    def __init__(self) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        self.profile = tempfile.mkdtemp(prefix="agentrt-chromium-")
        try:
            self.driver = webdriver.Chrome(
                options=chromium_options(self.profile), service=Service(str(CHROMEDRIVER))
            )
        except BaseException:
            shutil.rmtree(self.profile, ignore_errors=True)
            raise
        self.driver.set_page_load_timeout(60)

    def wait_for(self, condition: Any, timeout: float = 30.0, message: str = "") -> Any:
        deadline = time.monotonic() + timeout
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            try:
                value = condition(self.driver)
                if value:
                    return value
            except Exception as error:  # the page is still changing
                last_error = error
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting: {message} ({last_error})")

    def screenshot(self, name: str) -> None:
        if SCREENSHOTS:
            Path(SCREENSHOTS).mkdir(parents=True, exist_ok=True)
            self.driver.save_screenshot(str(Path(SCREENSHOTS) / name))

    def close(self) -> None:
        try:
            self.driver.quit()
        finally:
            shutil.rmtree(self.profile, ignore_errors=True)


NOTES_SERVER = Path(__file__).parent / "servers" / "notes_server.py"
RULES: dict[str, Any] = {
    "write_note": {"side_effect": "local_mutation"},
    "edit_note": {"side_effect": "local_mutation"},
}
_INBOX_LINE = re.compile(r"agentrt proxy: inbox at (http://127\.0\.0\.1:\d+/) \(token in ")


async def notes_setup(root: Path, **inbox: Any) -> tuple[ProxySetup, Path]:
    """A proxy over the notes server, every write needing approval, serving the inbox."""
    notes = root / "notes"
    notes.mkdir(parents=True)
    conf = root / "conf"
    server = Server(
        name="notes",
        command=[sys.executable, str(NOTES_SERVER)],
        env=[f"NOTES_DIR={notes}"],
        connect_timeout=20.0,
    )
    write_private(conf / "notes.manifest.json", (await pin(server)).to_json())
    document: dict[str, Any] = {
        "database": "proxy.db",
        "session": "inbox-session",
        "hold": "300ms",
        "policy": {"read_only": "allow", "local_mutation": "require_approval"},
        "inbox": {"listen": "127.0.0.1:0", "token_file": "inbox.token", **inbox},
        "servers": [
            {
                "name": "notes",
                "command": [sys.executable, str(NOTES_SERVER)],
                "env": [f"NOTES_DIR={notes}"],
                "default_timeout": "10s",
                "manifest": "notes.manifest.json",
                "rules": RULES,
            }
        ],
    }
    config_path = write_private(conf / "proxy.json", json.dumps(document))
    setup = ProxySetup(
        root=root, config_path=config_path, database=conf / "proxy.db",
        upstream_log=notes / "executions.log", stderr_path=root / "proxy.stderr",
        document=document,
    )  # fmt: skip
    return setup, notes


async def inbox_page(setup: ProxySetup) -> tuple[str, str]:
    """The inbox address the proxy announced, and the page address with its token."""
    with anyio.fail_after(30):
        while not (match := _INBOX_LINE.search(setup.stderr())):
            await anyio.sleep(0.1)
    token = (setup.root / "conf" / "inbox.token").read_text().strip()
    return match.group(1), f"{match.group(1)}#token={token}"
