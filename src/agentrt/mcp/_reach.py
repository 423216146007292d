"""Whether a stdio server's command or environment names one of the operator's files.

A server handed the proxy's configuration, a manifest, the rules or the
database, or a directory holding one, could rewrite the policy or forge an
approval.  Servers take paths in many spellings, so every argument and every
`env` value is split into each path-like token it could hold: a `file:` URL
(percent-decoded), the parts of a comma, colon, semicolon or whitespace list
(`--dirs=/etc,/srv`, `/etc:/srv`, `sh -c "serve /srv"`), the value of
`--opt=VALUE` and of `-oVALUE`, and the literal directory a glob starts from
(`CONF/*` can match anything under `CONF`).  Each token is resolved as the
server would resolve it (relative to its working directory, `~` expanded,
`..` and symbolic links followed) and compared with the protected paths.

This is a guard, not a boundary: it reads what the operator wrote, not what
the server does.  A server can still reach any file its user can by a path
nobody handed it; only a sandbox stops that.
"""

from __future__ import annotations

import os
import re
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from ._server import Server

__all__ = ["OperatorFileReach", "find_operator_file_reach", "path_tokens"]

# Where one path in a list or a shell string ends and the next begins.
_SEPARATORS: Final = re.compile(r"[,;:=\s'\"`()<>|&]+")
_GLOB: Final = re.compile(r"[*?\[{]")
_URL: Final = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


@dataclass(frozen=True, slots=True)
class OperatorFileReach:
    """`value` (an argument, or an `env` entry) holds `token`, which reaches `protected`."""

    value: str
    token: str
    protected: str


def path_tokens(value: str) -> list[str]:
    """Every path-like token `value` could hand a server, `value` itself first."""
    tokens: list[str] = []
    seen: set[str] = set()
    pending = [value]
    while pending:
        token = pending.pop()
        if not token or token in seen:
            continue
        seen.add(token)
        tokens.append(token)
        if "%" in token:
            pending.append(urllib.parse.unquote(token))
        if _URL.match(token):
            parts = urllib.parse.urlsplit(token)
            if parts.scheme.lower() == "file":
                # file://host/path names a local path whatever the host says.
                pending.append(urllib.parse.unquote(parts.path))
        if token.startswith("-") and not token.startswith("--") and len(token) > 2:
            # -rVALUE, -rfVALUE: the value starts after the option letter, or where a path does.
            pending.append(token[2:])
            start = next((i for i, char in enumerate(token) if char in "/.~"), -1)
            if start > 1:
                pending.append(token[start:])
        pending.extend(part for part in _SEPARATORS.split(token) if part != token)
    return tokens


def _resolved_forms(token: str, cwd: str) -> set[str]:
    """The paths `token` names for a server in `cwd`: lexically, and with links followed."""
    glob = _GLOB.search(token)
    if glob is not None:
        # A glob can match anything below the literal directory it starts from.
        prefix = token[: glob.start()]
        directory = prefix.rpartition("/")[0]
        token = directory if directory else ("/" if prefix.startswith("/") else ".")
    expanded = os.path.expanduser(token)
    path = os.path.join(cwd, expanded)  # an absolute token replaces cwd
    return {os.path.abspath(path), os.path.realpath(path)}


def _names_or_holds(path: str, protected: str) -> bool:
    return protected == path or protected.startswith(path.rstrip(os.sep) + os.sep)


def find_operator_file_reach(
    server: Server, protected: Iterable[str | os.PathLike[str]], *, cwd: str | None = None
) -> OperatorFileReach | None:
    """The first argument or `env` value of a stdio `server` that reaches a protected path.

    A token reaches a protected path when, resolved, it is that path or a
    directory above it.  `cwd` is the directory the server starts in (this
    process's by default, as `start_stdio` starts it).  Inherited variables
    (PATH, HOME, TMPDIR, `inherit_env`) are not examined: the configuration
    usually lives under HOME, and the operator did not hand those over.
    """
    if server.command is None:
        return None
    directory = os.getcwd() if cwd is None else cwd
    targets: list[str] = []
    for path in protected:
        for form in (os.path.abspath(path), os.path.realpath(path)):
            if form not in targets:
                targets.append(form)
    values = [(argument, argument) for argument in server.command]
    values += [(entry, entry.partition("=")[2]) for entry in server.env]
    for shown, value in values:
        for token in path_tokens(value):
            for form in _resolved_forms(token, directory):
                for target in targets:
                    if _names_or_holds(form, target):
                        return OperatorFileReach(value=shown, token=token, protected=target)
    return None
