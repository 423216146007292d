"""What `agentrt.mcp` does where the Unix process modules do not exist (Windows).

The platform's process code lives in `_proc_linux`, `_proc_unix` and
`_proc_other`, chosen once by `_proc`; these tests hide `fcntl` and `termios`
as Windows lacks them and check that the package still imports and uses the
other platforms' code, and that that code does what its docstring says.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

from agentrt.mcp import Server, _proc, _proc_other
from agentrt.mcp._stdio import server_environment

_HIDDEN_IMPORT = textwrap.dedent(
    """
    import sys
    for name in ("fcntl", "termios"):
        sys.modules[name] = None  # `import name` now raises ImportError, as on Windows
    import agentrt, agentrt.mcp
    for package in (agentrt, agentrt.mcp):
        for name in package.__all__:
            getattr(package, name)  # the lazy names import their modules here
    import agentrt.mcp._stdio, agentrt.mcp._connection, agentrt.proxy, agentrt.cli
    from agentrt.mcp import _proc
    assert "fcntl" not in [m for m, v in sys.modules.items() if v is not None]
    print(_proc.kill_tree.__module__, _proc.unread_bytes.__module__)
    """
)


def test_agentrt_and_agentrt_mcp_import_where_fcntl_and_termios_do_not_exist() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _HIDDEN_IMPORT], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["agentrt.mcp._proc_other", "agentrt.mcp._proc_other"]


def test_here_the_unix_process_code_is_used() -> None:
    # The same selection with the modules present picks the Unix code (this suite runs on Linux).
    assert _proc.kill_tree.__module__ == "agentrt.mcp._proc_unix"
    assert _proc.NEW_SESSION is True
    assert _proc.parent_death_hook(1) is not None


def test_windows_servers_get_the_reference_runtimes_environment_list() -> None:
    assert _proc.base_variables("win32") == (
        "PATH", "PATHEXT", "SystemRoot", "SystemDrive", "ComSpec", "TEMP", "TMP",
        "USERPROFILE", "APPDATA", "LOCALAPPDATA", "HOME",
    )  # fmt: skip
    assert _proc.base_variables("linux") == ("PATH", "HOME", "TMPDIR")


def test_the_environment_a_server_gets_starts_from_this_platforms_list(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_proc, "BASE_VARIABLES", _proc.base_variables("win32"))
    monkeypatch.setenv("SystemRoot", r"C:\Windows")
    monkeypatch.setenv("TMPDIR", "/not-on-windows")
    environment = server_environment(Server(name="s", command=["x"]))
    assert environment["SystemRoot"] == r"C:\Windows"
    assert "TMPDIR" not in environment


def _wait_dead(process: subprocess.Popen[bytes]) -> int | None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return process.returncode
        time.sleep(0.02)
    return None


@pytest.mark.parametrize("end", [_proc_other.stop_tree, _proc_other.kill_tree])
def test_without_process_groups_a_server_itself_is_ended(end: object) -> None:
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert callable(end)
        end(process)
        assert _wait_dead(process) is not None
        end(process)  # a second time, on a process already gone: nothing raised
    finally:
        process.kill()
        process.wait()


def test_without_a_pipe_byte_count_the_stderr_tail_waits_for_nothing_it_cannot_see() -> None:
    read, write = os.pipe()
    try:
        os.write(write, b"abc")
        assert _proc_other.unread_bytes(read) == 0
        assert _proc.unread_bytes(read) == 3
    finally:
        os.close(read)
        os.close(write)
