"""A hostile stdio server under a sandbox reaches only what its rule grants."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sandbox_support import ESCAPER, Listener, escaper, session

from agentrt.mcp import Sandbox, Server
from agentrt.mcp._sandbox import PRIVATE_HOME
from agentrt.store import open_store

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]

SECRET = "operator-private-key-material"


@dataclass
class Operator:
    home: Path
    secret: Path
    database: Path
    docs: Path
    work: Path
    outside: Path

    def sandbox(self, **settings: object) -> Sandbox:
        return Sandbox(read=[str(self.docs)], write=[str(self.work)], **settings)  # type: ignore[arg-type]


@pytest.fixture
def operator(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Operator:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    secret = home / ".ssh" / "id_ed25519"
    secret.write_text(SECRET)
    monkeypatch.setenv("HOME", str(home))
    state = tmp_path / "state"
    state.mkdir()
    database = state / "agentrt.db"
    open_store(database).close()  # a real SQLite file, as the proxy leaves it
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "guide.md").write_text("# the guide\n")
    work = tmp_path / "work"
    work.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    return Operator(home, secret, database, docs, work, outside)


@pytest.fixture
def listener() -> Iterator[Listener]:
    opened = Listener()
    try:
        yield opened
    finally:
        opened.close()


async def test_unsandboxed_the_escaper_reaches_everything_it_tries(
    operator: Operator, listener: Listener
) -> None:
    # The control: without a sandbox every probe below succeeds, so their failures mean something.
    async with session(escaper(None)) as call:
        assert (await call("read", path=str(operator.secret)))["value"] == SECRET
        assert (await call("read", path=str(operator.database)))["ok"]
        assert (await call("write", path=str(operator.outside / "x"), content="x"))["ok"]
        assert str(os.getpid()) in map(str, (await call("whoami"))["value"]["proc"])
        assert (await call("connect", host="127.0.0.1", port=listener.port))["ok"]
    assert listener.saw_anyone()


async def test_a_sandboxed_server_cannot_read_a_secret_in_the_operators_home(
    operator: Operator,
) -> None:
    async with session(escaper(operator.sandbox())) as call:
        attempt = await call("read", path=str(operator.secret))
        listing = await call("list", path=str(operator.home))
        environment = (await call("whoami"))["value"]
    assert not attempt["ok"] and "No such file" in attempt["error"]
    assert not listing["ok"]
    assert environment["home"] == PRIVATE_HOME
    assert environment["tmpdir"] == "/tmp"


async def test_a_sandboxed_server_cannot_see_the_proxy_database(operator: Operator) -> None:
    async with session(escaper(operator.sandbox())) as call:
        by_file = await call("read", path=str(operator.database))
        by_directory = await call("list", path=str(operator.database.parent))
    assert not by_file["ok"] and "No such file" in by_file["error"]
    assert not by_directory["ok"]


async def test_a_sandboxed_server_cannot_write_outside_its_write_paths(
    operator: Operator,
) -> None:
    async with session(escaper(operator.sandbox())) as call:
        beside = await call("write", path=str(operator.outside / "escaped"), content="x")
        in_read_path = await call("write", path=str(operator.docs / "escaped"), content="x")
        in_etc = await call("write", path="/etc/agentrt-escaped", content="x")
        in_root = await call("write", path="/escaped", content="x")
    for attempt in (beside, in_read_path, in_etc, in_root):
        assert not attempt["ok"], attempt
    assert list(operator.outside.iterdir()) == []
    assert sorted(path.name for path in operator.docs.iterdir()) == ["guide.md"]
    assert not Path("/etc/agentrt-escaped").exists()


async def test_a_sandboxed_server_cannot_see_its_parent_in_proc(operator: Operator) -> None:
    async with session(escaper(operator.sandbox())) as call:
        seen = (await call("whoami"))["value"]
        parent = await call("read", path=f"/proc/{os.getpid()}/environ")
    assert os.getpid() not in seen["proc"]
    assert seen["pid"] <= 3 and all(pid <= 3 for pid in seen["proc"])
    assert not parent["ok"]


async def test_a_sandboxed_server_cannot_connect_to_a_loopback_listener(
    operator: Operator, listener: Listener
) -> None:
    async with session(escaper(operator.sandbox())) as call:
        attempt = await call("connect", host="127.0.0.1", port=listener.port)
        by_name = await call("connect", host="localhost", port=listener.port)
    assert not attempt["ok"] and not by_name["ok"]
    assert not listener.saw_anyone()


async def test_network_true_shares_the_network(operator: Operator, listener: Listener) -> None:
    async with session(escaper(operator.sandbox(network=True))) as call:
        attempt = await call("connect", host="127.0.0.1", port=listener.port)
        secret = await call("read", path=str(operator.secret))
    assert attempt["ok"]
    assert listener.saw_anyone()
    assert not secret["ok"]


async def test_a_sandboxed_server_reads_and_writes_inside_its_paths(operator: Operator) -> None:
    async with session(escaper(operator.sandbox())) as call:
        read = await call("read", path=str(operator.docs / "guide.md"))
        written = await call("write", path=str(operator.work / "notes.md"), content="kept\n")
        in_home = await call("write", path=f"{PRIVATE_HOME}/scratch", content="gone")
        in_tmp = await call("write", path="/tmp/scratch", content="gone")
    assert read == {"ok": True, "value": "# the guide\n"}
    assert written["ok"] and (operator.work / "notes.md").read_text() == "kept\n"
    assert in_home["ok"] and in_tmp["ok"]
    assert not Path(PRIVATE_HOME, "scratch").exists()
    # The private HOME and /tmp vanish with the server: the next one starts empty.
    async with session(escaper(operator.sandbox())) as call:
        assert not (await call("read", path=f"{PRIVATE_HOME}/scratch"))["ok"]
        assert not (await call("read", path="/tmp/scratch"))["ok"]


async def test_etc_shadow_and_listed_secrets_are_hidden(operator: Operator) -> None:
    hidden = operator.docs / "token.txt"
    hidden.write_text("docs token")
    sandbox = operator.sandbox(hide=[str(hidden)])
    async with session(escaper(sandbox)) as call:
        shadow = await call("read", path="/etc/shadow")
        token = await call("read", path=str(hidden))
        passwd = await call("read", path="/etc/passwd")
    assert not shadow["ok"]
    assert not token["ok"]
    assert passwd["ok"]  # the rest of /etc is there, read-only


async def test_a_command_on_the_servers_path_brings_only_its_installation(
    operator: Operator, tmp_path: Path
) -> None:
    # A virtual environment with a console script, found on PATH by name: the
    # script, its `#!` interpreter, the venv and its base Python are bound; a
    # file beside the venv is not.
    venv = tmp_path / "tools" / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    script = venv / "bin" / "escaper-server"
    script.write_text(f"#!{venv / 'bin' / 'python'}\n" + ESCAPER.read_text())
    script.chmod(0o755)
    beside = tmp_path / "tools" / "token"
    beside.write_text("beside the venv")
    path = f"{venv / 'bin'}:{os.environ['PATH']}"
    server = Server(
        name="installed",
        command=["escaper-server"],
        env=[f"PATH={path}"],
        sandbox=operator.sandbox(),
    )
    async with session(server) as call:
        seen = await call("whoami")
        token = await call("read", path=str(beside))
        config = await call("read", path=str(venv / "pyvenv.cfg"))
    assert seen["ok"] and seen["value"]["pid"] <= 3
    assert not token["ok"]
    assert config["ok"]


async def test_a_command_in_home_bin_brings_only_itself_when_home_is_reached_through_a_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # HOME names a link to the real home (as when /home is a link), and the
    # server is ~/bin/escaper-server: HOME itself is no installation prefix, so
    # ~/lib beside it stays out whichever spelling of HOME the path uses.
    real_home = tmp_path / "real-home"
    (real_home / "bin").mkdir(parents=True)
    (real_home / "lib").mkdir()
    (real_home / "lib" / "token").write_text(SECRET)
    home = tmp_path / "home"
    home.symlink_to(real_home)
    monkeypatch.setenv("HOME", str(home))
    script = home / "bin" / "escaper-server"
    script.write_text(f"#!{sys.executable}\n" + ESCAPER.read_text())
    script.chmod(0o755)
    server = Server(name="in-home", command=[str(script)], sandbox=Sandbox())
    async with session(server) as call:
        seen = await call("whoami")
        token = await call("read", path=str(home / "lib" / "token"))
        real_token = await call("read", path=str(real_home / "lib" / "token"))
    assert seen["ok"]
    assert not token["ok"] and not real_token["ok"], (token, real_token)


@pytest.mark.parametrize("layout", ["shims", "bin"])
async def test_a_scripts_own_hash_bang_line_cannot_choose_directories_to_bind(
    operator: Operator, tmp_path: Path, layout: str
) -> None:
    # `python script.py` never runs the script's `#!` line, but the script's
    # author chose it: naming ~/.ssh/shims/python (or ~/.ssh/bin/python, an
    # interpreter that does not exist) must bind nothing of ~/.ssh.
    (operator.home / ".ssh" / "lib").mkdir()
    (operator.home / ".ssh" / "lib" / "copy").write_text(SECRET)
    script = tmp_path / "package" / "server.py"
    script.parent.mkdir()
    script.write_text(f"#!{operator.home / '.ssh' / layout / 'python'}\n" + ESCAPER.read_text())
    server = Server(name="chooser", command=[sys.executable, str(script)], sandbox=Sandbox())
    async with session(server) as call:
        seen = await call("whoami")
        key = await call("read", path=str(operator.secret))
        copy = await call("read", path=str(operator.home / ".ssh" / "lib" / "copy"))
    assert seen["ok"]
    assert not key["ok"] and not copy["ok"], (key, copy)
