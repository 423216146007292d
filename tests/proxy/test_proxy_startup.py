"""A proxy serving stdio with a default configuration loads only what serving needs (issue 36):
what is configured elsewhere (the inbox, conditions, telemetry, PostgreSQL, HTTP) and
what the proxy never uses (the agent driver, the model providers) stays unimported."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from proxy_helpers import (
    RULES,
    ProxySetup,
    RawHost,
    build_setup,
    conformance_config,
    host_environment,
    until,
)

from agentrt.store import GrantLimits, grant_limits, open_store

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

# Each is imported only when the configuration asks for it, or never by the proxy.
NOT_FOR_A_DEFAULT_STDIO_PROXY = (
    "agentrt.inbox._app",  # the inbox: only with "inbox" configured
    "agentrt.inbox._serve",
    "jinja2",
    "celpy",  # the conditions engine: only with a rule's "when"
    "opentelemetry.sdk",  # telemetry: only with an OTLP endpoint
    "agentrt.telemetry._exporter",  # its settings read, and found off
    "agentrt.export",
    "agentrt.proxy._notify",  # notifications: only with "notify" configured
    "agentrt._postgres",  # PostgreSQL: only with a postgresql:// database
    "psycopg",
    "agentrt.proxy._http",  # streamable HTTP: only with --http
    "agentrt.proxy._streamable",
    "agentrt.driver",  # the agent loop and its models: never the proxy's
    "agentrt.providers",
    # The MCP SDK itself (`mcp/__init__` loads its client, server, FastMCP, starlette and
    # uvicorn): the stdio front answers a host that only lists and calls (decision 0043).
    "mcp",
    "mcp.server",
    "mcp.server.lowlevel",
    "mcp.shared",
    "mcp.client",
    "starlette",
    "uvicorn",
    "sse_starlette",
    # The 2026-07-28 era's wire types: only for a host of that era (decision 0052).
    "mcp_types.methods",
    "mcp_types._v2026_07_28",
    # The protocol's pydantic models: the front reads, checks and shapes a handshake-era
    # host's messages in plain JSON, and asks the models only what that cannot decide
    # (`_plain`, decision 0061).
    "mcp_types",
    "pydantic",
    "pydantic_core",
    "httpx2",  # the HTTP client: only for a server over HTTP
    # JSON Schema's validators: the servers' 2020-12 schemas are proven valid, and the
    # calls' arguments checked, without them; only a draft or a value that needs them
    # imports them (`agentrt.schema`).
    "jsonschema",
    "referencing",
    "regex",
    # The installed distribution's metadata: the version is read from `agentrt._version`.
    "importlib.metadata",
    "email",
)

# The call path: the gate, the ledger and the calls' modules, imported at the first call
# (or warmed just after the first listing), never before the first listing is answered
# (decision 0066).  Each is imported by the end, so a misspelled name fails the test.
CALL_PATH_MODULES = (
    "agentrt.proxy._call_path",
    "agentrt.gate",
    "agentrt.gate._leases",
    "agentrt.gate._resuming",
    "agentrt.gate._reconcile",
    "agentrt.gate._preconditions",
    "agentrt.gate._values",
    "agentrt.store.ledger",
    "agentrt.proxy._calls",
    "agentrt.proxy._client_requests",
    "agentrt.proxy._preconditions",
    "agentrt.proxy._grants",
    "agentrt.proxy._conditions",
)

_PROBE = """
import json, sys
from agentrt.proxy import _handlers
from agentrt.proxy.__main__ import main
at_listing = []
listing = _handlers.Handlers._list_tools
async def first_listing(self, ctx, params):
    if not at_listing:
        at_listing.append(sorted(name for name in CALL_PATH if name in sys.modules))
    return await listing(self, ctx, params)
_handlers.Handlers._list_tools = first_listing
try:
    status = main(sys.argv[1:])
finally:
    loaded = sorted(name for name in NAMES if name in sys.modules)
    print("LOADED " + json.dumps(loaded), file=sys.stderr, flush=True)
    print("AT-LISTING " + json.dumps(at_listing), file=sys.stderr, flush=True)
    at_end = sorted(name for name in CALL_PATH if name in sys.modules)
    print("CALL-PATH " + json.dumps(at_end), file=sys.stderr, flush=True)
sys.exit(status)
""".replace("CALL_PATH", repr(CALL_PATH_MODULES))


def _assert_the_call_path_came_after_the_listing(stderr: str) -> None:
    """None of the call path's modules was loaded when the first listing was asked for,
    and every one was by the end, once a call had been made."""
    lines = stderr.splitlines()
    at_listing = [line for line in lines if line.startswith("AT-LISTING ")]
    at_end = [line for line in lines if line.startswith("CALL-PATH ")]
    assert at_listing and at_end, stderr
    assert json.loads(at_listing[-1].removeprefix("AT-LISTING ")) == [[]]
    assert json.loads(at_end[-1].removeprefix("CALL-PATH ")) == sorted(CALL_PATH_MODULES)


async def test_a_default_stdio_proxy_does_not_import_what_it_does_not_serve(
    tmp_path: Path,
) -> None:
    setup = await build_setup(tmp_path)
    probe = _PROBE.replace("NAMES", repr(NOT_FOR_A_DEFAULT_STDIO_PROXY))
    parameters = StdioServerParameters(
        command=sys.executable,
        args=["-c", probe, "--config", str(setup.config_path)],
        env=host_environment(),
        cwd=str(setup.root),
    )
    with setup.stderr_path.open("a") as errlog:
        async with (
            stdio_client(parameters, errlog=errlog) as (read_stream, write_stream),
            ClientSession(read_stream, write_stream) as session,
        ):
            await session.initialize()
            names = [tool.name for tool in (await session.list_tools()).tools]
            assert "up_echo" in names
            result = await session.call_tool("up_echo", {"text": "hello"})
            assert not result.is_error, result
    lines = [line for line in setup.stderr().splitlines() if line.startswith("LOADED ")]
    assert lines, setup.stderr()
    assert json.loads(lines[-1].removeprefix("LOADED ")) == []
    _assert_the_call_path_came_after_the_listing(setup.stderr())


# A host of the 2026-07-28 era (Claude Code over stdio) is answered by the front too
# (decision 0052), and in plain JSON as a handshake-era host is (`_modern_plain`,
# decision 0062): neither the SDK's server nor the protocol's models load.
NOT_FOR_A_2026_STDIO_HOST = NOT_FOR_A_DEFAULT_STDIO_PROXY


async def test_a_2026_stdio_host_that_discovers_listens_lists_and_calls_loads_no_sdk_server(
    tmp_path: Path,
) -> None:
    setup = await build_setup(tmp_path)
    probe = _PROBE.replace("NAMES", repr(NOT_FOR_A_2026_STDIO_HOST))
    proxy = [sys.executable, "-c", probe, "--config", str(setup.config_path)]
    # The proxy's stderr into the setup's file, as a host would keep it.
    parameters = StdioServerParameters(
        command="sh",
        args=["-c", f"exec {shlex.join(proxy)} 2>>{shlex.quote(str(setup.stderr_path))}"],
        env=host_environment(),
        cwd=str(setup.root),
    )
    async with Client(parameters, mode="auto", cache=None) as client:
        # `mode="auto"` opens with server/discover.
        discovered = (client.server_info, client.server_capabilities)
        # Then, as Claude Code does, a listen stream for the lists changing (decision 0052).
        async with client.listen(tools_list_changed=True, prompts_list_changed=True) as stream:
            honored = stream.honored
            names = [tool.name for tool in (await client.list_tools()).tools]
            result = await client.call_tool("up_echo", {"text": "hello"})
        version = client.protocol_version
    assert version == "2026-07-28"
    assert discovered[0].name == "agentrt-proxy" and discovered[1].tools is not None
    assert honored.tools_list_changed and honored.prompts_list_changed
    assert "up_echo" in names
    assert not result.is_error, result
    lines = [line for line in setup.stderr().splitlines() if line.startswith("LOADED ")]
    assert lines, setup.stderr()
    assert json.loads(lines[-1].removeprefix("LOADED ")) == []
    _assert_the_call_path_came_after_the_listing(setup.stderr())
    assert "loading the MCP SDK's server" not in setup.stderr()


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def test_a_refused_database_stops_the_proxy_with_exit_2_and_no_server_left_running(
    tmp_path: Path,
) -> None:
    # The store opens while the servers start (decision 0026): a database it refuses
    # must still stop the proxy with exit 2, and the server it started must be stopped.
    setup = await build_setup(tmp_path)
    pid_file = tmp_path / "upstream.pid"
    entry = setup.document["servers"][0]
    # A server that outlives its stdin's end: only the proxy's closing stops it.
    entry["command"] = ["sh", "-c", f'echo $$ > {pid_file}; "$0" "$@"; sleep 60', *entry["command"]]
    setup.rewrite()
    database = setup.config_path.parent / "proxy.db"
    database.write_bytes(b"")
    database.chmod(0o666)
    finished = subprocess.run(
        [sys.executable, "-m", "agentrt.proxy", "--config", str(setup.config_path)],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
        env=host_environment(), cwd=setup.root,
    )  # fmt: skip
    assert finished.returncode == 2, finished.stderr
    assert "writable by group or others" in finished.stderr
    assert "Traceback" not in finished.stderr
    assert pid_file.exists(), "the server was started beside the store's opening"
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(pid), "the proxy left its server running"


# What a stdio proxy imports only after it has started its servers (decision 0053): they
# boot meanwhile, on another core.  Before, the first spawn came after all of them.
NOT_BEFORE_THE_FIRST_SPAWN = (
    "asyncio",  # the event loop, with ssl
    "uvloop",
    "anyio",
    "agentrt.proxy._lifecycle",  # the serving process's life: signals, shutdown, its loop
    "agentrt.mcp._connection",  # the MCP client beyond starting a process
    "agentrt.proxy._upstreams",
    "mcp_types",  # the protocol's models, built in a worker thread
    "pydantic",
    "agentrt.gate",
)

_SPAWN_PROBE = """
import json, subprocess, sys
first = []
original = subprocess.Popen.__init__
def spawning(self, *args, **kwargs):
    if not first:
        first.append(sorted(name for name in NAMES if name in sys.modules))
    original(self, *args, **kwargs)
subprocess.Popen.__init__ = spawning
from agentrt.proxy.__main__ import main
try:
    status = main(sys.argv[1:])
finally:
    print("AT-SPAWN " + json.dumps(first), file=sys.stderr, flush=True)
sys.exit(status)
"""


def _serve_until_stdin_ends(setup: ProxySetup, *command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *command, "--config", str(setup.config_path)],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
        env=host_environment(), cwd=setup.root,
    )  # fmt: skip


async def test_a_stdio_proxy_starts_its_servers_before_the_event_loop_and_the_mcp_client(
    tmp_path: Path,
) -> None:
    setup = await build_setup(tmp_path)
    probe = _SPAWN_PROBE.replace("NAMES", repr(NOT_BEFORE_THE_FIRST_SPAWN))
    finished = _serve_until_stdin_ends(setup, "-c", probe)
    assert finished.returncode == 0, finished.stderr
    assert "registered echo as up_echo" in finished.stderr, finished.stderr
    lines = [line for line in finished.stderr.splitlines() if line.startswith("AT-SPAWN ")]
    assert lines, finished.stderr
    assert json.loads(lines[-1].removeprefix("AT-SPAWN ")) == [[]]


async def test_a_server_whose_manifest_its_load_refuses_is_never_started(
    tmp_path: Path,
) -> None:
    # Started early, before its load (decision 0053), only when the load would connect:
    # a manifest pinned for another server is refused without a process, as before.
    setup = await build_setup(tmp_path)
    started = tmp_path / "other-started"
    other = dict(setup.document["servers"][0], name="other")
    other["command"] = ["sh", "-c", f'touch {started}; exec "$0" "$@"', *other["command"]]
    setup.document["servers"].append(other)
    setup.rewrite()
    finished = _serve_until_stdin_ends(setup, "-m", "agentrt.proxy")
    assert finished.returncode == 0, finished.stderr
    assert 'manifest is for server "up", not "other"' in finished.stderr, finished.stderr
    assert "registered echo as up_echo" in finished.stderr, finished.stderr
    assert not started.exists(), "the refused server was started"


def test_the_protocol_constants_written_in_agentrt_are_the_sdks() -> None:
    # Written out so that `_proxy` does not import `mcp_types`' models (decision 0057).
    import mcp_types
    import mcp_types.jsonrpc
    import mcp_types.version

    from agentrt.proxy import _input_required, _revision

    assert _input_required.MODERN_PROTOCOL_VERSIONS == mcp_types.version.MODERN_PROTOCOL_VERSIONS
    assert _revision.PROTOCOL_VERSION_META_KEY == mcp_types.PROTOCOL_VERSION_META_KEY
    assert _revision.LOG_LEVEL_META_KEY == mcp_types.LOG_LEVEL_META_KEY
    assert _revision.HEADER_MISMATCH == mcp_types.jsonrpc.HEADER_MISMATCH


def test_the_version_written_in_agentrt_is_the_installed_distributions() -> None:
    # `_version` is the build's source (pyproject's dynamic version): what a host and a
    # server are told is what `pip` installed.
    import importlib.metadata

    from agentrt._version import VERSION
    from agentrt.mcp._handshake import client_info
    from agentrt.proxy._handlers import VERSION as ANSWERED

    assert importlib.metadata.version("agentrt") == VERSION
    assert client_info() == {"name": "agentrt", "version": VERSION}
    assert ANSWERED == VERSION


def test_the_proxy_and_its_call_path_import_no_pydantic_model() -> None:
    # `_proxy` (the calls, the client's requests, the revision's checks) loads neither
    # `mcp_types` nor pydantic: what still does is the front (`_stdio`, `_dispatch`,
    # `_handlers`), decision 0057's next steps.
    names = ("mcp_types", "pydantic", "pydantic_core")
    probe = f"import sys, agentrt.proxy._proxy; print([n for n in {names!r} if n in sys.modules])"
    finished = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert finished.stdout.strip() == "[]", finished.stdout + finished.stderr


# -- what start still does for a configuration that builds the call path at once -----------
# (decision 0066, `builds_at_start`): each proxy below is given no host message at all, its
# stdin ends at once, so what it wrote or refused, it did at start, before any call.

_LIMITS = {"max_for": "1h", "max_calls": 10}


async def test_standing_grants_write_the_operators_maximum_at_start_before_any_call(
    tmp_path: Path,
) -> None:
    setup = await build_setup(tmp_path, standing_grants=_LIMITS)
    finished = _serve_until_stdin_ends(setup, "-m", "agentrt.proxy")
    assert finished.returncode == 0, finished.stderr
    with open_store(setup.database, create=False) as store:
        assert grant_limits(store, "test-session") == GrantLimits(3600.0, 10, False)


async def test_labels_migrate_the_taint_tables_at_start_before_any_call(tmp_path: Path) -> None:
    setup = await build_setup(tmp_path)
    setup.document["servers"][0]["labels"] = ["private"]
    setup.rewrite()
    finished = _serve_until_stdin_ends(setup, "-m", "agentrt.proxy")
    assert finished.returncode == 0, finished.stderr
    with open_store(setup.database, create=False) as store:
        assert store.extension_version("flows") > 0


async def test_a_precondition_whose_reading_tool_did_not_load_is_refused_at_start(
    tmp_path: Path,
) -> None:
    # `echo`, the read a precondition names, no longer matches its pin (its description
    # changed), so its server loads without it: refused before the proxy serves.
    precondition = {"tool": "echo", "arguments": {"text": "$.note"}}
    rules = {**RULES, "write_note": {**RULES["write_note"], "precondition": precondition}}
    setup = await build_setup(tmp_path, rules=rules)
    manifest_path = setup.config_path.parent / "up.manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["tools"]["echo"]["description_hash"] = "0" * 64
    manifest_path.write_text(json.dumps(manifest))
    finished = _serve_until_stdin_ends(setup, "-m", "agentrt.proxy")
    assert "refused echo" in finished.stderr, finished.stderr
    assert finished.returncode == 1, finished.stderr
    assert 'server "up" has no loaded tool "echo" for a precondition' in finished.stderr
    assert "Traceback" not in finished.stderr


# -- the warm-up after the first listing (decision 0066) -------------------------------------
# The probe notes on stderr each import of the call path's module in a worker thread (with
# the host's calls received by then) and each build of the path (with the call path's
# modules then loaded); `SLOW` seconds are added to each import, so that a warm-up can come
# while a call's import is under way.
_WARM_PROBE = """
import importlib, json, sys, time
from agentrt.proxy import _handlers
from agentrt.proxy.__main__ import main
calls = []
call_tool = _handlers.Handlers._call_tool
async def counted_call(self, ctx, params):
    calls.append(params.name)
    return await call_tool(self, ctx, params)
_handlers.Handlers._call_tool = counted_call
import_module = importlib.import_module
def noted_import(name, package=None):
    if name != "agentrt.proxy._call_path":
        return import_module(name, package)
    print("IMPORTING " + json.dumps({"calls": len(calls)}), file=sys.stderr, flush=True)
    time.sleep(SLOW)
    module = import_module(name, package)
    build = module.build_call_path
    def noted_build(proxy):
        path = build(proxy)
        loaded = sorted(name for name in CALL_PATH if name in sys.modules)
        print("BUILT " + json.dumps({"calls": len(calls), "loaded": loaded}), file=sys.stderr,
              flush=True)
        return path
    if not hasattr(build, "noted"):
        noted_build.noted = True
        module.build_call_path = noted_build
    return module
importlib.import_module = noted_import
sys.exit(main(sys.argv[1:]))
""".replace("CALL_PATH", repr(CALL_PATH_MODULES))


def _noted(setup: ProxySetup, kind: str) -> list[dict[str, Any]]:
    lines = [line for line in setup.stderr().splitlines() if line.startswith(kind + " ")]
    return [json.loads(line.removeprefix(kind + " ")) for line in lines]


@asynccontextmanager
async def _probed_host(setup: ProxySetup, slow: float) -> AsyncIterator[RawHost]:
    """A raw host of a stdio proxy run under `_WARM_PROBE`; on the way out, its stdin is
    closed and the proxy waited for, so it ends as a host's proxy does."""
    probe = _WARM_PROBE.replace("SLOW", repr(slow))
    setup.command = lambda: [  # type: ignore[method-assign]
        sys.executable, "-c", probe, "--config", str(setup.config_path),
    ]  # fmt: skip
    async with RawHost.start(setup) as raw:
        yield raw
        await raw.process.stdin.aclose()
        with anyio.fail_after(30):
            assert await raw.process.wait() == 0, setup.stderr()


async def test_the_first_listing_warms_the_call_path_without_a_call(tmp_path: Path) -> None:
    setup = await build_setup(tmp_path)
    async with _probed_host(setup, slow=0.0) as raw:
        listed = await raw.request("tools/list", {})
        assert "up_echo" in [tool["name"] for tool in listed["result"]["tools"]]
        await until(lambda: bool(_noted(setup, "BUILT")), limit=10)
    assert _noted(setup, "IMPORTING") == [{"calls": 0}]
    assert _noted(setup, "BUILT") == [{"calls": 0, "loaded": sorted(CALL_PATH_MODULES)}]


async def test_a_call_sent_with_the_first_listing_is_served_and_imports_the_call_path_once(
    tmp_path: Path,
) -> None:
    # The call comes at once, so it imports the call path itself; the import takes longer
    # than the warm-up's wait, so the warm-up comes while it is under way and must take
    # that import, not start another.
    setup = await build_setup(tmp_path)
    async with _probed_host(setup, slow=0.3) as raw:
        listing = await raw.send_request("tools/list", {})
        call = await raw.call("up_echo", {"text": "hello"})
        answers = await raw.responses({listing, call})
        assert "up_echo" in [tool["name"] for tool in answers[listing]["result"]["tools"]]
        result = answers[call]["result"]
        assert result.get("isError") is not True, result
        assert [block["text"] for block in result["content"]] == ["hello"]
    assert _noted(setup, "IMPORTING") == [{"calls": 1}]
    assert _noted(setup, "BUILT") == [{"calls": 1, "loaded": sorted(CALL_PATH_MODULES)}]


async def test_a_server_offering_prompts_and_resources_is_listed_to_the_host_without_the_models(
    tmp_path: Path,
) -> None:
    # The server's prompts, resources and templates are checked (`plainly_listable`) and
    # listed (`listed_plainly`, `shaped_offers`) in plain JSON: a host that opens and lists
    # everything, as Claude Code does, loads none of the modules a default proxy does not
    # (but JSON Schema's validators: this server's schemas are ones that need them).
    config = await anyio.to_thread.run_sync(conformance_config, tmp_path, "offers")
    schemas = {"jsonschema", "referencing", "regex"}
    names = [name for name in NOT_FOR_A_DEFAULT_STDIO_PROXY if name not in schemas]
    assert "mcp_types" in names and "pydantic" in names
    probe = _PROBE.replace("NAMES", repr(names))
    stderr_path = tmp_path / "proxy.stderr"
    parameters = StdioServerParameters(
        command=sys.executable,
        args=["-c", probe, "--config", str(config)],
        env=host_environment(),
        cwd=str(tmp_path),
    )
    with stderr_path.open("a") as errlog:
        async with (
            stdio_client(parameters, errlog=errlog) as (read_stream, write_stream),
            ClientSession(read_stream, write_stream) as session,
        ):
            await session.initialize()
            tools = (await session.list_tools()).tools
            prompts = (await session.list_prompts()).prompts
            resources = (await session.list_resources()).resources
            templates = (await session.list_resource_templates()).resource_templates
    assert tools and prompts and resources and templates
    assert "test_prompt_with_arguments" in [prompt.name for prompt in prompts]
    stderr = stderr_path.read_text()
    lines = [line for line in stderr.splitlines() if line.startswith("LOADED ")]
    assert lines, stderr
    assert json.loads(lines[-1].removeprefix("LOADED ")) == [], stderr
