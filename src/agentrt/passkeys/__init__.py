"""Approvers who are people: passkeys (WebAuthn) over each decision, separation of duties
and quorums (docs/identity.md, decisions 0041 and 0042).

The registry of approvers (`_registry.py`), a decision's derived challenge and its
assertion checked with py_webauthn (`_assertion.py`), a decision in passkey mode
(`_decide.py`), the inbox's handlers (`_inbox.py`), registering a passkey
(`_register.py`, for `agentrt approvers add`) and checking every recorded decision
again (`_audit.py`, for `agentrt verify --approvers`).  Nothing here writes SQL: the
events are the ledger's `record_approver_decision` and `record_quorum_reached`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from .._lazy import lazy_names

if TYPE_CHECKING:
    from ._assertion import Assertion, PasskeyRefused, check_assertion, decision_challenge
    from ._audit import DecisionProblem, approval_unproven, audit_decisions
    from ._decide import APPROVE, REJECT, PasskeyDecision, decide
    from ._inbox import challenge_options, decide_in_inbox
    from ._mode import PasskeyMode, QuorumRule
    from ._registry import RP_ID, Approver, Registry, RegistryError, read_registry, write_registry

__all__ = [
    "APPROVE",
    "REJECT",
    "RP_ID",
    "Approver",
    "Assertion",
    "DecisionProblem",
    "PasskeyDecision",
    "PasskeyMode",
    "PasskeyRefused",
    "QuorumRule",
    "Registry",
    "RegistryError",
    "approval_unproven",
    "audit_decisions",
    "challenge_options",
    "check_assertion",
    "decide",
    "decide_in_inbox",
    "decision_challenge",
    "read_registry",
    "write_registry",
]

# Imported on first use: the proxy's configuration reads `PasskeyMode` without the web
# server or py_webauthn.
_WHERE: Final = {
    "Assertion": "._assertion",
    "PasskeyRefused": "._assertion",
    "check_assertion": "._assertion",
    "decision_challenge": "._assertion",
    "DecisionProblem": "._audit",
    "audit_decisions": "._audit",
    "approval_unproven": "._audit",
    "APPROVE": "._decide",
    "REJECT": "._decide",
    "PasskeyDecision": "._decide",
    "decide": "._decide",
    "QuorumRule": "._mode",
    "PasskeyMode": "._mode",
    "challenge_options": "._inbox",
    "decide_in_inbox": "._inbox",
    "RP_ID": "._registry",
    "Approver": "._registry",
    "Registry": "._registry",
    "RegistryError": "._registry",
    "read_registry": "._registry",
    "write_registry": "._registry",
}

__getattr__ = lazy_names(__name__, _WHERE, globals())
