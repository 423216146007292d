"""The host's stdio wire: descriptors given back as found, a host that stops reading, and
arguments the host's JSON parser accepted but the gate cannot."""

from __future__ import annotations

import json
import os
import signal
import tty
from pathlib import Path
from typing import Any

import anyio
import pytest
from proxy_helpers import RULES, RawHost, build_setup, until

from agentrt.store import open_store

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(90)]

SLOW_RULES: dict[str, Any] = {
    **RULES,
    "write_note": {"side_effect": "local_mutation", "timeout": "30s"},
}

_INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "descriptor-host", "version": "0"},
    },
}


def result_text(response: dict[str, Any]) -> str:
    return "".join(block.get("text", "") for block in response["result"]["content"])


async def _read_line(fd: int) -> bytes:
    buffer = b""
    with anyio.fail_after(30):
        while not buffer.endswith(b"\n"):
            await anyio.wait_readable(fd)
            chunk = os.read(fd, 65536)
            if not chunk:
                raise EOFError("the proxy closed its output")
            buffer += chunk
    return buffer


@pytest.mark.parametrize("wire", ["pipes", "terminal"])
async def test_the_proxy_gives_its_stdin_and_stdout_back_blocking(
    tmp_path: Path, wire: str
) -> None:
    setup = await build_setup(tmp_path)
    if wire == "pipes":
        stdin_read, stdin_write = os.pipe()
        stdout_read, stdout_write = os.pipe()
        given = (stdin_read, stdout_write)
        host_in, host_out = stdout_read, stdin_write
    else:
        # A terminal: stdin and stdout are one open file description, as in a shell.
        master, slave = os.openpty()
        tty.setraw(slave)
        given = (slave, slave)
        host_in, host_out = master, master
    opened = {*given, host_in, host_out}
    try:
        assert all(os.get_blocking(fd) for fd in given)
        with setup.stderr_path.open("a") as errlog:
            process = await anyio.open_process(
                setup.command(),
                stdin=given[0],
                stdout=given[1],
                stderr=errlog,
                env=setup.environment(),
                cwd=str(setup.root),
            )
            try:
                os.write(host_out, json.dumps(_INITIALIZE).encode() + b"\n")
                answer = json.loads(await _read_line(host_in))
                assert answer["id"] == 1 and "result" in answer
                # The proxy is serving on the wire now.
                if wire == "pipes":
                    os.close(stdin_write)
                    opened.discard(stdin_write)
                else:
                    process.send_signal(signal.SIGTERM)
                with anyio.fail_after(30):
                    code = await process.wait()
            finally:
                if process.returncode is None:
                    process.kill()
                    await process.wait()
        assert code == 0
        assert [os.get_blocking(fd) for fd in given] == [True, True]
    finally:
        for fd in opened:
            os.close(fd)


async def test_a_host_that_stops_reading_stalls_only_its_replies_not_the_proxy(
    tmp_path: Path,
) -> None:
    setup = await build_setup(tmp_path, rules=SLOW_RULES)
    # 24 answers of 50,000 characters: far more than the pipe and the host's buffer hold.
    texts = [f"{n:02d}" + chr(ord("a") + n) * 49_998 for n in range(24)]
    async with RawHost.start(setup) as stalled, RawHost.start(setup) as other:
        slow = await stalled.call("up_write_note", {"note": "held", "seconds": 6})
        await until(lambda: len(setup.started()) == 1)
        echoes = {await stalled.call("up_echo", {"text": text}): text for text in texts}
        # The host reads nothing for longer than a hold lives (lease_ttl 2s). A proxy
        # blocked in a write would stop renewing the hold, and this second proxy would
        # take the call over as if its process were dead.
        await anyio.sleep(3.0)
        second = await other.request(
            "tools/call", {"name": "up_write_note", "arguments": {"note": "held", "seconds": 6}}
        )
        assert result_text(second).startswith("IN_PROGRESS: ")
        with anyio.fail_after(30):
            answers = await stalled.responses({slow, *echoes})
    assert result_text(answers[slow]) == "noted held"
    for request_id, text in echoes.items():
        assert answers[request_id]["result"]["isError"] is False
        assert result_text(answers[request_id]) == text
    assert setup.executions("write_note") == ["write_note held"]


@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        ("up_echo", '{"text": NaN}'),
        ("up_write_note", '{"note": "n", "seconds": 1e400}'),
        ("up_write_note", '{"note": "n", "seconds": -Infinity}'),
    ],
)
async def test_arguments_the_gate_cannot_take_are_answered_invalid_and_the_proxy_serves_on(
    tmp_path: Path, tool: str, arguments: str
) -> None:
    setup = await build_setup(tmp_path)
    async with RawHost.start(setup) as raw:
        line = (
            '{"jsonrpc": "2.0", "id": 900, "method": "tools/call", '
            f'"params": {{"name": "{tool}", "arguments": {arguments}}}}}\n'
        )
        await raw.process.stdin.send(line.encode())
        refused = await raw.response(900)
        after = await raw.request(
            "tools/call", {"name": "up_echo", "arguments": {"text": "still serving"}}
        )
    text = result_text(refused)
    assert text.startswith("INVALID: ")
    assert refused["result"]["isError"] is True
    assert "not JSON the gate accepts" in text
    assert "NaN and infinities are not JSON numbers" in text
    assert result_text(after) == "still serving"
    assert setup.executions() == []
    assert "was refused before the gate" in setup.stderr()
    with open_store(setup.database, read_only=True) as store:
        # Only the echo that followed made a run; the refused call made none.
        assert len(store.list_runs(limit=100)) == 1
