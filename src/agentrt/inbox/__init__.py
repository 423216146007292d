"""The approval inbox: a local web page to see waiting approvals and decide them.

`agentrt inbox` (or the proxy, with `"inbox"` in its configuration) serves
it on loopback.  The page is a thin view over the store: it shows what the
store holds and decides through the same `agentrt.approvals.approve` and
`reject` the command calls.  See docs/inbox.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from .._lazy import lazy_names

if TYPE_CHECKING:
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

# Imported on first use, so `agentrt.inbox.review` (which the terminal's
# `approve` shares with the page) does not bring in the web server.
_WHERE: Final = {
    "CSP": "._app",
    "InboxState": "._app",
    "create_app": "._app",
    "DEFAULT_LISTEN": "._serve",
    "InboxError": "._serve",
    "Listener": "._serve",
    "RunningInbox": "._serve",
    "notify_waiting": "._serve",
    "parse_listen": "._serve",
    "read_or_create_token": "._serve",
    "running_inbox": "._serve",
    "ToolInfo": "._views",
}


__getattr__ = lazy_names(__name__, _WHERE, globals())
