"""A server with a sandbox never starts without it; Close and parent death still hold."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import anyio
import pytest
from sandbox_support import ESCAPER, SERVERS, alive, children_of, escaper, session

from agentrt.mcp import Sandbox
from agentrt.mcp import _sandbox as sandbox_module
from agentrt.mcp._connection import connect
from agentrt.mcp._connection_errors import MCPConnectionError
from agentrt.mcp._sandbox import sandbox_for_arguments

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]


async def test_without_bwrap_on_path_a_sandboxed_server_is_not_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "started"
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    server = escaper(Sandbox(write=[str(tmp_path)]), str(marker))
    with pytest.raises(MCPConnectionError) as caught:
        await connect(server)
    assert str(caught.value) == (
        'server "escaper" has a sandbox and was not started: bwrap was not found on PATH; '
        "install bubblewrap (Debian and Ubuntu: apt-get install bubblewrap)"
    )
    assert not marker.exists()
    # The same server without a sandbox starts and writes its marker: the refusal was the sandbox.
    async with session(escaper(None, str(marker))):
        pass
    assert marker.exists()


_REFUSED_NAMESPACES = textwrap.dedent(
    """
    import sys, anyio
    from agentrt.mcp import Sandbox
    from agentrt.mcp._connection import connect
    from agentrt.mcp._server import Server

    async def main():
        server = Server(
            name="escaper",
            command=[sys.executable, sys.argv[1], sys.argv[2]],
            sandbox=Sandbox(read=[sys.argv[3]], write=[sys.argv[4]]),
        )
        try:
            await connect(server)
        except Exception as exc:
            print(exc)
            return
        print("started")

    anyio.run(main)
    """
)


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs util-linux unshare")
def test_a_kernel_refusing_namespaces_refuses_the_server(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    # A user namespace whose limit on new user namespaces is 0: bwrap is refused for real.
    script = 'echo 0 > /proc/sys/user/max_user_namespaces && exec "$@"'
    limited = ["unshare", "--user", "--map-root-user", "sh", "-c", script, "sh"]
    child = [sys.executable, "-c", _REFUSED_NAMESPACES, str(ESCAPER), str(marker)]
    finished = subprocess.run(
        [*limited, *child, str(SERVERS), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if "Operation not permitted" in finished.stderr:
        pytest.skip("this kernel gives no user namespace to limit")
    said = finished.stdout.strip()
    assert said.startswith(
        'server "escaper" has a sandbox and was not started: the kernel refused bwrap its '
        "namespaces (bwrap: "
    ), finished
    assert "allow unprivileged user namespaces" in said
    assert not marker.exists()


async def test_a_missing_sandbox_path_refuses_the_server(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    server = escaper(Sandbox(write=[str(tmp_path / "absent")]), str(marker))
    with pytest.raises(MCPConnectionError) as caught:
        await connect(server)
    assert str(caught.value) == (
        f'server "escaper" has a sandbox and was not started: its sandbox write path '
        f"{tmp_path / 'absent'} does not exist"
    )
    assert not marker.exists()


async def test_on_macos_a_sandboxed_server_is_refused_not_run_bare(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "started"
    monkeypatch.setattr(sandbox_module.sys, "platform", "darwin")
    with pytest.raises(MCPConnectionError) as caught:
        await connect(escaper(Sandbox(write=[str(tmp_path)]), str(marker)))
    assert "sandboxes need Linux and bubblewrap, and this is darwin" in str(caught.value)
    assert not marker.exists()


def test_a_sandbox_refuses_relative_paths_and_unoffered_kinds() -> None:
    with pytest.raises(ValueError, match="'docs' is not an absolute path"):
        Sandbox(read=["docs"])
    with pytest.raises(ValueError, match="write path / would show the whole filesystem"):
        Sandbox(write=["/"])
    with pytest.raises(ValueError, match="home 'shared' is not offered"):
        Sandbox(home="shared")
    with pytest.raises(ValueError, match="devices 'all' is not offered"):
        Sandbox(devices="all")


async def test_close_kills_the_sandboxed_server_and_what_it_started(tmp_path: Path) -> None:
    connection = await connect(escaper(Sandbox(write=[str(tmp_path)])))
    bwrap = connection._transport.process.pid  # type: ignore[attr-defined]
    try:
        await connection.call_tool("spawn", "{}", timeout=20)
        inside = children_of(bwrap)
        assert len(inside) >= 3  # bwrap's init, the server, the server's child
    finally:
        await connection.aclose()
    assert not alive(bwrap)
    # The processes inside die with the namespace's init, which the kernel
    # signals when bwrap dies: asynchronously, so a loaded machine may take a
    # moment to finish them.
    deadline = time.monotonic() + 10
    while [pid for pid in inside if alive(pid)] and time.monotonic() < deadline:
        await anyio.sleep(0.05)
    assert not [pid for pid in inside if alive(pid)]


_PARENT = textwrap.dedent(
    """
    import sys, anyio
    from agentrt.mcp import Sandbox
    from agentrt.mcp._connection import connect
    from agentrt.mcp._server import Server

    async def main():
        server = Server(
            name="orphan",
            command=[sys.executable, sys.argv[1]],
            sandbox=Sandbox(read=[sys.argv[2]]),
        )
        connection = await connect(server)
        await connection.call_tool("spawn", "{}", timeout=20)
        print(connection._transport.process.pid, flush=True)
        await anyio.sleep(300)

    anyio.run(main)
    """
)


def test_the_sandboxed_server_dies_when_its_parent_is_killed() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT, str(ESCAPER), str(SERVERS)], stdout=subprocess.PIPE
    )
    inside: list[int] = []
    try:
        assert parent.stdout is not None
        bwrap = int(parent.stdout.readline())
        inside = [bwrap, *children_of(bwrap)]
        assert len(inside) >= 4
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(alive(pid) for pid in inside):
            time.sleep(0.05)
        assert not [pid for pid in inside if alive(pid)]
    finally:
        parent.kill()
        for pid in inside:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_sandbox_for_arguments_writes_named_directories_and_reads_named_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    data = tmp_path / "data"
    data.mkdir()
    config = tmp_path / "server.toml"
    config.write_text("")
    sandbox = sandbox_for_arguments(
        "node",
        ["index.js", str(data), f"--config={config}", "-y", str(tmp_path / "home"), "/", "text"],
    )
    assert sandbox == Sandbox(read=[str(config)], write=[str(data)], network=False)
