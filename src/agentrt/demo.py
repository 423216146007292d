"""`agentrt demo`: the whole story on one machine, with no network and no model download.

The stock MCP filesystem server runs in bubblewrap, confined to its sandbox
directory (see docs/sandbox.md); `pin` shows the hints it
claims; the operator's `rules.json` classifies four reads and one write (over
the server's destructive hint); an agent reads a file and asks to write one;
the policy holds the write for an approval bound to the hash of what the
operator was shown; the run resumes and executes exactly that request; the
audit trail is printed and its hash chain verified.

State lives under the user cache directory (`agentrt/`, mode 0700), at fixed
names, so every command the demo prints addresses the same database, and
another account on a shared machine can neither pre-create nor read it.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import stat
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, TextIO

import anyio
import anyio.to_thread

from .accounting import MeteredAgent, ModelMeter
from .agent import Agent, Decision, DecisionKind, Observation, StepInput
from .approvals import approve
from .canonical import JSONBoundaryError, canonical_json, parse_json
from .driver import Driver, RunResult
from .errors import AgentrtError
from .gate import Gate, Limits
from .mcp import Manifest, Report, Sandbox, Server, load, pin, read_manifest, read_rules
from .mcp._files import write_private
from .policy import ClassPolicy, Outcome
from .providers import ProviderError, ScriptedAgent, agent_for
from .sanitize import sanitize
from .store import ApprovalRecord, ApprovalStatus, RunStatus, Store, approval_hash, open_store
from .telemetry import settings_from, start_exporter
from .tools import SideEffect, Tool
from .trace import format_event

__all__ = [
    "DEMO_POLICY",
    "DEMO_SERVER",
    "DemoError",
    "DemoPaths",
    "DemoStopped",
    "default_example_dir",
    "default_state_dir",
    "demo_server",
    "run_demo",
]

DEMO_SERVER: Final = "fs"
"""The server's name; its tools register as `fs_<tool>`."""

DEMO_POLICY: Final = ClassPolicy(
    {SideEffect.READ_ONLY: Outcome.ALLOW, SideEffect.LOCAL_MUTATION: Outcome.REQUIRE_APPROVAL}
)
"""Reads run, local writes wait for a person, everything else is denied."""

INPUT_FILE: Final = "README.md"
OUTPUT_FILE: Final = "SUMMARY.md"
_SERVER_SCRIPT: Final = Path(
    "node_modules", "@modelcontextprotocol", "server-filesystem", "dist", "index.js"
)
_LIMITS: Final = Limits(max_steps=20)
# Short, so the resume command printed after Ctrl-C works soon; the gate's
# heartbeat renews it every third of this while a step runs.
_LEASE_TTL = 10.0
_POLL_SECONDS: Final = 0.25
_APPROVED_BY: Final = "agentrt demo"
_SHOWN_CHARS: Final = 100
_MAX_CHECKED_BYTES: Final = 1024 * 1024

_SANDBOX_README: Final = """\
# The agentrt demo sandbox

This directory is the only one the filesystem server may touch.

## What happens here

An agent reads this file, then asks to write SUMMARY.md beside it.
Reads are allowed by the operator's policy; the write waits for a person.

## Why it matters

The model asks, the runtime decides: every call is recorded, checked
against its schema, decided by policy, and chained into the audit log.
"""

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2
EXIT_INTERRUPTED: Final = 130


class DemoError(AgentrtError):
    """The demo cannot run as set up (a missing install, an unsafe state directory)."""


class DemoStopped(AgentrtError):
    """Ctrl-C asked the demo to stop between steps."""


# -- where things live ------------------------------------------------------


def default_state_dir() -> Path:
    """`$XDG_CACHE_HOME/agentrt` when that is an absolute path, else `~/.cache/agentrt`."""
    cache = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(cache) if cache and os.path.isabs(cache) else Path.home() / ".cache"
    return base / "agentrt"


def default_example_dir() -> Path:
    """`examples/filesystem` of the source tree this module runs from, else under the cwd."""
    beside_source = Path(__file__).resolve().parents[2] / "examples" / "filesystem"
    if (beside_source / "rules.json").exists():
        return beside_source
    return Path.cwd() / "examples" / "filesystem"


@dataclass(frozen=True, slots=True)
class DemoPaths:
    """The demo's fixed names under its state directory, and the example it runs."""

    state_dir: Path
    example_dir: Path

    @property
    def sandbox(self) -> Path:
        return self.state_dir / "sandbox"

    @property
    def manifest(self) -> Path:
        return self.state_dir / f"{DEMO_SERVER}.manifest.json"

    @property
    def database(self) -> Path:
        return self.state_dir / "agentrt.db"

    @property
    def rules(self) -> Path:
        return self.example_dir / "rules.json"

    @property
    def server_script(self) -> Path:
        return self.example_dir / _SERVER_SCRIPT


def demo_server(paths: DemoPaths, node: str) -> Server:
    """The stock filesystem server, sandboxed: its package read-only, the sandbox writable."""
    return Server(
        name=DEMO_SERVER,
        command=[node, str(paths.server_script), str(paths.sandbox.resolve())],
        sandbox=Sandbox(
            read=[str((paths.example_dir / "node_modules").resolve())],
            write=[str(paths.sandbox.resolve())],
        ),
    )


def _private_dir(path: Path) -> None:
    """Create `path` mode 0700, or accept it only as this user's own directory (tightened to 0700).

    A directory another account created (or a link to one) would let that
    account choose the manifest, the database, or what the server may touch.
    """
    shown = sanitize(str(path))
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise DemoError(f"cannot create {shown}: {sanitize(exc.strerror or str(exc))}") from None
    status = path.lstat()
    if stat.S_ISLNK(status.st_mode):
        raise DemoError(f"refusing to use {shown}: it is a symbolic link")
    if not stat.S_ISDIR(status.st_mode):
        raise DemoError(f"refusing to use {shown}: it is not a directory")
    if status.st_uid != os.geteuid():
        raise DemoError(
            f"refusing to use {shown}: it is owned by uid {status.st_uid}, not by you"
            f" (uid {os.geteuid()})"
        )
    if stat.S_IMODE(status.st_mode) != 0o700:
        os.chmod(path, 0o700)


# -- what is printed --------------------------------------------------------


class _Say:
    """Lines for the operator; everything a server or model chose is escaped by the caller."""

    def __init__(self, out: TextIO) -> None:
        self.out = out

    def __call__(self, line: str = "") -> None:
        self.out.write(line + "\n")
        self.out.flush()

    def section(self, title: str) -> None:
        self()
        self(f"== {title}")


def _short(text: str, limit: int = _SHOWN_CHARS) -> str:
    text = sanitize(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _hints(annotations: dict[str, Any] | None) -> str:
    if not annotations:
        return "no hints"
    return " ".join(
        f"{sanitize(str(name))}={_short(canonical_json(value), 20)}"
        for name, value in sorted(annotations.items())
    )


_SHOWN_APART: Final = frozenset(
    {"tool", "side_effect", "path", "lines", "bytes", "preview", "arguments"}
)


def _content_of(args: str) -> str | None:
    try:
        arguments = parse_json(args)
    except JSONBoundaryError:
        return None
    content = arguments.get("content") if isinstance(arguments, dict) else None
    return content if isinstance(content, str) else None


def _command(*words: str | Path) -> str:
    """A command line to copy: each word shell-quoted, any control character escaped."""
    return " ".join(shlex.quote(sanitize(str(word))) for word in words)


# -- Ctrl-C -----------------------------------------------------------------


class _StopSwitch:
    """Ctrl-C once: stop before the next step (cancelling a model that is still
    thinking, which has no side effect).  A tool that is running finishes and is
    recorded first, so nothing is left half-done by the first press."""

    def __init__(self) -> None:
        self.requested = False
        self.stopped_at_once = False
        self._scope: anyio.CancelScope | None = None

    def request(self) -> None:
        self.requested = True
        if self._scope is not None:
            self._scope.cancel()

    @contextmanager
    def cancellable(self) -> Iterator[anyio.CancelScope]:
        with anyio.CancelScope() as scope:
            self._scope = scope
            try:
                yield scope
            finally:
                self._scope = None


async def _watch_interrupts(switch: _StopSwitch, say: _Say, hard_stop: anyio.CancelScope) -> None:
    with anyio.open_signal_receiver(signal.SIGINT) as signals:
        async for _ in signals:
            if switch.requested:
                switch.stopped_at_once = True
                hard_stop.cancel()
                return
            say()
            say("stopping before the next step (Ctrl-C again to stop at once)")
            switch.request()


class _NarratedAgent:
    """The demo's agent seam: prints what the agent saw and asked, and stops on Ctrl-C."""

    def __init__(self, agent: Agent, say: _Say, switch: _StopSwitch) -> None:
        self.agent = agent
        self.say = say
        self.switch = switch
        self._shown = 0

    async def decide(self, step_input: StepInput) -> Decision:
        return await self.decide_metered(step_input, None)

    async def decide_metered(self, step_input: StepInput, meter: ModelMeter | None) -> Decision:
        # A model agent is asked through the Driver's meter, so its calls are on the books.
        for observation in step_input.history[self._shown :]:
            self._show_observation(observation)
        self._shown = len(step_input.history)
        if self.switch.requested:
            raise DemoStopped("stopped by Ctrl-C before the next step")
        with self.switch.cancellable() as scope:
            if meter is not None and isinstance(self.agent, MeteredAgent):
                decision = await self.agent.decide_metered(step_input, meter)
            else:
                decision = await self.agent.decide(step_input)
        if scope.cancelled_caught:
            raise DemoStopped("stopped by Ctrl-C while the model was deciding")
        if decision.kind is DecisionKind.TOOL_CALL:
            self.say(f"  agent asks: {_short(decision.tool, 40)} {_short(decision.args)}")
        elif decision.kind is DecisionKind.COMPLETE:
            self.say(f"  agent completes: {_short(decision.result)}")
        else:
            self.say(f"  agent fails: {_short(decision.reason)}")
        return decision

    def _show_observation(self, observation: Observation) -> None:
        self.say(
            f"  step {observation.step} {_short(observation.tool, 40)}: {observation.kind}"
            f" {_short(observation.content, 80)}"
        )


# -- the scripted agent -----------------------------------------------------


def _file_text(content: str) -> str:
    """The text of a filesystem tool's result (`{"content": text}`), or the content as it is."""
    try:
        value = parse_json(content)
    except JSONBoundaryError:
        return content
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        text: str = value["content"]
        return text
    return value if isinstance(value, str) else content


def summary_of(text: str) -> str:
    """What the scripted agent writes: the headings and size of the file it read."""
    lines = text.splitlines()
    headings = [line.lstrip("#").strip() for line in lines if line.startswith("#")]
    body = [
        f"# Summary of {INPUT_FILE}",
        "",
        f"{INPUT_FILE} has {len(lines)} lines. Its headings:",
        "",
        *[f"- {heading}" for heading in headings],
        "",
        "Written by the demo's scripted agent, after an operator approved it.",
    ]
    return "\n".join(body) + "\n"


def scripted_demo_agent(read_tool: str, write_tool: str, sandbox: Path) -> ScriptedAgent:
    """Read README.md, ask to write SUMMARY.md, then finish; a function of what it has seen."""
    readme = str(sandbox / INPUT_FILE)
    summary = str(sandbox / OUTPUT_FILE)

    def step(step_input: StepInput) -> Decision:
        history = step_input.history
        if not history:
            return Decision.tool_call(read_tool, canonical_json({"path": readme}))
        last = history[-1]
        if last.kind != "result":
            return Decision.fail(f"{last.tool} gave {last.kind}: {last.content}")
        if len(history) == 1:
            content = summary_of(_file_text(last.content))
            return Decision.tool_call(
                write_tool, canonical_json({"path": summary, "content": content})
            )
        return Decision.complete(f"wrote {OUTPUT_FILE}, a summary of {INPUT_FILE}")

    return ScriptedAgent(step, description="a scripted agent (no model is configured)")


def demo_goal(sandbox: Path) -> str:
    return (
        f"Read the file {sandbox / INPUT_FILE} and write a short summary of it to"
        f" {sandbox / OUTPUT_FILE}. Both are in the directory {sandbox}. Use absolute paths."
        " When the summary is written, answer with one sentence saying so."
    )


# -- the story --------------------------------------------------------------


async def run_demo(
    *,
    model: str | None = None,
    base_url: str | None = None,
    interactive: bool = False,
    state_dir: Path | None = None,
    example_dir: Path | None = None,
    out: TextIO = sys.stdout,
    resume: str | None = None,
) -> int:
    """Run the demo and return the exit status (0 done and the chain intact).

    `model` is `ollama:NAME`, `openai:NAME` or `anthropic:NAME` (else a scripted agent);
    `interactive` waits for `agentrt approve` in another terminal instead of
    approving; `resume` continues a run an earlier demo left (after Ctrl-C).
    """
    say = _Say(out)
    if base_url and not model:
        say("error: --base-url names a model endpoint, so it needs --model (openai:NAME, ...)")
        return EXIT_USAGE
    try:
        agent: Agent | None = agent_for(model, base_url=base_url) if model else None
    except ProviderError as exc:
        say(f"error: {exc}")
        return EXIT_USAGE
    paths = DemoPaths(
        (state_dir or default_state_dir()).absolute(),
        (example_dir or default_example_dir()).absolute(),
    )
    demo = _Demo(paths, say, agent, model=model, base_url=base_url, interactive=interactive)
    switch = _StopSwitch()
    status = EXIT_INTERRUPTED
    async with anyio.create_task_group() as watchers:
        if threading.current_thread() is threading.main_thread():
            watchers.start_soon(_watch_interrupts, switch, say, watchers.cancel_scope)
        try:
            try:
                status = await demo.run(switch, resume)
            except BaseExceptionGroup as group:
                # A task group below (a connection's, say) may still wrap what the loop raised.
                raise _only_error(group) from None
        except DemoStopped as exc:
            say(str(exc))
            demo.print_resume_command()
            status = EXIT_INTERRUPTED
        except ProviderError as exc:
            say(f"error: {exc}")
            demo.print_resume_command()
            status = EXIT_FAILED
        except AgentrtError as exc:
            say(f"error: {exc}")
            status = EXIT_FAILED
        except OSError as exc:
            say(f"error: {sanitize(str(exc))}")
            status = EXIT_FAILED
        finally:
            watchers.cancel_scope.cancel()
    if switch.stopped_at_once:
        say("stopped at once by a second Ctrl-C")
        demo.print_resume_command()
    return status


def _only_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The one exception inside (nested) groups, or the group itself when there are several."""
    leaves: list[BaseException] = []
    pending: list[BaseException] = [group]
    while pending:
        current = pending.pop()
        if isinstance(current, BaseExceptionGroup):
            pending.extend(current.exceptions)
        else:
            leaves.append(current)
    return leaves[0] if len(leaves) == 1 else group


class _Demo:
    def __init__(
        self,
        paths: DemoPaths,
        say: _Say,
        agent: Agent | None,
        *,
        model: str | None,
        base_url: str | None,
        interactive: bool,
    ) -> None:
        self.paths = paths
        self.say = say
        self.agent = agent
        self.model = model
        self.base_url = base_url
        self.interactive = interactive
        self.run_id: str | None = None

    # The commands an operator can type to do each step by hand.

    def _agentrt(self, *words: str | Path) -> str:
        return _command("agentrt", "--db", self.paths.database, *words)

    def _demo_command(self, *extra: str) -> str:
        words: list[str | Path] = ["agentrt", "demo", "--state-dir", self.paths.state_dir]
        if self.model:
            words += ["--model", self.model]
        if self.base_url:
            words += ["--base-url", self.base_url]
        if self.interactive:
            words.append("--interactive")
        return _command(*words, *extra)

    def print_resume_command(self) -> None:
        if self.run_id is None:
            self.say("no run was recorded; run the demo again to start over")
            return
        kept = f"run {sanitize(self.run_id)} is kept in {sanitize(str(self.paths.database))}"
        self.say(f"{kept}; to continue:")
        self.say(f"  {self._demo_command('--resume', self.run_id)}")
        lease_ends = self._lease_end()
        if lease_ends is not None:
            # The lease outlives this process by design: another process may
            # not take a run over until it is sure this one has stopped.
            self.say(f"  (this process's lease on the run lasts until {lease_ends}; resume after)")

    def _lease_end(self) -> str | None:
        if self.run_id is None:
            return None
        try:
            with open_store(self.paths.database, read_only=True) as store:
                run = store.get_run(self.run_id)
        except AgentrtError:
            return None
        expires = run.lease_expires_at
        if run.status is not RunStatus.RUNNING or expires is None or expires <= time.time():
            return None
        return datetime.fromtimestamp(expires, UTC).isoformat(timespec="seconds")

    async def run(self, switch: _StopSwitch, resume: str | None) -> int:
        paths, say = self.paths, self.say
        say(f"agent: {self._agent_line()}")
        node = shutil.which("node")
        if node is None:
            raise DemoError("node is not on PATH; the demo's MCP server needs Node.js 20 or later")
        if not paths.server_script.is_file():
            raise DemoError(
                f"the pinned filesystem server is not installed at"
                f" {sanitize(str(paths.server_script))}; run"
                f" `cd {shlex.quote(str(paths.example_dir))} && npm ci --ignore-scripts`"
                " (or `make demo`)"
            )
        _private_dir(paths.state_dir)
        _private_dir(paths.sandbox)
        server = demo_server(paths, node)
        say(f"state: {sanitize(str(paths.state_dir))} (mode 0700)")
        say(
            "server: confined by bubblewrap; it sees the system directories and its own package,"
            " writes only the sandbox directory, has an empty HOME and no network"
        )
        # Pinning and loading change nothing but the demo's own files, so Ctrl-C
        # may cut them short (pin and load close the server on the way out).
        with switch.cancellable() as setup:
            if resume is None:
                self._prepare_sandbox()
                await self._pin(server)
            else:
                self.run_id = resume
                say(f"resuming run {sanitize(resume)}")
            manifest = read_manifest(paths.manifest)
            rules = {name: rule.to_rule() for name, rule in read_rules(paths.rules).items()}
            shown = f"{sanitize(str(paths.manifest))} and {sanitize(str(paths.rules))}"
            say(f"read {shown} (each owned by you, writable by nobody else)")
            tools, report = await load(server, manifest, rules)
        if setup.cancelled_caught:
            raise DemoStopped("stopped by Ctrl-C before the run started")
        try:
            self._show_report(report, manifest)
            return await self._drive(tools, report, switch, resume)
        finally:
            if report.connection is not None:
                with anyio.CancelScope(shield=True):
                    await report.connection.aclose()

    def _agent_line(self) -> str:
        if self.agent is None:
            return (
                "scripted — no model is configured (use --model ollama:NAME,"
                " --model openai:NAME or --model anthropic:NAME for a real one)"
            )
        description = getattr(self.agent, "description", None)
        return str(description) if description else sanitize(repr(self.agent))

    def _prepare_sandbox(self) -> None:
        sandbox = self.paths.sandbox
        write_private(sandbox / INPUT_FILE, _SANDBOX_README)
        # A fresh run each time: the file the agent writes is gone until it is approved.
        (sandbox / OUTPUT_FILE).unlink(missing_ok=True)
        self.say(f"sandbox: {sanitize(str(sandbox))} (wrote {INPUT_FILE}, removed {OUTPUT_FILE})")

    async def _pin(self, server: Server) -> None:
        say = self.say
        say.section(
            "pin: every tool the server offers, with the hints it claims (they classify nothing)"
        )
        manifest = await pin(server)
        width = max((len(sanitize(name)) for name in manifest.tools), default=0)
        for name, tool in sorted(manifest.tools.items()):
            say(f"  {sanitize(name):<{width}}  {_hints(tool.annotations)}")
        write_private(self.paths.manifest, manifest.to_json())
        shown = sanitize(str(self.paths.manifest))
        say(f"pinned {len(manifest.tools)} tools to {shown} (mode 0600)")

    def _show_report(self, report: Report, manifest: Manifest) -> None:
        say = self.say
        say.section(f"load: {sanitize(str(self.paths.rules))} classifies; the report")
        for line in str(report).splitlines():
            say(f"  {line}")
        overrides = [r for r in report.registered if r.hint_mismatch]
        say(
            f"{len(report.registered)} tools registered ({len(overrides)} over the server's hint);"
            f" {len(report.unclassified)} unclassified and {len(report.refused)} refused —"
            " the model never sees those"
        )

    def _tool_name(self, report: Report, server_tool: str) -> str:
        for registration in report.registered:
            if registration.tool == server_tool:
                return registration.name
        raise DemoError(
            f"{sanitize(str(self.paths.rules))} does not register the server's {server_tool};"
            " the scripted agent needs it"
        )

    async def _drive(
        self, tools: Sequence[Tool], report: Report, switch: _StopSwitch, resume: str | None
    ) -> int:
        paths, say = self.paths, self.say
        inner: Agent
        if self.agent is None:
            inner = scripted_demo_agent(
                self._tool_name(report, "read_text_file"),
                self._tool_name(report, "write_file"),
                paths.sandbox.resolve(),
            )
        else:
            inner = self.agent
        store = open_store(paths.database)
        telemetry = start_exporter(
            paths.database,
            settings_from(default_service="agentrt-demo"),
            side_effects={tool.spec.name: str(tool.spec.side_effect) for tool in tools},
            log=sys.stderr,
        )
        if telemetry is not None:
            say(f"telemetry: spans of this run go to {sanitize(telemetry.settings.traces_url)}")
        try:
            gate = Gate(
                store, list(tools), policy=DEMO_POLICY, limits=_LIMITS, lease_ttl=_LEASE_TTL
            )
            driver = Driver(gate, _NarratedAgent(inner, say, switch))
            say.section("run: the policy allows reads, holds local writes, denies the rest")
            if resume is None:
                # The id is chosen here so a Ctrl-C during the first step can name it.
                self.run_id = uuid.uuid4().hex
                say(f"run {self.run_id}")
                result = await driver.run(demo_goal(paths.sandbox.resolve()), run_id=self.run_id)
            else:
                result = await driver.resume(resume)
            while result.status is RunStatus.WAITING_FOR_APPROVAL:
                approval = result.approval or store.waiting_approval(result.run_id)
                if approval is None:
                    raise DemoError(f"run {result.run_id} waits, but on no approval")
                if not await self._decide(store, approval, switch):
                    result = RunResult(
                        result.run_id, store.get_run(result.run_id).status, None,
                        store.get_run(result.run_id).reason,
                    )  # fmt: skip
                    break
                say(f"resuming run {result.run_id}: the approved request executes as recorded")
                result = await driver.resume(result.run_id)
            return self._finish(store, result)
        finally:
            if telemetry is not None:
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(telemetry.stop)
            store.close()

    async def _decide(self, store: Store, approval: ApprovalRecord, switch: _StopSwitch) -> bool:
        """Show the request, then approve it (or wait for a person); True when approved."""
        say = self.say
        shown_hash = self._show_approval(approval)
        if not self.interactive:
            decided = approve(
                store,
                approval.run_id,
                approval_hash=shown_hash,
                approval_id=approval.approval_id,
                by=_APPROVED_BY,
                note="approved non-interactively; run with --interactive to decide yourself",
            )
            say(f"approved {decided.approval_id} (the hash above), through agentrt.approve")
            return True
        say("decide in another terminal (it prints the request again and asks):")
        say(f"  {self._agentrt('approve', approval.run_id)}")
        say(f"  {self._agentrt('reject', approval.run_id, '--note', 'not this time')}")
        say("waiting for the decision (Ctrl-C to stop; the run stays paused in the database)")
        while True:
            current = store.get_approval(approval.approval_id)
            if current.status is ApprovalStatus.APPROVED:
                say(f"approved by {sanitize(current.decided_by) or 'someone'}")
                return True
            if current.status is not ApprovalStatus.PENDING:
                say(f"the approval is {current.status}; the write does not run")
                return False
            if switch.requested:
                raise DemoStopped("stopped by Ctrl-C while waiting for the decision")
            with switch.cancellable():
                await anyio.sleep(_POLL_SECONDS)

    def _show_approval(self, approval: ApprovalRecord) -> str:
        """Print the operator view and return the hash of exactly what was printed."""
        say = self.say
        say.section(f"paused: run {approval.run_id} waits for an approval")
        presentation = approval.presentation if isinstance(approval.presentation, dict) else {}
        say(f"  approval   {approval.approval_id} (step {approval.step})")
        say(f"  tool       {_short(approval.tool, 64)} ({_short(approval.kind, 40)})")
        say(f"  capability {_short(canonical_json(approval.capability), 200)}")
        if isinstance(presentation.get("path"), str):
            say(f"  path       {_short(presentation['path'], 200)}")
        if "lines" in presentation:
            say(f"  lines      {_short(canonical_json(presentation['lines']), 20)}")
        if "bytes" in presentation:
            say(f"  bytes      {_short(canonical_json(presentation['bytes']), 20)}")
        for key, value in sorted(presentation.items()):
            # Whatever else the policy chose to show (an interrupted step's warning).
            if key not in _SHOWN_APART:
                text = value if isinstance(value, str) else canonical_json(value)
                say(f"  {_short(str(key), 10):<10} {_short(text, 400)}")
        preview = presentation.get("preview")
        if isinstance(preview, str):
            content = _content_of(approval.args)
            cut = "" if content is None or len(content) <= len(preview) else " (the start)"
            say(f"  preview{cut}")
            # Split on newlines only: a U+2028 or a form feed is shown escaped
            # inside its line, not as a line break the file does not have.
            lines = preview.removesuffix("\n").split("\n")
            for line in lines:
                say(f"    | {_short(line, 160)}")
        else:
            say(f"  arguments  {_short(approval.args, 400)}")
        shown_hash = approval_hash(
            approval.kind, approval.capability, approval.presentation, approval.tool, approval.args
        )
        say(f"  hash       {shown_hash}")
        return shown_hash

    def _finish(self, store: Store, result: RunResult) -> int:
        paths, say = self.paths, self.say
        run_id = result.run_id
        say.section(f"done: run {run_id} is {result.status}")
        if result.reason:
            say(f"  reason: {_short(result.reason, 200)}")
        if result.result:
            say(f"  result: {_short(result.result, 200)}")
        written_ok = (
            self._check_written(store, run_id) if result.status is RunStatus.COMPLETED else False
        )
        say.section(f"audit trail of run {run_id}")
        offset = 0
        while True:
            events = store.list_events(run_id, limit=500, offset=offset)
            for event in events:
                say(format_event(event))
            if len(events) < 500:
                break
            offset += len(events)
        chain = store.verify_chain()
        if chain.ok:
            say(f"chain intact: {chain.head_seq} events, head {chain.head_hash}")
        else:
            say(f"chain BROKEN at event {chain.first_bad_seq}: {sanitize(chain.reason)}")
        say.section("the same, by hand")
        say(f"  {self._agentrt('runs')}")
        say(f"  {self._agentrt('show', run_id)}")
        say(f"  {self._agentrt('events', run_id)}")
        say(f"  {self._agentrt('verify')}")
        say(f"  {self._demo_command()}")
        interactive = _command("agentrt", "demo", "--state-dir", paths.state_dir, "--interactive")
        say(f"  {interactive}   # pause, then approve with agentrt approve")
        if not chain.ok:
            return EXIT_FAILED
        if result.status is not RunStatus.COMPLETED:
            return EXIT_FAILED
        return EXIT_OK if written_ok else EXIT_FAILED

    def _check_written(self, store: Store, run_id: str) -> bool:
        """Whether the file on disk holds exactly what the operator approved."""
        approved = [
            step
            for step in store.list_steps(run_id)
            if step.status == "succeeded" and step.tool.endswith("write_file")
        ]
        if not approved:
            self.say("  the agent never wrote a file (a real model may choose not to)")
            return self.agent is not None
        step = approved[-1]
        try:
            arguments = parse_json(step.args)
        except JSONBoundaryError:
            return False
        path = arguments.get("path") if isinstance(arguments, dict) else None
        content = arguments.get("content") if isinstance(arguments, dict) else None
        if not isinstance(path, str) or not isinstance(content, str):
            return False
        target = Path(path)
        sandbox = self.paths.sandbox.resolve()
        if not target.is_absolute():
            target = sandbox / target
        if not target.resolve().is_relative_to(sandbox):
            self.say(f"  the approved path {_short(path)} is outside the sandbox; not read")
            return False
        # Not blocking: a FIFO planted at the path must not hang the check.
        descriptor = os.open(target, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(descriptor, "rb") as file:
            if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
                self.say(f"  {_short(path)} is not a regular file")
                return False
            on_disk = file.read(_MAX_CHECKED_BYTES + 1)
        if on_disk != content.encode("utf-8"):
            self.say(f"  {_short(path)} does NOT hold the approved content")
            return False
        self.say(
            f"  {_short(path)} holds exactly the approved content"
            f" ({len(content.splitlines())} lines, {len(on_disk)} bytes)"
        )
        return True
