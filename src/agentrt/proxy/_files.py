"""Stand-ins for `agentrt.mcp`'s file readers until that module lands.

Same rule as `agentrt.mcp.read_owned`: the open descriptor must be a regular
file owned by the current user that neither group nor others can write.
Delete this module and import from `agentrt.mcp` once it exports
`read_owned`, `read_rules` and `Rules`.
"""

from __future__ import annotations

import os
import stat
from typing import Any

from ..canonical import canonical_json
from ..mcp._rules import Rules, rules_from_json

__all__ = ["read_owned", "read_rules", "rules_from_object"]


def read_owned(path: str | os.PathLike[str]) -> bytes:
    """The bytes of `path`, only when the open file is a regular file owned by
    this user that neither group nor others can write."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        status = os.fstat(descriptor)
        if not stat.S_ISREG(status.st_mode):
            raise ValueError(f"{path} is not a regular file")
        if status.st_uid != os.getuid():
            raise ValueError(f"{path} is not owned by the current user")
        if status.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise ValueError(
                f"{path} can be written by others (mode {stat.S_IMODE(status.st_mode):o}); "
                "make it owner-only"
            )
        chunks: list[bytes] = []
        while chunk := os.read(descriptor, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(descriptor)


def rules_from_object(document: Any, source: str) -> Rules:
    """The `Rules` an inline rules object describes, checked like a rules file."""
    file_rules = rules_from_json(canonical_json(document), source=source)
    return {tool: rule.to_rule() for tool, rule in file_rules.items()}


def read_rules(path: str | os.PathLike[str]) -> Rules:
    """Read a rules file through `read_owned`."""
    file_rules = rules_from_json(read_owned(path), source=str(path))
    return {tool: rule.to_rule() for tool, rule in file_rules.items()}
