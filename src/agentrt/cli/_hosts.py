"""MCP hosts' configuration files: where each host keeps its servers, read and rewritten.

A host's file belongs to the host and the person using it: everything in it
but the block of servers is kept exactly as it was (rewriting changes the
layout and drops comments, never a value), and a rewrite always leaves a
timestamped copy of the original beside it.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from .._hostfiles import application_support, config_home, vscode_user
from ..sanitize import sanitize
from ._app import CommandError

__all__ = [
    "SOURCES",
    "HostFile",
    "backups",
    "locate",
    "read_host",
    "servers_block",
    "with_servers",
]

SOURCES: Final = ("claude-desktop", "claude-code", "cursor", "vscode")
BACKUP_MARK: Final = ".agentrt-backup-"
REPLACED_MARK: Final = ".agentrt-replaced-"
"""A file `--restore` replaced, kept beside it; not a backup, so a later restore skips it."""
_MAX_HOST_FILE_BYTES: Final = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class HostFile:
    """One host's configuration file and where in it the servers are kept.

    `key` is the path of keys to the servers object (`mcpServers`, VS Code's
    `servers`, or `mcp.servers` in VS Code's settings); `typed` says whether
    the host wants a `"type": "stdio"` in each entry.
    """

    source: str
    path: Path
    key: tuple[str, ...]
    typed: bool = False


def locate(source: str) -> HostFile:
    """The file a host named by `source` reads, or the file at the path `source`.

    Unknown names and missing files are refused in one sentence.
    """
    home = Path.home()
    if source == "claude-desktop":
        folder = application_support() if sys.platform == "darwin" else config_home()
        return HostFile(source, folder / "Claude" / "claude_desktop_config.json", ("mcpServers",))
    if source == "claude-code":
        # The project's own file when there is one, else the user's.
        project = Path.cwd() / ".mcp.json"
        path = project if project.exists() else home / ".claude.json"
        return HostFile(source, path, ("mcpServers",), typed=True)
    if source == "cursor":
        return HostFile(source, home / ".cursor" / "mcp.json", ("mcpServers",))
    if source == "vscode":
        workspace = Path.cwd() / ".vscode" / "mcp.json"
        if workspace.exists():
            return HostFile(source, workspace, ("servers",), typed=True)
        user = vscode_user() / "mcp.json"
        if user.exists():
            return HostFile(source, user, ("servers",), typed=True)
        return HostFile(source, vscode_user() / "settings.json", ("mcp", "servers"), typed=True)
    path = Path(source).expanduser()
    if not path.is_file():
        raise CommandError(
            f"unknown source {sanitize(repr(source))}: name one of {', '.join(SOURCES)}, "
            "or the path of a host's configuration file"
        )
    return HostFile("path", Path(os.path.abspath(path)), ())


def read_host(host: HostFile) -> tuple[HostFile, dict[str, Any], bytes]:
    """The host's file parsed (comments allowed, repeated keys refused), with its raw bytes.

    For a file given by path the key is found in it: `mcpServers`, then
    `servers`, then `mcp.servers`.
    """
    shown = sanitize(str(host.path))
    try:
        with host.path.open("rb") as stream:
            data = stream.read(_MAX_HOST_FILE_BYTES + 1)
    except OSError as error:
        raise CommandError(
            f"the host configuration {shown} cannot be read: "
            f"{sanitize(error.strerror or str(error))}"
        ) from None
    if len(data) > _MAX_HOST_FILE_BYTES:
        raise CommandError(f"the host configuration {shown} is larger than 16 MiB")
    try:
        document = json.loads(
            _without_comments(data.decode("utf-8")), object_pairs_hook=_no_repeats
        )
    except (UnicodeDecodeError, ValueError) as error:
        raise CommandError(
            f"the host configuration {shown} is not usable JSON: {sanitize(str(error))}"
        ) from None
    if not isinstance(document, dict):
        raise CommandError(f"the host configuration {shown} is not a JSON object")
    if not host.key:
        for key in (("mcpServers",), ("servers",), ("mcp", "servers")):
            if _at(document, key) is not None:
                host = HostFile(host.source, host.path, key, typed=key[-1] == "servers")
                break
        else:
            raise CommandError(
                f"the host configuration {shown} has no mcpServers (or servers) object"
            )
    return host, document, data


def servers_block(host: HostFile, document: dict[str, Any]) -> dict[str, Any]:
    """The host's servers object (empty when the file has none yet)."""
    block = _at(document, host.key)
    if block is None:
        return {}
    if not isinstance(block, dict):
        raise CommandError(
            f"the host configuration {sanitize(str(host.path))}: "
            f"{'.'.join(host.key)} is not a JSON object"
        )
    return block


def with_servers(host: HostFile, document: dict[str, Any], block: dict[str, Any]) -> str:
    """The host's file with its servers object replaced by `block`, everything else kept."""
    copy: dict[str, Any] = json.loads(json.dumps(document))
    holder = copy
    for key in host.key[:-1]:
        child = holder.get(key)
        if not isinstance(child, dict):
            child = {}
            holder[key] = child
        holder = child
    holder[host.key[-1]] = block
    return json.dumps(copy, indent=2, ensure_ascii=False) + "\n"


def backup_path(host: HostFile, moment: datetime, mark: str = BACKUP_MARK) -> Path:
    """Where a rewrite keeps the original: beside it, named for the time (UTC)."""
    stamp = moment.astimezone(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    return host.path.with_name(f"{host.path.name}{mark}{stamp}")


def backups(host: HostFile) -> list[Path]:
    """The backups kept beside the host's file, oldest first (the stamps sort by time)."""
    pattern = re.compile(re.escape(host.path.name + BACKUP_MARK) + r"\d{8}T\d{12}Z$")
    if not host.path.parent.is_dir():
        return []
    return sorted(path for path in host.path.parent.iterdir() if pattern.match(path.name))


def _at(document: dict[str, Any], key: tuple[str, ...]) -> Any:
    value: Any = document
    for part in key:
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def _no_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            # Hosts disagree on which of two repeats wins; guessing would import the wrong one.
            raise ValueError(f"the key {sanitize(repr(key))} appears twice in one object")
        result[key] = value
    return result


def _without_comments(text: str) -> str:
    """VS Code's JSON with comments, as JSON: comments and trailing commas removed."""
    return "".join(_jsonc_pieces(text))


def _jsonc_pieces(text: str) -> Iterator[str]:
    position, length = 0, len(text)
    while position < length:
        char = text[position]
        if char == '"':
            end = position + 1
            while end < length and text[end] != '"':
                end += 2 if text[end] == "\\" else 1
            yield text[position : end + 1]
            position = end + 1
        elif text.startswith("//", position):
            newline = text.find("\n", position)
            position = length if newline < 0 else newline
        elif text.startswith("/*", position):
            close = text.find("*/", position + 2)
            position = length if close < 0 else close + 2
        elif char == ",":
            rest = re.match(r",(\s|//[^\n]*|/\*.*?\*/)*([}\]])", text[position:], re.DOTALL)
            if rest is None:
                yield char
            position += 1
        else:
            yield char
            position += 1
