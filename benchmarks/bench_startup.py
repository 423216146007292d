"""Benchmark 12 (issue 36, start-up): what a person waits on before the first call.

- Ready: from spawn to the answer to `tools/list`, the stock filesystem server
  behind `agentrt proxy` against the same server spawned directly, the two
  interleaved round by round (alternating which goes first) so the machine's
  load falls on both alike; the delta and the ratio of the p50s.  The proxy's
  own CPU time to ready is reported too: it holds up where wall time moves
  with everyone else's load.
- Memory: the proxy's resident set (VmRSS, and its peak VmHWM) after 100
  calls through it, with the bare interpreter's as this run's floor.
- The command: CPU time (user + system, from the kernel's accounting of the
  finished child) of `agentrt runs`, `show` and `approve` on the database
  those calls wrote, against `python -c pass` interleaved with them.

The host is a minimal one, newline-delimited JSON-RPC over pipes, so the
client's own start-up is not in the numbers.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, Final

import anyio
from _common import PYTHON, REPO, Result, cpu_seconds, log, private_file, rss_kib

from agentrt.mcp import Server, pin

FILESYSTEM_SERVER: Final = (
    REPO / "tests/npm/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js"
)
# Ready at once (~20 ms): behind the proxy it shows the proxy's own start-up, which the
# filesystem server's boot on Node partly hides.
INSTANT_SERVER: Final = REPO / "benchmarks/_instant_server.py"
AGENTRT: Final = Path(PYTHON).with_name("agentrt")
CALLS: Final = 100
_INITIALIZE: Final = {
    "protocolVersion": "2025-06-18",
    "capabilities": {},
    "clientInfo": {"name": "bench-startup", "version": "1"},
}

_ACKNOWLEDGED: Final = "notifications/subscriptions/acknowledged"
_ENVELOPE_2026: Final = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientInfo": {"name": "bench-startup", "version": "1"},
    "io.modelcontextprotocol/clientCapabilities": {},
}


class Host:
    """A host over a process's stdin and stdout, as a desktop host starts a server."""

    def __init__(self, command: list[str], cwd: Path) -> None:
        self.began = time.perf_counter()
        self.process = subprocess.Popen(
            command,
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=_environment(),
        )
        self.next_id = 0

    def request(self, method: str, params: dict[str, Any]) -> Any:
        self.next_id += 1
        self._send({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        answer = self._until(lambda message: message.get("id") == self.next_id, method)
        if "error" in answer:
            raise RuntimeError(f"{method} failed: {answer['error']}")
        return answer["result"]

    def _until(self, wanted: Callable[[dict[str, Any]], bool], what: str = "") -> Any:
        """The first message the server writes that is `wanted` (the others skipped)."""
        stdout = self._stdout()
        while True:
            line = stdout.readline()
            if not line:
                raise RuntimeError(f"the server exited before answering {what}")
            message = json.loads(line)
            if wanted(message):
                return message

    def notify(self, method: str) -> None:
        self._send({"jsonrpc": "2.0", "method": method})

    def ready(self) -> tuple[float, list[str]]:
        """Seconds from spawn to the tools/list answer, and the tools listed."""
        self.request("initialize", _INITIALIZE)
        self.notify("notifications/initialized")
        tools = [tool["name"] for tool in self.request("tools/list", {})["tools"]]
        return time.perf_counter() - self.began, tools

    def ready_2026(self) -> tuple[float, list[str]]:
        """The same for a host of the 2026-07-28 era, as Claude Code opens a server:
        `server/discover`, a `subscriptions/listen` stream for the lists changing (its
        acknowledgement awaited), then the prompt, resource and tool listings, each
        request carrying its envelope."""
        envelope = {"_meta": _ENVELOPE_2026}
        self.request("server/discover", envelope)
        self.next_id += 1
        kinds = {"toolsListChanged": True, "promptsListChanged": True,
                 "resourcesListChanged": True}  # fmt: skip
        self._send({"jsonrpc": "2.0", "id": self.next_id, "method": "subscriptions/listen",
                    "params": {"notifications": kinds, **envelope}})  # fmt: skip
        self._until(lambda message: message.get("method") == _ACKNOWLEDGED)
        self.request("prompts/list", envelope)
        self.request("resources/list", envelope)
        tools = [tool["name"] for tool in self.request("tools/list", envelope)["tools"]]
        return time.perf_counter() - self.began, tools

    def close(self) -> None:
        stdin = self.process.stdin
        if stdin is not None:
            stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def _send(self, message: dict[str, Any]) -> None:
        stdin = self.process.stdin
        if stdin is None:
            raise RuntimeError("the server's stdin is closed")
        stdin.write(json.dumps(message).encode() + b"\n")
        stdin.flush()

    def _stdout(self) -> IO[bytes]:
        if self.process.stdout is None:
            raise RuntimeError("the server's stdout is closed")
        return self.process.stdout


def _environment() -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp")}


def _setup(root: Path) -> tuple[list[str], Path]:
    """The filesystem server's command, and a proxy configuration serving it."""
    data = root / "data"
    data.mkdir()
    (data / "note.txt").write_text("hello from the start-up benchmark\n")
    server_command = ["node", str(FILESYSTEM_SERVER), str(data)]
    manifest = anyio.run(lambda: pin(Server(name="fs", command=server_command)))
    private_file(root / "conf" / "fs.manifest.json", manifest.to_json())
    rules = json.loads((REPO / "examples/filesystem/rules.json").read_text())
    document = {
        "database": "proxy.db",
        "session": "bench-startup",
        # Writes wait for an operator, so `agentrt approve` has approvals to decide.
        "policy": {"read_only": "allow", "local_mutation": "require_approval"},
        "hold": "0s",
        "servers": [
            {"name": "fs", "command": server_command, "manifest": "fs.manifest.json",
             "rules": rules},
        ],
    }  # fmt: skip
    return server_command, private_file(root / "conf" / "proxy.json", json.dumps(document))


def _setup_instant(root: Path) -> tuple[list[str], Path]:
    """The instant server's command (the system's Python, isolated, no site), and a proxy
    configuration serving it."""
    root.mkdir()
    server_command = [sys.executable, "-I", "-S", str(INSTANT_SERVER)]
    manifest = anyio.run(lambda: pin(Server(name="instant", command=server_command)))
    private_file(root / "conf" / "instant.manifest.json", manifest.to_json())
    document = {
        "database": "proxy.db",
        "session": "bench-startup",
        "policy": {"read_only": "allow"},
        "hold": "0s",
        "servers": [
            {"name": "instant", "command": server_command, "manifest": "instant.manifest.json",
             "rules": {"echo": {"side_effect": "read_only", "timeout": "10s"}}},
        ],
    }  # fmt: skip
    return server_command, private_file(root / "conf" / "proxy.json", json.dumps(document))


def _warm_up(config: Path, root: Path) -> None:
    """The first start creates the database; every measured start opens it."""
    host = Host(_proxy_command(config), root)
    try:
        host.ready()
    finally:
        host.close()


def _proxy_command(config: Path) -> list[str]:
    return [str(AGENTRT), "proxy", "--config", str(config)]


def _ready_rounds(
    server_command: list[str], config: Path, root: Path, rounds: int, era_2026: bool = False
) -> dict[str, Any]:
    """Ready times of the raw server and the proxy, interleaved, alternating the order
    (`era_2026`: the proxy's host opens in the 2026-07-28 era; the raw server, which
    speaks only the handshake era, is its baseline either way)."""
    samples: dict[str, list[float]] = {"direct": [], "agentrt": []}
    proxy_cpu: list[float] = []
    commands = {"direct": server_command, "agentrt": _proxy_command(config)}
    listed: dict[str, list[str]] = {}
    for round_index in range(rounds):
        order = ["direct", "agentrt"] if round_index % 2 == 0 else ["agentrt", "direct"]
        for name in order:
            host = Host(commands[name], root)
            try:
                modern = era_2026 and name == "agentrt"
                seconds, tools = host.ready_2026() if modern else host.ready()
                if name == "agentrt":
                    proxy_cpu.append(cpu_seconds(host.process.pid))
            finally:
                host.close()
            samples[name].append(seconds)
            listed[name] = tools
    direct, proxied = statistics.median(samples["direct"]), statistics.median(samples["agentrt"])
    return {
        "direct_s": samples["direct"],
        "agentrt_s": samples["agentrt"],
        "direct_p50_s": direct,
        "agentrt_p50_s": proxied,
        "delta_p50_s": proxied - direct,
        "ratio_p50": proxied / direct,
        "agentrt_cpu_to_ready_s": proxy_cpu,
        "agentrt_cpu_to_ready_p50_s": statistics.median(proxy_cpu),
        # The proxy offers the tools its rules name, and gate_status.
        "tools_listed": {name: len(tools) for name, tools in listed.items()},
    }


def _memory_after_calls(config: Path, root: Path, pending: int) -> dict[str, Any]:
    """The proxy's resident set after CALLS reads, then `pending` writes left for approval."""
    host = Host(_proxy_command(config), root)
    try:
        _, tools = host.ready()
        read = next(name for name in tools if name.endswith("read_text_file"))
        write = next(name for name in tools if name.endswith("write_file"))
        note = str(root / "data" / "note.txt")
        for _ in range(CALLS):
            result = host.request("tools/call", {"name": read, "arguments": {"path": note}})
            if result.get("isError"):
                raise RuntimeError(f"a read through the proxy failed: {result}")
        memory = rss_kib(host.process.pid)
        for index in range(pending):
            path = str(root / "data" / f"written-{index}.txt")
            arguments = {"path": path, "content": "x"}
            answer = host.request("tools/call", {"name": write, "arguments": arguments})
            if not answer["content"][0]["text"].startswith("PENDING_APPROVAL"):
                raise RuntimeError(f"a write was not held for approval: {answer}")
    finally:
        host.close()
    floor = subprocess.Popen([PYTHON, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        time.sleep(0.2)
        bare = rss_kib(floor.pid)
    finally:
        floor.communicate(b"")
    return {
        "calls": CALLS,
        "proxy_rss_kib": memory["VmRSS"],
        "proxy_peak_kib": memory["VmHWM"],
        "interpreter_rss_kib": bare["VmRSS"],
    }


def _child_cpu(command: list[str], check: bool = True) -> float:
    """User + system CPU seconds of one run of `command`, from the kernel's accounting."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    finished = subprocess.run(command, capture_output=True, timeout=120, env=_environment())
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if check and finished.returncode != 0:
        raise RuntimeError(f"{command[1:]} failed: {finished.stderr.decode()[-500:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _command_cpu(database: Path, rounds: int) -> dict[str, Any]:
    """CPU of `runs`, `show` and `approve` against `python -c pass`, interleaved."""
    base = [str(AGENTRT), "--db", str(database)]
    listing = subprocess.run(
        [*base, "--json", "runs"], capture_output=True, text=True, timeout=120, check=True
    ).stdout.splitlines()
    waiting = [
        (record["run_id"], record["waiting_approval"])
        for record in map(json.loads, listing)
        if record.get("record") == "run" and record.get("waiting_approval")
    ]
    if len(waiting) < rounds:
        raise RuntimeError(f"{rounds} approvals were to be waiting, found {len(waiting)}")
    samples: dict[str, list[float]] = {"python": [], "runs": [], "show": [], "approve": []}
    commands: dict[str, Callable[[int], list[str]]] = {
        "python": lambda _: [PYTHON, "-c", "pass"],
        "runs": lambda _: [*base, "runs"],
        "show": lambda index: [*base, "show", waiting[index][0]],
        "approve": lambda index: [*base, "approve", waiting[index][0], "--approval",
                                  waiting[index][1]],
    }  # fmt: skip
    for index in range(rounds):
        for name, command in commands.items():
            samples[name].append(_child_cpu(command(index)))
    p50 = {name: statistics.median(values) for name, values in samples.items()}
    return {
        "cpu_s": samples,
        "cpu_p50_s": p50,
        "minus_interpreter_p50_s": {
            name: p50[name] - p50["python"] for name in ("runs", "show", "approve")
        },
    }


def run(quick: bool) -> Result:
    rounds = 3 if quick else 7
    if not FILESYSTEM_SERVER.exists():
        return {"skipped": f"the filesystem server is not installed ({FILESYSTEM_SERVER})"}
    with tempfile.TemporaryDirectory(prefix="agentrt-bench-startup-") as directory:
        root = Path(directory)
        server_command, config = _setup(root)
        _warm_up(config, root)
        log(f"start-up: ready after spawn, raw server and proxy interleaved, {rounds} rounds")
        ready = _ready_rounds(server_command, config, root, rounds)
        log(f"start-up: the same for a host of the 2026-07-28 era, {rounds} rounds")
        ready_2026 = _ready_rounds(server_command, config, root, rounds, era_2026=True)
        log(f"start-up: the same with a server ready at once, both eras, {rounds} rounds")
        instant_command, instant_config = _setup_instant(root / "instant")
        _warm_up(instant_config, root / "instant")
        instant = _ready_rounds(instant_command, instant_config, root / "instant", rounds)
        instant_2026 = _ready_rounds(
            instant_command, instant_config, root / "instant", rounds, era_2026=True
        )
        log(f"start-up: resident memory after {CALLS} calls")
        # The gate lets at most 5 approvals wait at once (issue 33's bound).
        decided = min(rounds, 5)
        memory = _memory_after_calls(config, root, decided)
        log("start-up: CPU time of agentrt runs / show / approve")
        commands = _command_cpu(root / "conf" / "proxy.db", decided)
    return {
        "rounds": rounds,
        "ready": ready,
        "ready_2026": ready_2026,
        "instant": instant,
        "instant_2026": instant_2026,
        "memory": memory,
        "commands": commands,
    }
