"""A stdio server gets as little of this process as it needs, and nothing it starts outlives it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import anyio
import pytest
from servers.harness import (
    HOSTILE_STDIO,
    kill_quietly,
    process_gone,
    read_json,
    stdio_server,
    wait_until,
)

from agentrt.mcp import _stdio
from agentrt.mcp._connection import Connection, connect
from agentrt.mcp._connection_errors import ConnectionClosed, MCPConnectionError
from agentrt.mcp._server import Server

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


@pytest.fixture
def short_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    """Shorten the polite-shutdown waits so a stubborn server costs a second, not four."""
    monkeypatch.setattr(_stdio, "GRACE_AFTER_STDIN_CLOSED", 0.3)
    monkeypatch.setattr(_stdio, "GRACE_AFTER_SIGTERM", 0.3)


async def _environment_of(server: Server) -> dict[str, str]:
    connection = await connect(server)
    try:
        result = await connection.call_tool("env", "{}", timeout=5)
    finally:
        await connection.aclose()
    environment: dict[str, str] = result["structuredContent"]
    return environment


async def test_stdio_server_gets_only_path_home_tmpdir_and_what_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret-of-the-operator")
    monkeypatch.setenv("AGENTRT_TEST_TOKEN", "token-for-the-server")
    monkeypatch.setenv("AGENTRT_TEST_UNNAMED", "not-for-the-server")
    monkeypatch.setenv("HOME", "/home/operator")
    monkeypatch.setenv("TMPDIR", "/tmp/operator")
    server = stdio_server(
        inherit_env=["AGENTRT_TEST_TOKEN", "AGENTRT_TEST_NOT_SET"],
        env=["TICKETS_REGION=eu", "EMPTY="],
    )
    environment = await _environment_of(server)
    assert environment == {
        "PATH": os.environ["PATH"],
        "HOME": "/home/operator",
        "TMPDIR": "/tmp/operator",
        "AGENTRT_TEST_TOKEN": "token-for-the-server",
        "TICKETS_REGION": "eu",
        "EMPTY": "",
    }


async def test_unset_base_variables_are_not_invented(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TMPDIR", raising=False)
    monkeypatch.delenv("HOME", raising=False)
    environment = await _environment_of(stdio_server())
    assert environment == {"PATH": os.environ["PATH"]}


async def test_proxy_variables_reach_the_server_only_when_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "MCPGODEBUG"):
        monkeypatch.setenv(name, f"value-of-{name}")
    unnamed = await _environment_of(stdio_server())
    assert not {"HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "MCPGODEBUG"} & set(unnamed)
    named = await _environment_of(stdio_server(inherit_env=["HTTPS_PROXY"]))
    assert named["HTTPS_PROXY"] == "value-of-HTTPS_PROXY"
    assert "HTTP_PROXY" not in named


async def test_a_later_environment_entry_replaces_an_earlier_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HOME", "/home/operator")
    monkeypatch.setenv("AGENTRT_TEST_TOKEN", "inherited")
    server = stdio_server(
        inherit_env=["AGENTRT_TEST_TOKEN"],
        env=["HOME=/srv/tickets", "AGENTRT_TEST_TOKEN=written", "AGENTRT_TEST_TOKEN=last"],
    )
    environment = await _environment_of(server)
    assert environment["HOME"] == "/srv/tickets"
    assert environment["AGENTRT_TEST_TOKEN"] == "last"


async def test_stdio_server_runs_in_its_own_process_group(tmp_path: Path) -> None:
    connection = await connect(stdio_server())
    try:
        result = await connection.call_tool("pid", "{}", timeout=5)
    finally:
        await connection.aclose()
    ids = result["structuredContent"]
    assert ids["pgid"] == ids["pid"]
    assert ids["pgid"] != os.getpgid(0)


async def test_close_kills_the_group_even_after_the_server_exited_cleanly(
    tmp_path: Path,
) -> None:
    grandchild_file = tmp_path / "grandchild"
    pidfile = tmp_path / "pid"
    server = stdio_server({"grandchild": str(grandchild_file), "pidfile": str(pidfile)})
    connection = await connect(server)
    grandchild = int(read_json(grandchild_file))
    server_pid = read_json(pidfile)["pid"]
    try:
        assert not process_gone(grandchild)
        await connection.aclose()
        # The server exits by itself on end of stdin; its grandchild must not survive it.
        assert wait_until(lambda: process_gone(grandchild), 5)
        assert process_gone(server_pid)
    finally:
        kill_quietly(grandchild)


async def test_a_server_ignoring_sigterm_and_eof_is_killed(
    tmp_path: Path, short_grace: None
) -> None:
    pidfile = tmp_path / "pid"
    server = stdio_server({"ignore_sigterm": True, "ignore_eof": True, "pidfile": str(pidfile)})
    connection = await connect(server)
    pid = read_json(pidfile)["pid"]
    try:
        await connection.aclose()
        assert process_gone(pid)
    finally:
        kill_quietly(pid)


async def test_an_impolite_close_cuts_a_polite_close_under_way_short(tmp_path: Path) -> None:
    # The default graces (2 s after stdin's end, 2 s after SIGTERM): a stubborn server
    # would hold a polite close for 4 s, past the grace a host gives the proxy.
    pidfile = tmp_path / "pid"
    server = stdio_server({"ignore_sigterm": True, "ignore_eof": True, "pidfile": str(pidfile)})
    connection = await connect(server)
    pid = read_json(pidfile)["pid"]
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(connection.aclose)
            await anyio.sleep(0.1)
            started = anyio.current_time()
            await connection.aclose(polite=False)
            assert process_gone(pid)
        assert anyio.current_time() - started < 1.0
    finally:
        kill_quietly(pid)


async def test_concurrent_close_from_several_tasks_stops_the_server_once(
    tmp_path: Path, short_grace: None
) -> None:
    pidfile = tmp_path / "pid"
    server = stdio_server({"ignore_sigterm": True, "ignore_eof": True, "pidfile": str(pidfile)})
    connection = await connect(server)
    pid = read_json(pidfile)["pid"]
    finished: list[int] = []

    async def close(index: int) -> None:
        await connection.aclose()
        finished.append(index)
        assert process_gone(pid)

    try:
        async with anyio.create_task_group() as group:
            for index in range(5):
                group.start_soon(close, index)
        assert sorted(finished) == [0, 1, 2, 3, 4]
        await connection.aclose()  # and once more, after the fact
    finally:
        kill_quietly(pid)


async def test_close_during_an_in_flight_call_raises_connection_closed(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    server = stdio_server({"calls": {"hang": {"never": True}}, "pidfile": str(pidfile)})
    connection = await connect(server)
    errors: list[BaseException] = []

    async def call() -> None:
        try:
            await connection.call_tool("hang", "{}", timeout=30)
        except ConnectionClosed as exc:
            errors.append(exc)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            group.start_soon(call)
            await anyio.sleep(0.2)
            await connection.aclose()
    assert len(errors) == 1
    assert 'the connection to server "hostile" is closed' in str(errors[0])
    assert process_gone(read_json(pidfile)["pid"])
    with pytest.raises(ConnectionClosed):
        await connection.call_tool("ok", "{}", timeout=5)


async def test_a_server_that_dies_says_why_in_the_connect_error() -> None:
    server = stdio_server({"stderr": "TICKETS_TOKEN is not set\x1b[2J\u202e\n", "exit_at_start": 3})
    with pytest.raises(MCPConnectionError) as caught:
        await connect(server)
    message = str(caught.value)
    assert 'server "hostile"' in message
    assert "the server's stderr ends with: TICKETS_TOKEN is not set\\x1b[2J\\u202e" in message
    assert "\x1b" not in message and "\u202e" not in message


async def test_stderr_tail_keeps_only_the_last_few_kib(tmp_path: Path) -> None:
    noise = "n" * 10_000 + "the real reason\n"
    with pytest.raises(MCPConnectionError) as caught:
        await connect(stdio_server({"stderr": noise, "exit_at_start": 1}))
    tail = str(caught.value).partition("stderr ends with: ")[2]
    assert tail.endswith("the real reason")
    assert len(tail) <= _stdio.STDERR_TAIL_BYTES


async def test_stderr_goes_to_the_given_file_and_is_not_kept(tmp_path: Path) -> None:
    log_path = tmp_path / "server.stderr"
    with log_path.open("wb") as stderr_file:
        connection = await connect(stdio_server({"stderr": "hello operator\n"}, stderr=stderr_file))
        await connection.aclose()
    assert connection.stderr_tail() == ""
    assert log_path.read_text() == "hello operator\n"


async def test_a_server_that_never_answers_the_handshake_is_cleaned_up(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    server = stdio_server(
        {"initialize": {"never": True}, "pidfile": str(pidfile), "stderr": "waiting...\n"}
    )
    steps: list[str] = []
    started: list[Connection] = []
    with pytest.raises(TimeoutError), anyio.fail_after(1.0):
        await connect(server, on_step=steps.append, on_started=started.append)
    assert steps[-1] == "performing the handshake"
    assert process_gone(read_json(pidfile)["pid"])
    # The caller can still say why, after its own deadline fired.
    assert started[0].stderr_tail() == "waiting..."


async def test_a_missing_command_is_an_error_naming_it() -> None:
    server = Server(name="tickets", command=["/nonexistent/tickets-mcp-server"])
    with pytest.raises(MCPConnectionError) as caught:
        await connect(server)
    assert str(caught.value) == (
        'server "tickets" could not be started: /nonexistent/tickets-mcp-server: '
        "No such file or directory"
    )


_PARENT = textwrap.dedent(
    """
    import sys, anyio
    from agentrt.mcp._connection import connect
    from agentrt.mcp._server import Server

    async def main():
        server = Server(name="orphan", command=[sys.executable, sys.argv[1], sys.argv[2]])
        await connect(server)
        print("connected", flush=True)
        await anyio.sleep(300)

    anyio.run(main)
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal is Linux")
def test_the_server_dies_when_its_parent_is_killed(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    scenario = f'{{"pidfile": "{pidfile}", "ignore_eof": true, "ignore_sigterm": true}}'
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT, str(HOSTILE_STDIO), scenario],
        stdout=subprocess.PIPE,
    )
    server_pid = None
    try:
        assert parent.stdout is not None
        assert parent.stdout.readline() == b"connected\n"
        server_pid = read_json(pidfile)["pid"]
        assert not process_gone(server_pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        # The server ignores SIGTERM and end of stdin; only the kernel's SIGKILL ends it.
        assert wait_until(lambda: process_gone(server_pid), 5)
    finally:
        parent.kill()
        if server_pid is not None:
            kill_quietly(server_pid)


async def test_a_server_flooding_stderr_never_blocks_and_only_the_tail_is_kept() -> None:
    connection = await connect(stdio_server({"stderr_flood": 1_000_000}))
    try:
        with anyio.fail_after(10):
            assert await connection.list_tools()
            assert wait_until(lambda: connection.stderr_tail().endswith("flood over"), 5)
    finally:
        await connection.aclose()
    # The tail is 4 KiB of what the server wrote; escaping (\x0a) may lengthen the text.
    tail = connection.stderr_tail().replace("\\x0a", "\n")
    assert len(tail) + len("\n") == _stdio.STDERR_TAIL_BYTES  # the last newline is stripped
    assert tail.startswith("eeee")


async def test_connections_leave_no_descriptors_threads_or_children_behind() -> None:
    async def open_and_close() -> None:
        connection = await connect(stdio_server())
        await connection.call_tool("ok", "{}", timeout=5)
        await connection.aclose()

    await open_and_close()  # warm up: worker threads and imports that stay by design
    descriptors = len(os.listdir("/proc/self/fd"))
    threads = {thread.ident for thread in threading.enumerate()}
    for _ in range(10):
        await open_and_close()
    # None more than before (a leak); one fewer was seen once in a loaded full run, a
    # descriptor an earlier test of the worker left to the garbage collector.
    assert len(os.listdir("/proc/self/fd")) <= descriptors
    assert {thread.ident for thread in threading.enumerate()} <= threads | _worker_threads()
    assert not _children()


def _worker_threads() -> set[int | None]:
    # anyio keeps idle worker threads for a while; they are not ours to count.
    return {
        thread.ident for thread in threading.enumerate() if thread.name.startswith("AnyIO worker")
    }


def _children() -> list[str]:
    children = Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children")
    return children.read_text().split() if children.exists() else []
