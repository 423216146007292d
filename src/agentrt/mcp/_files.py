"""Reading the operator's files: only what the current user owns and nobody else can write.

Whoever can write the manifest or the rules chooses how every tool is
classified, so a file is read only when it is a regular file owned by the
current user that neither its group nor others can write.  The check is
made on the open descriptor, so the file read is the file checked.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path
from typing import Final

from ..sanitize import sanitize
from ._errors import OperatorFileError
from ._manifest import Manifest
from ._rules import FileRule, rules_from_json

__all__ = [
    "MAX_OPERATOR_FILE_BYTES",
    "owned_privately",
    "read_manifest",
    "read_owned",
    "read_rules",
    "write_private",
]

MAX_OPERATOR_FILE_BYTES: Final = 16 * 1024 * 1024
"""A manifest or rules file larger than this is refused rather than read into memory."""


def owned_privately(path: str | os.PathLike[str], status: os.stat_result) -> None:
    """Raise `OperatorFileError` naming `path` unless `status` is of a regular file
    owned by the current user that neither group nor others can write."""
    shown = sanitize(os.fspath(path))
    mode = stat.S_IMODE(status.st_mode)
    if not stat.S_ISREG(status.st_mode):
        raise OperatorFileError(f"refusing to read {shown}: it is not a regular file")
    if status.st_uid != os.geteuid():
        raise OperatorFileError(
            f"refusing to read {shown}: it is owned by uid {status.st_uid}, "
            f"not by the current user (uid {os.geteuid()})"
        )
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise OperatorFileError(
            f"refusing to read {shown}: its mode {mode:04o} lets group or others write it "
            f"(chmod go-w {shown})"
        )


def read_owned(path: str | os.PathLike[str]) -> bytes:
    """Return the bytes of `path` when `owned_privately` accepts the file as opened.

    A symbolic link is refused rather than followed: the link's owner, who
    is not checked, would choose which file is read.  The file is opened
    without blocking, so a FIFO is refused instead of hanging the reader.
    """
    shown = sanitize(os.fspath(path))
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        descriptor = os.open(path, flags)
    except OSError as exc:
        if Path(path).is_symlink():
            raise OperatorFileError(f"refusing to read {shown}: it is a symbolic link") from None
        raise OperatorFileError(
            f"cannot read {shown}: {sanitize(exc.strerror or str(exc))}"
        ) from None
    try:
        owned_privately(path, os.fstat(descriptor))
        chunks: list[bytes] = []
        size = 0
        while chunk := os.read(descriptor, 1 << 16):
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_OPERATOR_FILE_BYTES:
                break
    finally:
        os.close(descriptor)
    data = b"".join(chunks)
    if len(data) > MAX_OPERATOR_FILE_BYTES:
        raise OperatorFileError(
            f"refusing to read {shown}: it is larger than {MAX_OPERATOR_FILE_BYTES} bytes"
        )
    return data


def read_manifest(path: str | os.PathLike[str]) -> Manifest:
    """Read a manifest file through `read_owned`."""
    return Manifest.from_json(read_owned(path), source=sanitize(os.fspath(path)))


def read_rules(path: str | os.PathLike[str]) -> dict[str, FileRule]:
    """Read a rules file through `read_owned`: a JSON object of tool name to `FileRule`.

    An unknown field or a repeated key is refused naming it and the path.
    Convert each entry with `FileRule.to_rule()`.
    """
    return rules_from_json(read_owned(path), source=sanitize(os.fspath(path)))


def write_private(path: Path, text: str) -> None:
    """Replace `path` with `text`, readable and writable by the owner only (0600 under any umask).

    The text goes to a new file beside it that is renamed over the old one,
    so a reader never sees half a manifest, and a symbolic link at `path` is
    replaced, never followed.
    """
    descriptor, temporary = tempfile.mkstemp(
        prefix=f".{path.name}.", suffix=".tmp", dir=path.parent
    )
    try:
        try:
            # The umask can only take bits away from mkstemp's 0600; fchmod
            # makes the mode exact either way.
            os.fchmod(descriptor, 0o600)
            data = text.encode("utf-8")
            while data:
                written = os.write(descriptor, data)
                data = data[written:]
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
