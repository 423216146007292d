"""`Sandbox`: what a stdio server may see of this machine, enforced by bubblewrap.

A sandboxed server is started as `bwrap ... -- command`: the system
directories read-only, the paths the rule names bound read-only or
read-write, the command's own installation read-only, a private empty HOME
and /tmp that vanish with it, its own /proc, a minimal /dev, and every
namespace unshared (the network too, unless the rule grants it).  Nothing
else of the operator's files exists inside: not the configuration, not the
manifests, not the database, not `~`.

It fails closed: a server with a sandbox is never started without one.  No
`bwrap`, a kernel that refuses the namespaces, or a system other than Linux
is one sentence naming the fix, and the server does not start.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

from ..sanitize import sanitize
from ._connection_errors import MCPConnectionError

__all__ = [
    "ALWAYS_HIDDEN",
    "PRIVATE_HOME",
    "Sandbox",
    "sandbox_for_arguments",
    "sandboxed_command",
]

PRIVATE_HOME: Final = "/home/sandbox"
"""HOME inside every sandbox: an empty tmpfs, gone when the server exits."""

_PRIVATE_TMP: Final = "/tmp"  # noqa: S108 - a fresh tmpfs inside the sandbox, not the host's /tmp

# Bound read-only when they exist; a merged-/usr link (/bin -> usr/bin) is
# recreated as the same link, so paths resolve inside as they do outside.
_SYSTEM_DIRS: Final = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")

ALWAYS_HIDDEN: Final = (
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/sudoers",
    "/etc/sudoers.d",
    "/etc/ssh",
    "/etc/ssl/private",
    "/etc/security/opasswd",
)
"""Secrets under /etc no server is shown, whatever the rule says."""

# What an interpreter's installation needs: its programs, its libraries and,
# for a Python virtual environment, the file naming its base interpreter.
# `share`, `etc` and the rest of a prefix such as ~/.local stay out.
_PREFIX_PARTS: Final = ("bin", "sbin", "lib", "lib64", "libexec", "pyvenv.cfg")

_HOME_KINDS: Final = ("private",)
_DEVICE_KINDS: Final = ("minimal",)

# Namespaces are probed once per bwrap binary; only success is remembered,
# so a refusal is re-checked (and re-explained) on the next start.
_working_bwrap: set[tuple[str, int, int]] = set()


@dataclass(frozen=True, slots=True)
class Sandbox:
    """What a stdio server may reach: `read` and `write` paths, and the network only if granted.

    Paths are absolute.  `home` is "private" (an empty HOME and TMPDIR that
    vanish with the server); `devices` is "minimal" (null, zero, full,
    random, urandom, tty, a private pts and shm).  `hide` names further files
    or directories to mask where a bind would otherwise show them (the
    secrets of `/etc` in `ALWAYS_HIDDEN` are always masked).
    """

    read: list[str] = field(default_factory=list)
    write: list[str] = field(default_factory=list)
    network: bool = False
    home: str = "private"
    devices: str = "minimal"
    hide: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        for kind, paths in (("read", self.read), ("write", self.write), ("hide", self.hide)):
            if isinstance(paths, str) or not all(isinstance(path, str) for path in paths):
                raise ValueError(f"sandbox {kind} must be a list of paths")
            for path in paths:
                if not os.path.isabs(path) or "\0" in path:
                    raise ValueError(
                        f"sandbox {kind} path {sanitize(repr(path))} is not an absolute path"
                    )
                if kind != "hide" and os.path.normpath(path) == "/":
                    raise ValueError(
                        f"sandbox {kind} path / would show the whole filesystem; "
                        "name the directories the server needs"
                    )
        if not isinstance(self.network, bool):
            raise ValueError("sandbox network must be true or false")
        if self.home not in _HOME_KINDS:
            raise ValueError(
                f"sandbox home {sanitize(repr(self.home))} is not offered; "
                'only "private" (an empty HOME that vanishes) is'
            )
        if self.devices not in _DEVICE_KINDS:
            raise ValueError(
                f'sandbox devices {sanitize(repr(self.devices))} is not offered; only "minimal" is'
            )


def sandbox_for_arguments(command: str, args: Sequence[str]) -> Sandbox:
    """A sandbox for a server as it is configured elsewhere: what its arguments name, no network.

    Each argument (or the value of `--flag=value`) that is a path (absolute,
    `~/…` or `./…`) naming an existing directory is granted for writing (a
    server handed a directory was handed it to work in; the operator's rules
    still classify every write), an existing file for reading.  The filesystem
    root, the home directory and its ancestors are never granted: they would
    undo the sandbox.  The command itself needs no entry; its installation is
    bound on its own.
    """
    del command  # found and bound at start, whatever it is
    home = os.path.realpath(os.path.expanduser("~"))
    read: list[str] = []
    write: list[str] = []
    for argument in args:
        for candidate in dict.fromkeys((argument, argument.partition("=")[2])):
            if not candidate or not (candidate.startswith(("/", "~", "."))):
                continue
            path = os.path.realpath(os.path.expanduser(candidate))
            if path == "/" or _within(home, path):
                continue
            target = write if os.path.isdir(path) else read if os.path.isfile(path) else None
            if target is not None and path not in target:
                target.append(path)
    return Sandbox(read=read, write=write)


def _within(path: str, directory: str) -> bool:
    """True when `path` is `directory` or lies beneath it (both normalised, absolute)."""
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _find_bwrap() -> str | None:
    return shutil.which("bwrap")


def _refuse(name: str, problem: str) -> MCPConnectionError:
    return MCPConnectionError(
        name, f'server "{sanitize(name)}" has a sandbox and was not started: {problem}'
    )


def _check_namespaces(name: str, bwrap: str) -> None:
    """Run bwrap once, empty, to learn whether the kernel grants its namespaces."""
    try:
        status = os.stat(bwrap)
    except OSError as exc:
        raise _refuse(name, f"{sanitize(bwrap)}: {sanitize(exc.strerror or str(exc))}") from None
    key = (bwrap, status.st_ino, status.st_mtime_ns)
    if key in _working_bwrap:
        return
    probe = [bwrap, "--unshare-all", "--unshare-user", "--die-with-parent"]
    probe += ["--ro-bind", "/", "/", "--", "/bin/true"]
    try:
        finished = subprocess.run(probe, capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise _refuse(name, f"{sanitize(bwrap)} could not be run: {sanitize(str(exc))}") from None
    if finished.returncode != 0:
        said = sanitize(finished.stderr.decode("utf-8", errors="replace").strip()[:300])
        raise _refuse(
            name,
            f"the kernel refused bwrap its namespaces ({said}); allow unprivileged user "
            "namespaces (sysctl kernel.unprivileged_userns_clone=1 and user.max_user_namespaces "
            "above 0, or the distribution's AppArmor profile for bwrap)",
        )
    _working_bwrap.add(key)


def _resolve_command(name: str, program: str, search_path: str | None) -> str:
    found: str | None
    if "/" in program:
        absolute = os.path.abspath(program)
        found = absolute if os.path.isfile(absolute) and os.access(absolute, os.X_OK) else None
    else:
        found = shutil.which(program, path=search_path if search_path is not None else "")
    if found is None:
        raise MCPConnectionError(
            name,
            f'server "{sanitize(name)}" could not be started: {sanitize(program)}: '
            "No such file or directory",
        )
    return found


def _symlink_chain(path: str) -> list[str]:
    """`path`, then every file its links lead through, ending at the real file."""
    chain = [path]
    current = path
    for _ in range(40):
        if not os.path.islink(current):
            break
        target = os.readlink(current)
        current = os.path.normpath(os.path.join(os.path.dirname(current), target))
        chain.append(current)
    real = os.path.realpath(path)
    if real not in chain:
        chain.append(real)
    return chain


def _shebang_program(path: str, search_path: str | None) -> str | None:
    """The interpreter a script's `#!` line names, found on the server's PATH for `env`."""
    try:
        with open(path, "rb") as handle:
            first = handle.readline(256)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode("utf-8", errors="replace").split()
    if not words:
        return None
    if os.path.basename(words[0]) == "env":
        rest = [word for word in words[1:] if not word.startswith("-") and "=" not in word]
        if not rest:
            return None
        return shutil.which(rest[0], path=search_path if search_path is not None else "")
    return words[0] if os.path.isabs(words[0]) else None


def _install_parts(path: str, home: str) -> list[str]:
    """The parts of the installation `path` belongs to that it needs to run.

    A file in a `node_modules` tree needs the whole outermost tree (its
    dependencies); a version manager's shim (`ROOT/shims/python3`) needs the
    manager's root; a file in `PREFIX/bin` needs that prefix's programs and
    libraries (a virtual environment, a Node or Python install).  A manager
    root or prefix that is `/`, the home directory or above it gives only the file.
    """
    parts = path.split("/")
    if "node_modules" in parts:
        return ["/".join(parts[: parts.index("node_modules") + 1])]
    directory = os.path.dirname(path)
    if os.path.basename(directory) == "shims":
        # A version manager's shim (pyenv, rbenv, asdf) runs the manager,
        # which keeps its code and its interpreters under the same root.
        root = os.path.dirname(directory)
        return [root] if not _home_or_above(home, root) else [path]
    if os.path.basename(directory) in ("bin", "sbin"):
        prefix = os.path.dirname(directory)
        if not _home_or_above(home, prefix):
            return [
                os.path.join(prefix, part)
                for part in _PREFIX_PARTS
                if os.path.lexists(os.path.join(prefix, part))
            ]
    return [path]


def _home_or_above(home: str, directory: str) -> bool:
    """Whether `directory` is `/`, the (real) home or above it, spelled as given or resolved:
    a HOME or a PATH entry reached through a link names the same directory."""
    return any(
        form == "/" or _within(home, form) for form in (directory, os.path.realpath(directory))
    )


def _venv_base(prefix_part: str) -> str | None:
    """The `bin` directory a virtual environment's pyvenv.cfg names as its base interpreter."""
    if os.path.basename(prefix_part) != "pyvenv.cfg":
        return None
    try:
        with open(prefix_part, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                key, equals, value = line.partition("=")
                if equals and key.strip() == "home":
                    return os.path.join(value.strip(), "python")
    except OSError:
        return None
    return None


def _script_argument(arguments: Sequence[str]) -> str | None:
    """The program an interpreter is handed: the first argument not an option, if it is a file."""
    for argument in arguments:
        if argument.startswith("-"):
            continue
        path = os.path.abspath(argument)
        return path if os.path.isfile(path) else None
    return None


def _command_binds(executable: str, arguments: Sequence[str], search_path: str | None) -> list[str]:
    """Every path the command needs read-only to run: itself, its interpreter, their installs,
    and the script it is handed (`node index.js`, `python server.py`).

    Only programs that exist are followed, and the `#!` line only of a file
    the kernel runs: a script handed to an interpreter is never run by its
    `#!` line, which its author chose, so that line names nothing to bind.
    """
    home = os.path.realpath(os.path.expanduser("~"))
    binds: list[str] = []
    script = _script_argument(arguments)
    # (program, whether the kernel runs it, so that its `#!` line counts)
    pending = [(executable, True)] if script is None else [(executable, True), (script, False)]
    seen: set[str] = set()
    while pending:
        program, executed = pending.pop()
        if program in seen or not os.path.isfile(program):
            continue
        seen.add(program)
        for hop in _symlink_chain(program):
            for part in _install_parts(hop, home):
                if part not in binds:
                    binds.append(part)
                base = _venv_base(part)
                if base is not None:
                    pending.append((base, True))
            interpreter = _shebang_program(hop, search_path) if executed else None
            if interpreter is not None:
                pending.append((interpreter, True))
    return [path for path in binds if not _in_system_dir(path) and os.path.lexists(path)]


def _in_system_dir(path: str) -> bool:
    return any(_within(path, system) for system in _SYSTEM_DIRS)


def _depth(path: str) -> int:
    return path.rstrip("/").count("/")


def _bind(option: str, path: str, *, keep_link: bool) -> list[str]:
    if keep_link and os.path.islink(path):
        # A link inside an installation (a venv's lib64 -> lib) stays a link.
        return ["--symlink", os.readlink(path), path]
    return [option, path, path]


def sandboxed_command(
    name: str,
    sandbox: Sandbox,
    command: Sequence[str],
    environment: dict[str, str],
    *,
    bwrap: str | None = None,
) -> list[str]:
    """The argv that runs `command` inside `sandbox`; raises `MCPConnectionError` if it cannot.

    `bwrap` is the program to use (default: `bwrap` on this process's PATH).
    The command is resolved on the server's own PATH first, so what runs
    inside is exactly the file whose installation was bound.
    """
    if not sys.platform.startswith("linux"):
        raise _refuse(
            name,
            f"sandboxes need Linux and bubblewrap, and this is {sanitize(sys.platform)} "
            "(macOS's sandbox-exec is deprecated and not used); run the server on Linux "
            "or remove its sandbox knowingly",
        )
    program = bwrap if bwrap is not None else _find_bwrap()
    if program is None or not os.access(program, os.X_OK):
        raise _refuse(
            name,
            "bwrap was not found on PATH; install bubblewrap "
            "(Debian and Ubuntu: apt-get install bubblewrap)",
        )
    _check_namespaces(name, program)
    for kind, paths in (("read", sandbox.read), ("write", sandbox.write)):
        for path in paths:
            if not os.path.exists(path):
                raise _refuse(name, f"its sandbox {kind} path {sanitize(path)} does not exist")

    search_path = environment.get("PATH")
    executable = _resolve_command(name, command[0], search_path)
    argv = [program, "--unshare-all", "--unshare-user"]
    if sandbox.network:
        argv.append("--share-net")
    argv += ["--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    for system in _SYSTEM_DIRS:
        if os.path.islink(system):
            argv += ["--symlink", os.readlink(system), system]
        elif os.path.isdir(system):
            argv += ["--ro-bind", system, system]
    if sandbox.network:
        resolver = os.path.realpath("/etc/resolv.conf")
        if os.path.exists(resolver) and not _in_system_dir(resolver):
            argv += ["--ro-bind", resolver, resolver]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    argv += ["--tmpfs", _PRIVATE_TMP, "--tmpfs", PRIVATE_HOME]

    # (option, path, whether a link there is recreated as a link): the command's
    # own installation keeps its links; a path the rule names is followed.
    visible: list[tuple[str, str, bool]] = [
        ("--ro-bind", path, True) for path in _command_binds(executable, command[1:], search_path)
    ]
    visible += [("--ro-bind", os.path.normpath(path), False) for path in sandbox.read]
    visible += [("--bind", os.path.normpath(path), False) for path in sandbox.write]
    # Shallower first, so a path named inside another keeps its own mode.
    for option, path, keep_link in sorted(visible, key=lambda bind: _depth(bind[1])):
        argv += _bind(option, path, keep_link=keep_link)

    for path in _masks([*ALWAYS_HIDDEN, *sandbox.hide], [bind[1] for bind in visible]):
        if os.path.isdir(path):
            argv += ["--tmpfs", path, "--remount-ro", path]
        else:
            argv += ["--ro-bind", "/dev/null", path]

    argv += ["--setenv", "HOME", PRIVATE_HOME, "--setenv", "TMPDIR", _PRIVATE_TMP]
    argv += ["--chdir", PRIVATE_HOME, "--remount-ro", "/", "--", executable, *command[1:]]
    return argv


def _masks(hidden: Iterable[str], bound: Sequence[str]) -> list[str]:
    """The hidden paths that exist and a bind or a system directory would otherwise show."""
    masks: list[str] = []
    for path in hidden:
        real = os.path.realpath(path)
        if not os.path.lexists(real) or real in masks:
            continue
        if _in_system_dir(real) or any(_within(real, os.path.realpath(b)) for b in bound):
            masks.append(real)
    return masks
