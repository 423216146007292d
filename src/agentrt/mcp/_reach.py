"""Whether a stdio server's command or environment names one of the operator's files.

A server handed the proxy's configuration, a manifest, the rules or the
database, or a directory holding one, could rewrite the policy or forge an
approval.  Servers take paths in many spellings, so every argument and every
`env` value is split into each path-like token it could hold: a `file:` URL
(percent-decoded), the parts of a comma, colon, semicolon or whitespace list
(`--dirs=/etc,/srv`, `/etc:/srv`, `sh -c "serve /srv"`), every run of those
parts that a real path could hold (`/Users/me/Application Support/agentrt`,
whose space continues a protected path's component or an existing entry's
name), the words of a shell string with its quotes and backslashes undone,
the value of `--opt=VALUE` and of `-oVALUE`, and each choice of a brace list
(`/srv/{conf,data}`).  A glob reaches a protected path when the literal
directory it starts from holds it and the glob's first pattern component
matches the next component of that path (`CONF/*`, `co*/x`, `*.json` next
to the configuration).  Each token is resolved as the
server would resolve it (relative to its working directory, `~` expanded,
`..` and symbolic links followed) and compared with the protected paths, in
either Unicode normalization (macOS takes `é` composed or not as one name).

This is a guard, not a boundary: it reads what the operator wrote, not what
the server does.  A server can still reach any file its user can by a path
nobody handed it; only a sandbox stops that.
"""

from __future__ import annotations

import bisect
import contextlib
import fnmatch
import os
import re
import shlex
import unicodedata
import urllib.parse
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Final

from ._server import Server

__all__ = ["OperatorFileReach", "find_operator_file_reach", "path_tokens"]

# Where one path in a list or a shell string may end and the next begin.
_SEPARATORS: Final = frozenset(",;:='\"`()<>|&") | frozenset(" \t\n\r\f\v")
_GLOB: Final = re.compile(r"[*?\[]")
_BRACES: Final = re.compile(r"\{([^{}]*,[^{}]*)\}")
_URL: Final = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


@dataclass(frozen=True, slots=True)
class OperatorFileReach:
    """`value` (an argument, or an `env` entry) holds `token`, which reaches `protected`."""

    value: str
    token: str
    protected: str


def path_tokens(value: str, joins: Callable[[str], bool]) -> list[str]:
    """Every path-like token `value` could hand a server, `value` itself first.

    `joins` says whether a text ending in a separator could begin a path, so
    that a path holding that separator is a token too (`_PathBeginnings`).
    """
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
        braces = _BRACES.search(token)
        if braces is not None:
            # /srv/{conf,data} is /srv/conf and /srv/data to a shell or a glob library.
            head, tail = token[: braces.start()], token[braces.end() :]
            pending.extend(head + choice + tail for choice in braces.group(1).split(","))
        if any(char in token for char in "'\"\\"):
            # A shell string's quoted or escaped word is one path to the shell:
            # 'it'\''s', Application\ Support.
            with contextlib.suppress(ValueError):  # unbalanced quotes: the spans still stand
                pending.extend(shlex.split(token))
        pending.extend(span for span in _spans(token, joins) if span != token)
    return tokens


def _spans(token: str, joins: Callable[[str], bool]) -> Iterator[str]:
    """Each part of `token` between separators, and each run of parts `joins` lets through.

    A run starts at the beginning or after any separator and crosses a
    separator only when `joins` says the text up to and including it could
    begin a path: a space inside a real path does not end it.
    """
    starts = [0] + [index + 1 for index, char in enumerate(token) if char in _SEPARATORS]
    for start in starts:
        end = start
        while end < len(token):
            if token[end] in _SEPARATORS:
                if end > start:
                    yield token[start:end]
                if not joins(token[start : end + 1]):
                    break
            end += 1
        else:
            if end > start:
                yield token[start:]


class _PathBeginnings:
    """Whether a text ending in a separator could begin a path a server is handed.

    It could when the separator continues the text's last component into a
    component of a protected path, or into the name of an entry that exists
    in the directory the text names (a link named `my link` to the
    configuration's directory is as real as the directory).
    """

    def __init__(self, targets: Iterable[str], cwd: str) -> None:
        self._components = {part for target in targets for part in target.split(os.sep) if part}
        self._cwd = cwd
        # The names in each directory a text names, sorted, so that a prefix is one
        # binary search however many entries it holds and separators a value has.
        self._names: dict[str, list[str]] = {}

    def __call__(self, text: str) -> bool:
        head, slash, partial = text.rpartition("/")
        if any(component.startswith(partial) for component in self._components):
            return True
        names = self._names.get(head + slash)
        if names is None:
            names = self._names[head + slash] = self._sorted_names(head + slash)
        index = bisect.bisect_left(names, partial)
        return index < len(names) and names[index].startswith(partial)

    def _sorted_names(self, named: str) -> list[str]:
        # An absolute path replaces cwd; `/etc ` begins in `/`, `ls ` in cwd.
        directory = os.path.join(self._cwd, os.path.expanduser(named or "."))
        try:
            return sorted(os.listdir(directory))
        except OSError:  # not a directory, or one this user cannot list: nothing begins there
            return []


def _resolved_forms(token: str, cwd: str) -> set[str]:
    """The paths `token` names for a server in `cwd`: lexically, and with links followed."""
    path = os.path.join(cwd, os.path.expanduser(token))  # an absolute token replaces cwd
    return {os.path.abspath(path), os.path.realpath(path)}


def _glob_reaches(token: str, glob_start: int, cwd: str, target: str) -> bool:
    """Whether the glob `token` could match `target` or a directory above it."""
    cut = token.rfind("/", 0, glob_start)
    directory = token[:cut] if cut > 0 else ("/" if cut == 0 else ".")
    first = token[cut + 1 :].split("/")[0]
    for form in _resolved_forms(directory, cwd):
        base = form.rstrip(os.sep) + os.sep
        if not target.startswith(base):
            continue
        component = target[len(base) :].split(os.sep)[0]
        # fnmatch's * also matches a leading dot, which errs on the side of refusing.
        if "**" in first or fnmatch.fnmatchcase(component, first):
            return True
    return False


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
            # macOS's file systems take a name in either Unicode normalization as one name.
            for spelled in (
                form,
                unicodedata.normalize("NFC", form),
                unicodedata.normalize("NFD", form),
            ):
                if spelled not in targets:
                    targets.append(spelled)
    values = [(argument, argument) for argument in server.command]
    values += [(entry, entry.partition("=")[2]) for entry in server.env]
    joins = _PathBeginnings(targets, directory)
    for shown, value in values:
        for token in path_tokens(value, joins):
            glob = _GLOB.search(token)
            for target in targets:
                forms = _resolved_forms(token, directory)
                reached = any(_names_or_holds(form, target) for form in forms)
                if glob is not None and not reached:
                    reached = _glob_reaches(token, glob.start(), directory, target)
                if reached:
                    return OperatorFileReach(value=shown, token=token, protected=target)
    return None
