"""Stand-ins for `agentrt.mcp`'s file readers until that module lands.

Same rule as `agentrt.mcp.read_owned`: the open descriptor must be a regular
file owned by the current user that neither group nor others can write.
Delete this module and import from `agentrt.mcp` once it exports
`read_owned`, `read_rules` and `Rules`.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any, Final

from ..canonical import JSONBoundaryError, parse_json
from ..sanitize import sanitize
from ..tools import SideEffect

__all__ = ["Rules", "read_owned", "read_rules", "rules_from_json"]

Rules = dict[str, dict[str, Any]]

_FILE_RULE_FIELDS: Final = frozenset(
    {
        "side_effect",
        "timeout",
        "terminal",
        "description",
        "deny",
        "fixed",
        "rename",
        "allow_hint_mismatch",
    }
)


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


def rules_from_json(document: Any, source: str) -> Rules:
    """Check a parsed rules object: tool name → rule with known fields only."""
    if not isinstance(document, dict):
        raise ValueError(f"{source}: the rules must be a JSON object of tool name to rule")
    rules: Rules = {}
    for tool, rule in document.items():
        if not isinstance(rule, dict):
            raise ValueError(f'{source}: the rule for "{sanitize(tool)}" must be an object')
        for name in rule:
            if name not in _FILE_RULE_FIELDS:
                raise ValueError(
                    f'{source}: the rule for "{sanitize(tool)}" has an unknown field '
                    f'"{sanitize(name)}"'
                )
        if rule.get("side_effect") not in {str(side_effect) for side_effect in SideEffect}:
            raise ValueError(f'{source}: the rule for "{sanitize(tool)}" needs a side_effect')
        rules[tool] = dict(rule)
    return rules


def read_rules(path: str | os.PathLike[str]) -> Rules:
    """Read a rules file through `read_owned`."""
    try:
        document = parse_json(read_owned(path))
    except JSONBoundaryError as exc:
        raise ValueError(f"{Path(path)} is not usable JSON: {exc}") from None
    return rules_from_json(document, str(path))
