"""The inbox served by the proxy: `"inbox"` in its configuration, its address, notify-send."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import anyio
import pytest
from inbox_support import inbox_page, notes_setup
from proxy_helpers import host, text_of, write_private

from agentrt.proxy.config import ConfigError, load_config

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]


def _config_with_inbox(tmp_path: Path, inbox: object) -> Path:
    document = {
        "database": "proxy.db",
        "session": "s",
        "inbox": inbox,
        "servers": [{"name": "a", "command": ["true"], "manifest": "a.json", "rules": {}}],
    }
    return write_private(tmp_path / "proxy.json", json.dumps(document))


def test_the_inbox_settings_are_read_with_their_defaults(tmp_path: Path) -> None:
    config = load_config(_config_with_inbox(tmp_path, {"listen": "127.0.0.1:0"}))
    assert config.inbox is not None
    assert (config.inbox.listen, config.inbox.notify, config.inbox.token_file) == (
        "127.0.0.1:0", False, None,
    )  # fmt: skip
    kept = load_config(_config_with_inbox(tmp_path, {"notify": True, "token_file": "t.token"}))
    assert kept.inbox is not None and kept.inbox.notify is True
    assert kept.inbox.token_file == tmp_path / "t.token"
    assert kept.inbox.token_file in kept.protected_paths()
    assert (
        load_config(_config_with_inbox(tmp_path, None) if False else _no_inbox(tmp_path)).inbox
        is None
    )


def _no_inbox(tmp_path: Path) -> Path:
    path = _config_with_inbox(tmp_path, {})
    document = json.loads(path.read_text())
    del document["inbox"]
    return write_private(path, json.dumps(document))


@pytest.mark.parametrize(
    ("inbox", "problem"),
    [
        ({"listen": "0.0.0.0:8080"}, "inbox.listen must be a loopback address"),
        ({"listen": "192.168.1.5:0"}, "a remote inbox is `agentrt inbox --allow-remote`"),
        ({"listen": "nonsense"}, "is not HOST:PORT"),
        ({"notify": "yes"}, "inbox.notify must be true or false"),
        ({"open": True}, "inbox.open is not a field this file may have"),
        ("127.0.0.1:0", "inbox must be a JSON object"),
    ],
)
def test_a_bad_inbox_setting_is_refused_naming_it(
    tmp_path: Path, inbox: object, problem: str
) -> None:
    with pytest.raises(ConfigError, match=problem.replace(".", r"\.")):
        load_config(_config_with_inbox(tmp_path, inbox))


async def test_without_a_token_file_the_token_is_printed_once_at_start_never_per_approval(
    tmp_path: Path,
) -> None:
    setup, _notes = await notes_setup(tmp_path)
    setup.rewrite(inbox={"listen": "127.0.0.1:0"})
    async with host(setup) as session:
        with anyio.fail_after(30):
            while "agentrt proxy: inbox: http://127.0.0.1:" not in setup.stderr():
                await anyio.sleep(0.1)
        await session.call_tool("notes_write_note", {"path": "a.md", "content": "a\n"})
    lines = setup.stderr().splitlines()
    start = next(line for line in lines if line.startswith("agentrt proxy: inbox: "))
    address, _, token = start.removeprefix("agentrt proxy: inbox: ").partition("#token=")
    assert len(token) >= 40
    waiting = next(line for line in lines if " waits for " in line)
    assert waiting.endswith(f"  |  inbox: {address}") and token not in waiting
    assert setup.stderr().count(token) == 1


async def test_notify_sends_one_desktop_notification_per_waiting_approval(
    tmp_path: Path,
) -> None:
    setup, _notes = await notes_setup(tmp_path, notify=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "notifications.jsonl"
    fake = bin_dir / "notify-send"
    # A stand-in for the desktop's notify-send that writes down the arguments it got.
    fake.write_text(
        "#!/usr/bin/env python3\n"
        "import json, sys\n"
        f"open({str(record)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
    )
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    environment = setup.environment()
    setup.environment = lambda: {  # type: ignore[method-assign]
        **environment,
        "PATH": f"{bin_dir}{os.pathsep}{environment['PATH']}",
    }
    arguments = {"path": "a.md", "content": "<b>bold</b>\n"}
    async with host(setup) as session:
        address, _page = await inbox_page(setup)
        first = await session.call_tool("notes_write_note", arguments)
        again = await session.call_tool("notes_write_note", arguments)
        assert text_of(first).startswith("PENDING_APPROVAL: ")
        assert text_of(again).startswith("PENDING_APPROVAL: ")
        with anyio.fail_after(20):
            while not record.exists():
                await anyio.sleep(0.1)
        await anyio.sleep(1)
    sent = [json.loads(line) for line in record.read_text().splitlines()]
    assert sent == [
        ["--app-name=agentrt", "agentrt: an approval waits",
         f"notes_write_note (tool:local_mutation)\n{address}"],
    ]  # fmt: skip
