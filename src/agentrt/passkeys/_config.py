"""proxy.json's passkey mode: `"approval_auth": "passkey"`, `"approvers"` (the registry) and
`"approvals"` (a quorum by side-effect class), checked with the rest of the file."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

from ..sanitize import sanitize
from ._mode import PasskeyMode, QuorumRule

__all__ = ["parse_passkey_mode", "tool_quorum"]

_SIDE_EFFECTS: Final = frozenset({"read_only", "local_mutation", "remote_mutation", "destructive"})
_MAX_QUORUM: Final = 16


def parse_passkey_mode(
    top: Mapping[str, Any],
    path_field: Callable[[Any, str], Path],
    fail: Callable[[str, str], Exception],
) -> PasskeyMode | None:
    """Passkey mode as the file asks, or None (`"approval_auth"` absent or `"label"`)."""
    auth = top.get("approval_auth", "label")
    if auth not in ("label", "passkey"):
        raise fail("approval_auth", 'must be "passkey" or "label"')
    if auth == "label":
        for name in ("approvers", "approvals"):
            if name in top:
                raise fail(name, 'counts approvers\' passkeys: it needs "approval_auth": "passkey"')
        return None
    if "inbox" not in top:
        raise fail("approval_auth", 'is "passkey", so decisions are made in the inbox: add "inbox"')
    if "approve_in_host" in top:
        raise fail(
            "approve_in_host",
            'is refused with "approval_auth": "passkey": a host\'s form is no approver\'s passkey',
        )
    registry = path_field(top.get("approvers", "approvers.json"), "approvers")
    quorum: dict[str, int] = {}
    rules = top.get("approvals", {})
    if not isinstance(rules, dict):
        raise fail("approvals", 'must be a JSON object such as {"destructive": {"require": 2}}')
    for name, rule in rules.items():
        where = f"approvals.{sanitize(str(name))}"
        if name not in _SIDE_EFFECTS:
            raise fail(where, "is not a side-effect class")
        if not isinstance(rule, dict) or set(rule) != {"require"}:
            raise fail(where, 'must be {"require": N}')
        count = rule["require"]
        if not _is_quorum(count):
            raise fail(f"{where}.require", f"must be a whole number from 1 to {_MAX_QUORUM}")
        quorum[name] = count
    return PasskeyMode(registry, QuorumRule(quorum))


def _is_quorum(count: Any) -> bool:
    return not isinstance(count, bool) and isinstance(count, int) and 1 <= count <= _MAX_QUORUM


def tool_quorum(raw: Any, where: str, fail: Callable[[str, str], Exception]) -> int:
    """A tool rule's `"approvals": {"require": N}`: the distinct approvers its approvals
    need, refused in one sentence naming the rule unless N is 1 to 16."""
    if not isinstance(raw, dict) or set(raw) != {"require"}:
        raise fail(where, 'must be {"require": N}')
    if not _is_quorum(raw["require"]):
        raise fail(f"{where}.require", f"must be a whole number from 1 to {_MAX_QUORUM}")
    return int(raw["require"])
