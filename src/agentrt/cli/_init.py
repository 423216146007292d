"""`agentrt init`: from a host's MCP configuration to a pinned proxy configuration.

`init --from SOURCE` reads the servers a host starts, writes `proxy.json`
(owner-only, in a directory only the owner can enter) with every server, no
rule yet and sensible defaults, and pins each server.  A server that cannot
start stays in the file with a `note` saying why (the proxy leaves a server
without a manifest out, with one line), never silently dropped.
`--install` then rewrites the host's file so it starts only the proxy,
keeping a timestamped backup beside it; `--restore` puts the newest backup
back.  Nothing in a host's file is rewritten without showing the change and
asking first.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import click

from ..errors import AgentrtError
from ..mcp._files import write_private
from ..sanitize import sanitize
from ._app import EXIT_UNUSABLE, CommandError, Settings, init_config_path
from ._hosts import (
    REPLACED_MARK,
    SOURCES,
    HostFile,
    backup_path,
    backups,
    locate,
    read_host,
    servers_block,
    with_servers,
)
from ._output import Output

__all__ = ["init"]

CONFIG_NAME: Final = "proxy.json"
DEFAULT_TIMEOUT_TEXT: Final = "60s"
_SERVER_NAME: Final = re.compile(r"[^A-Za-z0-9_-]")
_VARIABLE_NAME: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")  # \Z: "$" allows a final newline
_PLACEHOLDER: Final = re.compile(r"\$\{[^}]*\}")
# The policy a new configuration starts from: reads run, changes wait for a
# person, destruction is refused; the operator loosens it knowingly.
_STARTING_POLICY: Final = {
    "read_only": "allow",
    "local_mutation": "require_approval",
    "remote_mutation": "require_approval",
    "destructive": "deny",
    # The lethal trifecta (docs/flows.md): it holds nothing until `classify` labels servers.
    "flows": [{"after": ["private", "untrusted"], "call": "egress", "outcome": "require_approval"}],
}


@dataclass(slots=True)
class _Imported:
    """One host server as it will appear in `proxy.json`."""

    name: str
    entry: dict[str, Any]
    notes: list[str] = field(default_factory=list)


def _default_out() -> Path:
    return init_config_path().parent


def _say(output: Output, text: str, **record: Any) -> None:
    if output.json:
        output.record({"record": "init", "message": text, **record})
    else:
        output.line(text)


def _fetch_note(name: str, command: list[str]) -> str:
    """How to install once a server that `npx` or `uvx` would fetch at every start."""
    program = Path(command[0]).name
    package = next((part for part in command[1:] if not part.startswith("-")), "PACKAGE")
    package = sanitize(package)
    if program in ("npx", "bunx", "pnpx"):
        return (
            f"{program} fetches {package} at every start; install it once, pinned: "
            f"npm install --prefix ~/.local/share/agentrt/servers/{name} {package}@VERSION, "
            "then set command to that install's node_modules/.bin program"
        )
    if program in ("uvx", "pipx"):
        return (
            f"{program} fetches {package} at every start; install it once, pinned: "
            f"python3 -m venv ~/.local/share/agentrt/servers/{name} && "
            f"~/.local/share/agentrt/servers/{name}/bin/pip install {package}==VERSION, "
            "then set command to that venv's bin program"
        )
    return ""


def _sandbox_entry(command: str, args: list[str]) -> dict[str, Any]:
    """The sandbox init proposes for a stdio server: the paths its arguments name, no network."""
    from ..mcp._sandbox import sandbox_for_arguments

    proposed = sandbox_for_arguments(command, args)
    entry: dict[str, Any] = {}
    if proposed.read:
        entry["read"] = list(proposed.read)
    if proposed.write:
        entry["write"] = list(proposed.write)
    entry["network"] = proposed.network
    return entry


def _import_server(host: HostFile, key: str, raw: Any) -> _Imported:
    shown = f'the host configuration {sanitize(str(host.path))}: server "{sanitize(key)}"'
    if not isinstance(raw, dict):
        raise CommandError(f"{shown} is not a JSON object")
    name = _SERVER_NAME.sub("_", key)[:40] or "server"
    imported = _Imported(name=name, entry={"name": name})
    if name != key:
        imported.notes.append(f"named {sanitize(key)!r} in the host; renamed to fit tool names")
    command = raw.get("command")
    url = raw.get("url") or raw.get("serverUrl")
    if isinstance(command, str) and command:
        args = raw.get("args", [])
        if not isinstance(args, list) or not all(isinstance(arg, str) for arg in args):
            raise CommandError(f"{shown}: args must be a list of strings")
        imported.entry["command"] = [command, *args]
        env = raw.get("env", {})
        if not isinstance(env, dict) or not all(isinstance(value, str) for value in env.values()):
            raise CommandError(f"{shown}: env must be an object of names to strings")
        for variable in env:
            if not _VARIABLE_NAME.match(variable):
                raise CommandError(f"{shown}: env names {sanitize(repr(variable))}, not a variable")
        if env:
            imported.entry["env"] = [f"{variable}={value}" for variable, value in env.items()]
        fetch = _fetch_note(name, imported.entry["command"])
        if fetch:
            # A fetcher needs the network and a cache in HOME at every start,
            # which a sandbox withholds: it is sandboxed once installed.
            imported.notes.append(
                f"{fetch}; then add a sandbox (docs/sandbox.md), "
                "as init does for an installed server"
            )
        else:
            imported.entry["sandbox"] = _sandbox_entry(command, args)
    elif isinstance(url, str) and url:
        imported.entry["endpoint"] = url
        if raw.get("type") == "sse":
            imported.notes.append("the host uses the SSE transport; agentrt speaks streamable HTTP")
        headers = raw.get("headers", {})
        if not isinstance(headers, dict) or not all(
            isinstance(value, str) for value in headers.values()
        ):
            raise CommandError(f"{shown}: headers must be an object of names to strings")
        if headers:
            imported.entry["headers"] = headers
    else:
        raise CommandError(f"{shown} has neither a command nor a url")
    for unsupported in ("cwd", "envFile"):
        if unsupported in raw:
            imported.notes.append(f"the host's {unsupported} is not carried over")
    if _PLACEHOLDER.search(json.dumps(raw)):
        imported.notes.append("it uses ${...} placeholders, which agentrt does not expand")
    imported.entry["default_timeout"] = DEFAULT_TIMEOUT_TEXT
    imported.entry["manifest"] = f"{name}.manifest.json"
    imported.entry["rules"] = {}
    return imported


def _is_agentrt(raw: Any) -> bool:
    """Whether a host entry already starts the proxy (importing it would import itself)."""
    if not isinstance(raw, dict) or not isinstance(raw.get("command"), str):
        return False
    args = raw.get("args", [])
    words = [Path(raw["command"]).name, *(args if isinstance(args, list) else [])]
    return ("agentrt" in words[0] and "proxy" in words) or "agentrt.proxy" in words


def _imported_servers(host: HostFile, document: dict[str, Any]) -> list[_Imported]:
    block = servers_block(host, document)
    imported: list[_Imported] = []
    taken: set[str] = set()
    for key, raw in block.items():
        if _is_agentrt(raw):
            continue
        server = _import_server(host, key, raw)
        if server.name in taken:
            raise CommandError(
                f'two of the host\'s servers become "{sanitize(server.name)}"; rename one'
            )
        taken.add(server.name)
        imported.append(server)
    if not imported:
        raise CommandError(
            f"the host configuration {sanitize(str(host.path))} names no server to put behind "
            "the proxy"
        )
    return imported


def _private_directory(directory: Path) -> None:
    """Create `directory` 0700, or refuse one that others could write into."""
    shown = sanitize(str(directory))
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        status = directory.stat()
    except OSError as error:
        raise CommandError(
            f"the directory {shown} cannot be made: {sanitize(error.strerror or str(error))}",
            EXIT_UNUSABLE,
        ) from None
    if status.st_uid != os.geteuid() or stat.S_IMODE(status.st_mode) & (
        stat.S_IWGRP | stat.S_IWOTH
    ):
        raise CommandError(
            f"the directory {shown} can be written by others; use one only you can write "
            f"(chmod 700 {shown})",
            EXIT_UNUSABLE,
        )


def _document(session: str, servers: list[_Imported]) -> str:
    entries = []
    for server in servers:
        entry = dict(server.entry)
        if server.notes:
            entry["note"] = "; ".join(server.notes)
        entries.append(entry)
    document = {
        "database": "proxy.db",
        "session": session,
        "hold": "15s",
        "policy": _STARTING_POLICY,
        "servers": entries,
    }
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


def _import(output: Output, host: HostFile, out: Path, config_path: Path) -> None:
    from ..proxy.config import load_config
    from ._servers import pin_upstream

    host, document, _data = read_host(host)
    servers = _imported_servers(host, document)
    _private_directory(out)
    session = host.source if host.source != "path" else "agentrt"
    write_private(config_path, _document(session, servers))
    _say(
        output,
        f"wrote {sanitize(str(config_path))} (owner-only) with {len(servers)} server(s) "
        f"from {sanitize(str(host.path))}",
        path=str(config_path),
    )
    try:
        # The configuration's own checks, before any server starts: one handed
        # the directory holding this file could rewrite it.
        config = load_config(config_path)
    except AgentrtError as error:
        raise CommandError(
            f"{sanitize(str(error))}; edit {sanitize(str(config_path))} or run init with "
            "another --out"
        ) from None
    for server in servers:
        for note in server.notes:
            _say(output, f'server "{sanitize(server.name)}": note: {note}', server=server.name)
    unpinned = 0
    for server, upstream in zip(servers, config.servers, strict=True):
        try:
            pin_upstream(output, upstream, yes=True)
        except (AgentrtError, CommandError) as error:
            unpinned += 1
            # CommandError's text is already escaped; an AgentrtError's is not.
            reason = error.message if isinstance(error, CommandError) else sanitize(str(error))
            _say(
                output,
                f'server "{sanitize(server.name)}" could not be pinned: {reason}; '
                "it stays in the configuration, and the proxy leaves it out until it is pinned",
                server=server.name,
                pinned=False,
            )
            stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
            server.notes.append(
                f"not pinned by agentrt init ({stamp}): {reason}; fix it, then run: "
                f"agentrt pin --config {config_path} {server.name}"
            )
    if unpinned:
        write_private(config_path, _document(session, servers))
    shown = sanitize(str(config_path))
    source = host.source if host.source != "path" else sanitize(str(host.path))
    _say(output, "")
    _say(output, "Next:")
    _say(output, f"  1. classify the tools:      agentrt classify --config {shown}")
    _say(output, f"  2. see what would load:     agentrt check --config {shown}")
    _say(
        output,
        f"  3. start it from the host:  agentrt init --from {source} "
        f"--out {sanitize(str(config_path.parent))} --install",
    )


def _proxied_names(config_path: Path) -> set[str]:
    from ..proxy.config import load_config

    try:
        return {upstream.server.name for upstream in load_config(config_path).servers}
    except AgentrtError as error:
        raise CommandError(
            f"the configuration {sanitize(str(config_path))} cannot be used, so the host is "
            f"not pointed at it: {sanitize(str(error))}",
            EXIT_UNUSABLE,
        ) from None


def _agentrt_command(config_path: Path) -> tuple[str, list[str]]:
    """The absolute command that starts this build's proxy on `config_path`."""
    beside = Path(sys.executable).with_name("agentrt")
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside), ["proxy", "--config", str(config_path)]
    found = shutil.which("agentrt")
    if found:
        return os.path.abspath(found), ["proxy", "--config", str(config_path)]
    return sys.executable, ["-m", "agentrt.proxy", "--config", str(config_path)]


def _confirm(question: str, yes: bool) -> None:
    if yes:
        return
    try:
        agreed = click.confirm(question)
    except click.Abort:
        agreed = False
    if not agreed:
        raise CommandError("nothing was changed: answer yes, or pass --yes")


def _install(output: Output, host: HostFile, config_path: Path, yes: bool) -> None:
    host, document, data = read_host(host)
    block = servers_block(host, document)
    command, args = _agentrt_command(config_path)
    entry: dict[str, Any] = {"command": command, "args": args}
    if host.typed:
        entry = {"type": "stdio", **entry}
    new_block = {"agentrt": entry}
    if block == new_block:
        _say(output, f"{sanitize(str(host.path))} already starts only the proxy; nothing to do")
        return
    shown = sanitize(str(host.path))
    _say(output, f"{shown} will start only the proxy:")
    proxied = _proxied_names(config_path)
    for key in block:
        if _SERVER_NAME.sub("_", key)[:40] in proxied:
            fate = f"the proxy starts it, from {sanitize(str(config_path))}"
        else:
            fate = f"not in {sanitize(str(config_path))}: it will no longer start"
        _say(output, f"  - {sanitize(key)} ({fate})")
    _say(output, f"  + agentrt: {sanitize(command)} {sanitize(' '.join(args))}")
    _say(output, "  everything else in the file is kept; a backup is written beside it")
    _confirm(f"rewrite {shown}?", yes)
    target = Path(os.path.realpath(host.path))
    backup = backup_path(HostFile(host.source, target, host.key), datetime.now(UTC))
    write_private(backup, data.decode("utf-8"))
    write_private(target, with_servers(host, document, new_block))
    _say(
        output,
        f"rewrote {shown}; the original is kept in {sanitize(str(backup))}",
        backup=str(backup),
    )
    restore_source = host.source if host.source != "path" else sanitize(str(host.path))
    _say(output, f"restart the host; to undo: agentrt init --restore {restore_source}")


def _server_names(host: HostFile) -> str:
    try:
        host, document, _data = read_host(host)
        names = list(servers_block(host, document))
    except CommandError as error:
        return f"(unreadable: {error.message})"
    return ", ".join(sanitize(name) for name in names) or "none"


def _restore(output: Output, source: str, yes: bool) -> None:
    host = locate(source)
    target = Path(os.path.realpath(host.path))
    kept = backups(HostFile(host.source, target, host.key))
    if not kept:
        raise CommandError(f"there is no agentrt backup beside {sanitize(str(host.path))}")
    newest = kept[-1]
    _say(output, f"{sanitize(str(host.path))} will be replaced by {sanitize(str(newest))}")
    for label, path in (("now", host.path), ("after", newest)):
        _say(output, f"  servers {label}: {_server_names(HostFile(host.source, path, host.key))}")
    _confirm(f"restore {sanitize(str(host.path))}?", yes)
    # What the host or its user changed since the install is not lost with it.
    replaced: Path | None = backup_path(
        HostFile(host.source, target, host.key), datetime.now(UTC), REPLACED_MARK
    )
    try:
        current = target.read_bytes().decode("utf-8")
    except FileNotFoundError:
        replaced = None  # nothing there to keep
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) else "it is not UTF-8"
        raise CommandError(
            f"{sanitize(str(host.path))} was not restored: it cannot be kept first "
            f"({sanitize(reason or str(error))})"
        ) from None
    if replaced is not None:
        write_private(replaced, current)
    write_private(target, newest.read_bytes().decode("utf-8"))
    _say(output, f"restored {sanitize(str(host.path))} from {sanitize(str(newest))}")
    if replaced is not None:
        _say(
            output,
            f"the file it replaced is kept in {sanitize(str(replaced))}",
            replaced=str(replaced),
        )


@click.command(short_help="Import a host's MCP servers into a pinned proxy configuration.")
@click.option(
    "--from",
    "source",
    metavar="SOURCE",
    help=f"{', '.join(SOURCES)}, or the path of a host's configuration file.",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where proxy.json and the manifests go (default ~/.config/agentrt, made 0700).",
)
@click.option(
    "--install", is_flag=True, help="Then rewrite the host's file to start only the proxy."
)
@click.option("--restore", "restore_source", metavar="SOURCE", help="Put the newest backup back.")
@click.option("--yes", is_flag=True, help="Rewrite the host's file without asking.")
@click.pass_obj
def init(
    settings: Settings,
    source: str | None,
    out: Path | None,
    install: bool,
    restore_source: str | None,
    yes: bool,
) -> None:
    """Read a host's MCP servers, write proxy.json, and pin every server.

    With --install, rewrite the host's configuration so it starts only
    `agentrt proxy` (a backup is kept beside it); --restore SOURCE undoes that.
    """
    output = settings.output
    if restore_source is not None:
        if source is not None or install:
            raise CommandError("--restore stands alone: give it the source, nothing else", 2)
        _restore(output, restore_source, yes)
        return
    if source is None:
        raise CommandError("name the host: --from SOURCE (or --restore SOURCE)", 2)
    host = locate(source)
    directory = Path(os.path.abspath((out or _default_out()).expanduser()))
    config_path = directory / CONFIG_NAME
    if config_path.exists() or config_path.is_symlink():
        if not install:
            raise CommandError(
                f"{sanitize(str(config_path))} already exists: classify it "
                f"(agentrt classify --config {sanitize(str(config_path))}), install it "
                "(--install), or choose another --out"
            )
    else:
        _import(output, host, directory, config_path)
    if install:
        _install(output, host, config_path, yes)
