"""Passkey mode's settings, light enough for the proxy's configuration to hold."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    # Not at run time: the proxy's configuration holds these settings before it spawns
    # its servers, and the store's records are not needed to read them (issue 36).
    from ..store import ApprovalRecord

__all__ = ["PasskeyMode", "QuorumRule"]


@dataclass(frozen=True, slots=True)
class QuorumRule:
    """How many distinct approvers an approval needs: by its tool's own rule
    (`"approvals": {"require": 2}` in the tool's rule, `by_tool` keyed by the gate's name of
    the tool), else by the side-effect class of its tool (`"approvals": {"destructive":
    {"require": 2}}` in proxy.json); 1 otherwise.  The tool's rule wins over its class."""

    by_class: Mapping[str, int]
    by_tool: Mapping[str, int] = field(default_factory=dict)

    def required(self, approval: ApprovalRecord) -> int:
        if approval.tool in self.by_tool:
            return max(1, self.by_tool[approval.tool])
        side_effect = approval.capability.get("side_effect") if approval.capability else None
        if not isinstance(side_effect, str):
            side_effect = approval.kind.removeprefix("tool:")
        return max(1, self.by_class.get(side_effect, 1))


@dataclass(frozen=True, slots=True)
class PasskeyMode:
    """`"approval_auth": "passkey"`: where the approvers' registry is (read again at each
    decision, so a removed approver is refused at once) and the quorum each class needs."""

    registry: Path
    quorum: QuorumRule = field(default_factory=lambda: QuorumRule({}))
