"""The inbox's side of passkey mode: the challenge a page asks its authenticator to sign,
and a decision that carries the assertion (the handlers stay thin; `_decide.py` decides)."""

from __future__ import annotations

from typing import Any, Final

from starlette.responses import JSONResponse, Response

from ..errors import AgentrtError
from ..grants import GrantRequest
from ..sanitize import sanitize
from ..store import Store
from ._assertion import Assertion, decision_challenge
from ._decide import APPROVE, REJECT, PasskeyDecision, decide
from ._mode import PasskeyMode
from ._registry import RP_ID, b64url, read_registry

__all__ = ["PasskeyMode", "challenge_options", "decide_in_inbox"]

_TIMEOUT_MS: Final = 120_000


def _refused(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def challenge_options(store: Store, mode: PasskeyMode, asked: dict[str, Any]) -> Response:
    """The `publicKey` options for `navigator.credentials.get` over one decision."""
    names = ("approval_id", "approval_hash", "verdict")
    approval_id, approval_hash, verdict = (asked.get(name) for name in names)
    scope_hash = asked.get("scope_hash")
    if not all(isinstance(value, str) and value for value in (approval_id, approval_hash)):
        return _refused(400, "approval_id and approval_hash are required")
    if verdict not in (APPROVE, REJECT):
        return _refused(400, "verdict must be approve or reject")
    if scope_hash is not None and not isinstance(scope_hash, str):
        return _refused(400, "scope_hash must be text")
    try:
        registry = read_registry(mode.registry)
    except AgentrtError as exc:
        return _refused(409, sanitize(str(exc)))
    try:
        approval = store.get_approval(str(approval_id))
    except AgentrtError as exc:
        return _refused(409, sanitize(str(exc)))
    challenge = decision_challenge(
        str(approval_id), str(approval_hash), verdict, scope_hash, mode.quorum.required(approval)
    )
    return JSONResponse(
        {
            "challenge": b64url(challenge),
            "rpId": RP_ID,
            "timeout": _TIMEOUT_MS,
            "userVerification": "required",
            "allowCredentials": [
                {"type": "public-key", "id": b64url(approver.credential_id)}
                for approver in registry.approvers
            ],
        }
    )


async def decide_in_inbox(
    store: Store,
    mode: PasskeyMode,
    decision: dict[str, Any],
    run_id: str,
    approval_id: str,
    approval_hash: str,
    verdict: str,
    note: str,
    grant: GrantRequest | None,
    origin: str,
) -> Response:
    """The inbox's `/api/decide` in passkey mode: the decision needs its assertion."""
    if decision.get("assertion") is None:
        return _refused(
            403, "this inbox decides only with an approver's passkey; the decision has none"
        )
    try:
        assertion = Assertion.from_json(decision["assertion"])
    except ValueError as exc:
        return _refused(400, str(exc))

    def decided() -> PasskeyDecision:
        registry = read_registry(mode.registry)
        return decide(
            store, registry, run_id, approval_id=approval_id, approval_hash=approval_hash,
            verdict=verdict, assertion=assertion, origin=origin, quorum=mode.quorum,
            note=note, grant=grant,
        )  # fmt: skip

    try:
        outcome = await store.run(decided)
    except AgentrtError as exc:
        return _refused(409, sanitize(str(exc)))
    approval = await store.run(store.get_approval, outcome.approval.approval_id)
    return JSONResponse(
        {
            "approval_id": sanitize(approval.approval_id),
            "status": str(approval.status),
            "by": sanitize(approval.decided_by or outcome.approver),
            "approval_hash": approval.approval_hash,
            "approvers": [sanitize(name) for name in outcome.approvers],
            "required": outcome.required,
            "waiting_for": outcome.waiting_for,
        }
    )
