"""`pin`, `check`, `proxy`, `demo`: the subcommands that talk to MCP servers.

`pin` and `check` read the proxy's configuration file (the same file
`agentrt proxy` serves).  The modules behind `proxy` and `demo` are imported
only when those subcommands run, so the inspecting and deciding subcommands
never load MCP, HTTP or provider code.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import anyio
import click

from ..canonical import canonical_json
from ..errors import AgentrtError
from ..mcp._files import write_private
from ..sanitize import sanitize
from ._app import EXIT_UNUSABLE, CommandError, Settings
from ._diff import ToolChange, manifest_changes
from ._output import Output, bounded

if TYPE_CHECKING:
    from ..mcp import Manifest, Report
    from ..proxy.config import ProxyConfig, UpstreamConfig

__all__ = ["check", "demo", "pin", "pin_upstream", "proxy"]

_HINTS: Final = ("readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint")


_config_option = click.option(
    "--config",
    "config_path",
    required=True,
    metavar="FILE",
    help="The proxy configuration file (the same one `agentrt proxy` serves).",
)


def _load_config(path: str) -> ProxyConfig:
    from ..proxy.config import load_config

    try:
        return load_config(path)
    except (AgentrtError, OSError, ValueError) as error:
        raise CommandError(
            f"the configuration {sanitize(path)} cannot be used: {sanitize(str(error))}",
            EXIT_UNUSABLE,
        ) from error


def _selected(config: ProxyConfig, name: str | None) -> list[UpstreamConfig]:
    upstreams = list(config.servers)
    if name is None:
        return upstreams
    chosen = [upstream for upstream in upstreams if upstream.server.name == name]
    if not chosen:
        known = ", ".join(sanitize(upstream.server.name) for upstream in upstreams) or "none"
        raise CommandError(
            f'the configuration has no server "{sanitize(name)}" (it has: {known})', EXIT_UNUSABLE
        )
    return chosen


def _hints(annotations: Mapping[str, Any] | None) -> str:
    """The hints a server claims for a tool, as it sent them; they classify nothing."""
    if not annotations:
        return "no hints"
    claimed = [
        f"{name}={bounded(canonical_json(annotations[name]), 16, 8)}"
        for name in _HINTS
        if name in annotations
    ]
    return " ".join(claimed) or "no hints"


def _print_manifest(output: Output, manifest: Manifest, manifest_path: Path) -> None:
    tools = list(manifest.tools.values())
    if output.json:
        for tool in tools:
            output.record(
                {
                    "record": "pinned_tool",
                    "server": manifest.server,
                    "tool": tool.name,
                    "annotations": tool.annotations,
                    "description": tool.description,
                    "schema_hash": tool.schema_hash,
                    "description_hash": tool.description_hash,
                }
            )
        output.record(
            {
                "record": "manifest",
                "server": manifest.server,
                "path": str(manifest_path),
                "tools": len(tools),
            }
        )
        return
    output.line(
        f'server "{sanitize(manifest.server)}": {len(tools)} tools pinned to '
        f"{sanitize(str(manifest_path))} (the hints are the server's claims; they classify nothing)"
    )
    offered = [
        f"{len(pins)} {section.replace('_', ' ')}"
        for section in ("prompts", "resources", "resource_templates")
        if (pins := manifest.offers(section)) is not None
    ]
    output.line(
        f'server "{sanitize(manifest.server)}": '
        + (", ".join(offered) + " pinned" if offered else "no prompts or resources pinned")
        + " (each offered to the host only while it matches its pin)"
    )
    if tools:
        output.table(
            ["TOOL", "HINTS", "DESCRIPTION"],
            [
                [
                    bounded(tool.name, 40, 20),
                    _hints(tool.annotations),
                    bounded(tool.description, 50, 20),
                ]
                for tool in tools
            ],
        )


def _previous_pin(manifest_path: Path) -> tuple[Manifest | None, str]:
    """The manifest a new pin would replace, or None with the reason it cannot be compared."""
    from ..mcp import read_manifest

    if not manifest_path.exists() and not manifest_path.is_symlink():
        return None, ""
    try:
        return read_manifest(manifest_path), ""
    except AgentrtError as error:
        return None, sanitize(str(error))


def _print_changes(output: Output, server: str, changes: list[ToolChange]) -> None:
    if output.json:
        for change in changes:
            output.record(
                {
                    "record": "pin_change",
                    "server": server,
                    "tool": change.tool,
                    "what": change.what,
                    "kind": change.kind,
                    "lines": change.lines,
                }
            )
        return
    for change in changes:
        output.line(f'  {change.kind} {change.what} "{sanitize(change.tool)}":')
        for line in change.lines:
            output.line(f"    {line}")


def pin_upstream(output: Output, upstream: UpstreamConfig, *, yes: bool) -> Manifest:
    """Pin one server and write its manifest; a pin replacing another is shown as a review.

    Over an existing manifest the changes are printed tool by tool and the new
    manifest is written only when the operator agrees (or `yes`); an
    unchanged server keeps its file.  Raises `AgentrtError` when the server
    cannot be pinned and `CommandError` when the operator declines.
    """
    from ..mcp import pin as pin_server

    name = upstream.server.name
    manifest = anyio.run(pin_server, upstream.server)
    previous, unreadable = _previous_pin(upstream.manifest_path)
    shown_path = sanitize(str(upstream.manifest_path))
    if previous is not None:
        changes = manifest_changes(previous, manifest)
        if not changes:
            if output.json:
                output.record(
                    {"record": "unchanged", "server": name, "path": str(upstream.manifest_path)}
                )
            else:
                output.line(
                    f'server "{sanitize(name)}": unchanged since it was pinned to {shown_path}'
                )
            return previous
        if not output.json:
            output.line(
                f'server "{sanitize(name)}": {len(changes)} tool(s) changed since the pin in '
                f"{shown_path} (text from the server is escaped; hints are its claims):"
            )
        _print_changes(output, name, changes)
    elif unreadable:
        # Nothing trusted to compare against: the new pin is reviewed as a first one.
        click.echo(
            f'server "{sanitize(name)}": the manifest it replaces cannot be read, so it is '
            f"pinned afresh: {unreadable}",
            err=output.json,
        )
    if previous is not None and not yes:
        try:
            agreed = click.confirm(f'write the new manifest for server "{sanitize(name)}"?')
        except click.Abort:
            agreed = False
        if not agreed:
            raise CommandError(
                f'the manifest of server "{sanitize(name)}" was not replaced: answer yes, '
                "or pass --yes once you have reviewed the changes"
            )
    try:
        write_private(upstream.manifest_path, manifest.to_json())
    except OSError as error:
        raise CommandError(
            f"the manifest {shown_path} cannot be written: "
            f"{sanitize(error.strerror or str(error))}",
            EXIT_UNUSABLE,
        ) from error
    _print_manifest(output, manifest, upstream.manifest_path)
    return manifest


@click.command(short_help="Pin each server's tools to its manifest, reviewing what changed.")
@_config_option
@click.argument("server_name", metavar="[SERVER]", required=False)
@click.option("--yes", is_flag=True, help="Replace a changed manifest without asking.")
@click.pass_obj
def pin(settings: Settings, config_path: str, server_name: str | None, yes: bool) -> None:
    """Connect to each server, list its tools, and write its manifest (owner-only).

    Over an existing manifest, print what changed (new and removed tools, a
    word-level diff of a description, the schema's changed keys, changed
    hints) and ask before replacing it.
    """
    config = _load_config(config_path)
    failures = 0
    declined = 0
    for upstream in _selected(config, server_name):
        name = sanitize(upstream.server.name)
        try:
            pin_upstream(settings.output, upstream, yes=yes)
        except CommandError as error:
            if error.exit_code == EXIT_UNUSABLE:
                raise
            declined += 1
            error.show()
        except AgentrtError as error:
            failures += 1
            click.echo(f'agentrt: server "{name}" was not pinned: {sanitize(str(error))}', err=True)
    if failures:
        raise CommandError(
            f"{failures} server(s) could not be pinned; nothing was written for them"
        )
    if declined:
        raise CommandError(f"{declined} manifest(s) were kept as they were")


async def _check_one(upstream: UpstreamConfig) -> Report:
    """Load one server against its manifest and rules; the connection is always closed."""
    from ..mcp import LoadError, load, read_manifest
    from ..mcp._oauth import needs_login

    waiting = await needs_login(upstream.server)
    if waiting is not None:
        raise AgentrtError(waiting)
    manifest = read_manifest(upstream.manifest_path)
    try:
        _tools, report = await load(upstream.server, manifest, upstream.rules)
    except LoadError as error:
        if error.report is None:
            raise
        # Nothing registered; the report still says why, tool by tool.
        return error.report
    if report.connection is not None:
        await report.connection.aclose()
    return report


def _confinement(upstream: UpstreamConfig) -> str:
    """Whether a server is sandboxed, and what its sandbox grants, in one phrase."""
    server = upstream.server
    if server.command is None:
        return "reached over HTTP (it runs elsewhere; no sandbox applies)"
    sandbox = server.sandbox
    if sandbox is None:
        return "not sandboxed: it runs with every file and network this user can reach"
    granted = [
        f"{kind} {', '.join(sanitize(path) for path in paths)}"
        for kind, paths in (("read", sandbox.read), ("write", sandbox.write))
        if paths
    ]
    granted.append("network on" if sandbox.network else "no network")
    return f"sandboxed ({'; '.join(granted)})"


def _refused_changes(upstream: UpstreamConfig, refused: list[str]) -> list[ToolChange]:
    """What changed in the refused tools since their pin, from a fresh listing (nothing called)."""
    from ..mcp import pin as pin_server
    from ..mcp import read_manifest

    try:
        pinned = read_manifest(upstream.manifest_path)
        live = anyio.run(pin_server, upstream.server)
    except AgentrtError:
        return []
    return manifest_changes(pinned, live, only=set(refused))


@click.command(short_help="Load every server as the proxy would; call nothing.")
@_config_option
@click.pass_obj
def check(settings: Settings, config_path: str) -> None:
    """Load every server as the proxy would and print the report; no tool is called.

    For every refused tool, what changed since its pin is shown as `pin` shows it.
    """
    config = _load_config(config_path)
    output = settings.output
    failed = 0
    for upstream in config.servers:
        name = upstream.server.name
        sandboxed = upstream.server.sandbox is not None
        if not output.json:
            output.line(f'server "{sanitize(name)}": {_confinement(upstream)}')
        try:
            report = anyio.run(_check_one, upstream)
        except AgentrtError as error:
            failed += 1
            if output.json:
                output.record(
                    {
                        "record": "check",
                        "server": name,
                        "sandboxed": sandboxed,
                        "ok": False,
                        "error": str(error),
                    }
                )
            else:
                output.line(f'server "{sanitize(name)}": not loaded: {sanitize(str(error))}')
            continue
        refused = list(report.refused)
        failed += bool(refused) or not report.registered
        if output.json:
            output.record(
                {
                    "record": "check",
                    "server": name,
                    "sandboxed": sandboxed,
                    "ok": not refused and bool(report.registered),
                    "registered": [
                        {
                            "tool": registration.tool,
                            "name": registration.name,
                            "side_effect": str(registration.side_effect),
                            "hint_mismatch": registration.hint_mismatch,
                        }
                        for registration in report.registered
                    ],
                    "refused": [
                        {"tool": refusal.tool, "reason": refusal.reason} for refusal in refused
                    ],
                    "unpinned": list(report.unpinned),
                    "unclassified": list(report.unclassified),
                }
            )
        else:
            output.line(str(report))
            if not report.registered and not refused:
                output.line(
                    f"{sanitize(name)}: no tool is classified yet: "
                    f"agentrt classify --config {sanitize(str(config.path))} {sanitize(name)}"
                )
        if refused:
            changes = _refused_changes(upstream, [refusal.tool for refusal in refused])
            if changes and not output.json:
                output.line(f"{sanitize(name)}: what changed since the pin:")
            _print_changes(output, name, changes)
    if failed:
        raise CommandError(f"{failed} server(s) did not load cleanly; see the report above")


@click.command()
@_config_option
@click.option(
    "--http",
    "http_address",
    metavar="HOST:PORT",
    help="Serve streamable HTTP on this address instead of stdio (loopback unless --allow-remote).",
)
@click.option(
    "--allow-remote",
    is_flag=True,
    help='Allow --http on a non-loopback address (needs --token or "principals").',
)
@click.option(
    "--token",
    envvar="AGENTRT_PROXY_TOKEN",
    metavar="TOKEN",
    help=(
        "Bearer token the HTTP endpoint requires (or AGENTRT_PROXY_TOKEN): one user; "
        'several people use "principals" in the configuration instead.'
    ),
)
def proxy(
    config_path: str, http_address: str | None, allow_remote: bool, token: str | None
) -> None:
    """Serve the MCP proxy: the gate in front of the configured servers.

    It opens (and creates, if need be) the database the configuration names.
    """
    from ..proxy import serve
    from ..proxy._serve import exit_process

    exit_process(serve(config_path, http=http_address, allow_remote=allow_remote, token=token))


@click.command(short_help="Run the end-to-end demo.")
@click.option("--model", metavar="PROVIDER:NAME", help="A real model, e.g. ollama:qwen3:30b-a3b.")
@click.option("--base-url", metavar="URL", help="The model endpoint (OpenAI or Anthropic style).")
@click.option(
    "--interactive", is_flag=True, help="Wait for `agentrt approve` instead of approving for you."
)
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where the demo keeps its sandbox, manifest and database (default: the user cache).",
)
@click.option("--resume", "resume_run", metavar="RUN", help="Continue a run a stopped demo left.")
def demo(
    model: str | None,
    base_url: str | None,
    interactive: bool,
    state_dir: Path | None,
    resume_run: str | None,
) -> None:
    """Run the end-to-end demo: pin, load, a paused write, its approval, the audit trail."""
    from ..demo import run_demo

    async def run() -> int:
        return await run_demo(
            model=model,
            base_url=base_url,
            interactive=interactive,
            state_dir=state_dir,
            out=click.get_text_stream("stdout"),
            resume=resume_run,
        )

    status = anyio.run(run)
    if status:
        raise SystemExit(status)
