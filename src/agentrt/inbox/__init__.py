"""The approval inbox: a local web page to see waiting approvals and decide them.

`agentrt inbox` (or the proxy, with `"inbox"` in its configuration) serves
it on loopback.  The page is a thin view over the store: it shows what the
store holds and decides through the same `agentrt.approvals.approve` and
`reject` the command calls.  See docs/inbox.md.
"""

from __future__ import annotations

from ._app import CSP, InboxState, create_app
from ._serve import (
    DEFAULT_LISTEN,
    InboxError,
    Listener,
    RunningInbox,
    notify_waiting,
    parse_listen,
    read_or_create_token,
    running_inbox,
)
from ._views import ToolInfo

__all__ = [
    "CSP",
    "DEFAULT_LISTEN",
    "InboxError",
    "InboxState",
    "Listener",
    "RunningInbox",
    "ToolInfo",
    "create_app",
    "notify_waiting",
    "parse_listen",
    "read_or_create_token",
    "running_inbox",
]
