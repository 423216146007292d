"""Approve in the host: a held call asks the host's own user, through form elicitation.

Opt-in (`"approve_in_host": true` in the configuration).  When a call waits for
a person and its host advertised form elicitation (a host on the 2026-07-28
revision through its call's input-required result), the proxy asks the host's
user the same sanitized, hash-bound view `agentrt approve` prints (the tool, its
server, the change, the reason) with approve / reject and a note, and, where a
standing grant may be given, approve-and-grant at the operator's maximum, its
scope and hash shown in the message.  The answer is
an operator's decision like any other, recorded through `approvals.py` `by`
`host:<the host's client name>` against the hash of what was shown: approve →
the call runs in the same request; reject → rejected with the note; decline →
rejected, the note saying it was declined in the host; cancel, no answer or an
error → the approval keeps waiting for the CLI or the inbox.

What it trusts is the host's UI, not the model: a model cannot answer an
elicitation, but a host that answers them on its own (auto-accept) can; so it
is off by default, refused for the classes, tools and servers the configuration
excludes (default: `destructive`), and used only over stdio, where the proxy
serves exactly one host (one principal).  SECURITY.md says so.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, Final

import anyio

from .. import approvals
from ..errors import AgentrtError
from ..grants import GrantRequest, GrantScope, grant_scope
from ..inbox.review import displayed_hash
from ..sanitize import sanitize
from ..store import ApprovalRecord, ApprovalStatus, Store
from ..tools import ToolSpec
from ._input_required import HostCall, is_stateless
from ._log import log_line
from ._plain import field

if TYPE_CHECKING:
    # The SDK's request context, or the stdio front's (`_dispatch`), which has its shape.
    from mcp.server.context import ServerRequestContext

__all__ = ["DECLINED_NOTE", "HostApproval", "HostAsk"]

HostAsk = Callable[[ApprovalRecord], Awaitable[None]]
"""Ask the host's user about one waiting approval; returns once it is decided or left."""

DECLINED_NOTE: Final = "declined in the host"
_MESSAGE_CHARS: Final = 8000
_NAME_CHARS: Final = 64
_FORM: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "decision": {
            "type": "string",
            "title": "Decision",
            "enum": ["approve", "reject"],
            "enumNames": ["Approve this exact call", "Reject it"],
        },
        "note": {
            "type": "string",
            "title": "Note",
            "description": "Kept with the decision; on a rejection, what the model is told.",
        },
    },
    "required": ["decision"],
}


@dataclass(frozen=True, slots=True)
class HostApproval:
    """The configuration's `"approve_in_host"`: which calls may be decided in the host, and
    how long a host's answer is waited for."""

    exclude_classes: frozenset[str] = frozenset({"destructive"})
    exclude_tools: frozenset[str] = frozenset()
    exclude_servers: frozenset[str] = frozenset()
    wait: float = 600.0

    def asker(
        self,
        store: Store,
        ctx: ServerRequestContext[Any],
        spec: ToolSpec,
        server: str | None,
        log: IO[str],
        *,
        call: HostCall | None = None,
    ) -> HostAsk | None:
        """The asker for one host call, or None where the host may not be asked.  A host on
        the 2026-07-28 revision has no channel for the proxy's request: it is asked through
        its call's input-required result (`call`), and answers in its retry."""
        if (
            str(spec.side_effect) in self.exclude_classes
            or spec.name in self.exclude_tools
            or (server is not None and server in self.exclude_servers)
            or not _host_has_form_elicitation(ctx)
        ):
            return None
        by = f"host:{_client_name(ctx)}"

        async def ask(approval: ApprovalRecord) -> None:
            shown = displayed_hash(approval)
            # A grant is offered only where one may be given, and then at the operator's
            # maximum, its scope and hash shown in the message before it is chosen.
            scope = await store.run(_grant_on_offer, store, approval)
            message = _message(approval, server, shown, scope)
            params = {"message": message, "requestedSchema": _form(scope is not None)}
            try:
                with anyio.move_on_after(self.wait):
                    if call is not None and is_stateless(ctx.protocol_version):
                        # The question rides the call's result; the host's retry answers it.
                        asked = await call.ask("elicitation/create", params, self.wait)
                        if asked is None:
                            return  # the call ended or the host never answered: it waits
                        answer: Mapping[str, Any] = asked
                    else:
                        answer = await ctx.session._request_outbound.send_raw_request(
                            "elicitation/create", params, None
                        )
                    await store.run(_decide, store, approval, shown, by, answer, scope)
            except AgentrtError as exc:
                # Decided elsewhere meanwhile, expired, changed: the gate's answer says which.
                log_line(log, f"agentrt proxy: the host's answer on approval "
                         f"{approval.approval_id} was not recorded: "
                         f"{sanitize(str(exc))}")  # fmt: skip
            except Exception as exc:
                # A host that cannot answer leaves the approval waiting for the CLI or inbox.
                log_line(log, f"agentrt proxy: the host was not asked about approval "
                         f"{approval.approval_id}: {sanitize(str(exc))}")  # fmt: skip

        return ask


def _host_has_form_elicitation(ctx: ServerRequestContext[Any]) -> bool:
    elicitation = field(ctx.session.client_capabilities, "elicitation")
    if elicitation is None:
        return False
    # An empty `elicitation: {}` (the 2025-06-18 form) is form mode.
    return field(elicitation, "form") is not None or field(elicitation, "url") is None


def _client_name(ctx: ServerRequestContext[Any]) -> str:
    name = field(field(ctx.session.client_params, "clientInfo", "client_info"), "name")
    return sanitize(name or "unnamed")[:_NAME_CHARS]


def _grant_on_offer(store: Store, approval: ApprovalRecord) -> GrantScope | None:
    """The standing grant the form may offer with this approval, or None where none may be."""
    try:
        return grant_scope(store, approval, GrantRequest())
    except AgentrtError:
        return None


def _form(with_grant: bool) -> dict[str, Any]:
    if not with_grant:
        return _FORM
    decision = dict(_FORM["properties"]["decision"])
    decision["enum"] = ["approve", "approve_and_grant", "reject"]
    decision["enumNames"] = [
        "Approve this exact call",
        "Approve it, and give the standing grant described",
        "Reject it",
    ]
    return {**_FORM, "properties": {**_FORM["properties"], "decision": decision}}


def _message(
    approval: ApprovalRecord, server: str | None, shown: str, scope: GrantScope | None = None
) -> str:
    # The lines `agentrt approve` prints (sanitized, hash last): the same view, decided
    # against the same hash.  Imported here: the command's module is above the proxy.
    from ..cli._review import review_lines

    head = [
        "agentrt: a call waits for your approval. Approving runs exactly this request, once.",
        f"server  {sanitize(server or '-')}",
    ]
    offer = (
        []
        if scope is None
        else ["", "Approve and grant also gives, with the approval:", *scope.lines()]
    )
    text = "\n".join([*head, *review_lines(approval), *offer])
    if len(text) > _MESSAGE_CHARS:
        text = text[:_MESSAGE_CHARS] + f"\n… cut; the full request: agentrt approve (hash {shown})"
    return text


def _decide(
    store: Store,
    approval: ApprovalRecord,
    shown: str,
    by: str,
    answer: Mapping[str, Any],
    scope: GrantScope | None = None,
) -> None:
    action = answer.get("action")
    content = answer.get("content") if isinstance(answer.get("content"), dict) else {}
    assert isinstance(content, dict)
    note = content.get("note") if isinstance(content.get("note"), str) else ""
    assert isinstance(note, str)
    current = store.get_approval(approval.approval_id)
    if current.status is not ApprovalStatus.PENDING:
        return  # decided elsewhere while the host was asked
    run_id, approval_id = approval.run_id, approval.approval_id
    if action == "accept" and content.get("decision") == "approve":
        approvals.approve(store, run_id, approval_hash=shown, approval_id=approval_id,
                          by=by, note=note)  # fmt: skip
    elif action == "accept" and content.get("decision") == "approve_and_grant" and scope:
        # Given only against the scope's hash shown in the message.
        approvals.approve(store, run_id, approval_hash=shown, approval_id=approval_id,
                          by=by, note=note,
                          grant=GrantRequest(scope_hash=scope.scope_hash))  # fmt: skip
    elif action == "accept" and content.get("decision") == "reject":
        approvals.reject(store, run_id, approval_hash=shown, approval_id=approval_id,
                         by=by, note=note)  # fmt: skip
    elif action == "decline":
        approvals.reject(store, run_id, approval_hash=shown, approval_id=approval_id,
                         by=by, note=DECLINED_NOTE)  # fmt: skip
    # cancel, or anything else: the approval keeps waiting.
