"""agentrt.mcp: an MCP server's tools as agentrt tools, under the operator's rules.

The operator classifies, the server only describes.  `pin` records what a
server's tools present (name, description, input schema, annotations) for an
operator to review and store; `load` connects again and returns an agentrt
tool for every pinned tool that has a `Rule` and still matches its pin, with a
`Report` saying what happened to every other one.  A server is third-party
code, so it gets as little of the operator's process as it needs.

A stdio server that dies is started again on the next call to one of its
tools and held to its pins again (a changed tool is refused); an HTTP
session is not re-established.

`pin` also pins a server's prompts, resources and resource templates (a
description hash and a shape hash each); the proxy holds them to those pins
and forwards them.  A server's sampling, elicitation and roots requests are
refused unless the call carries a `CallContext` whose `ask` answers them
(handed to `Gate.step(..., context=...)`, which passes it to the tool untouched)
and the `Server` advertises the capability (`client_capabilities`); the same
context relays the server's progress and log lines for that call.

Out of scope: the server side of MCP, HTTP reconnection, input-required
round trips unless a call's `CallContext` has an `ask` (the proxy's does), and
`tools/list_changed` (ignored until the next load, or the next restart, unless the
caller relists with `Upstream.relist`, as the proxy does; on the 2026-07-28
revision a server tells of it only on the `subscriptions/listen` stream a
connection holds while its owner runs `Connection.listen.run`, `_subscriptions.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from .._lazy import lazy_names

if TYPE_CHECKING:
    from ._connection import (
        MAX_TOOL_PAGES,
        MAX_TOOLS,
        Connection,
    )
    from ._context import AskRefused, CallContext
    from ._errors import LoadError, MCPError, OperatorFileError, PinError, ServerToolError
    from ._files import owned_privately, read_manifest, read_owned, read_rules
    from ._http import MAX_RESPONSE_BODY_BYTES
    from ._load import Refusal, Registration, Report, load
    from ._manifest import Manifest, PinnedTool
    from ._pin import pin
    from ._reach import OperatorFileReach, find_operator_file_reach
    from ._rules import FileRule, Rule, Rules, parse_duration, rules_from_json
    from ._sandbox import Sandbox
    from ._server import DEFAULT_MAX_CONTENT_BYTES, Server

__all__ = [
    "DEFAULT_MAX_CONTENT_BYTES",
    "MAX_RESPONSE_BODY_BYTES",
    "MAX_TOOLS",
    "MAX_TOOL_PAGES",
    "AskRefused",
    "CallContext",
    "Connection",
    "FileRule",
    "LoadError",
    "MCPError",
    "Manifest",
    "OperatorFileError",
    "OperatorFileReach",
    "PinError",
    "PinnedTool",
    "Refusal",
    "Registration",
    "Report",
    "Rule",
    "Rules",
    "Sandbox",
    "Server",
    "ServerToolError",
    "find_operator_file_reach",
    "load",
    "owned_privately",
    "parse_duration",
    "pin",
    "read_manifest",
    "read_owned",
    "read_rules",
    "rules_from_json",
]

# Each name is imported on first use, so reading a proxy's configuration (which needs
# `Server` and the rules) does not load the client, the load checks and the gate.
_WHERE: Final = {
    "MAX_RESPONSE_BODY_BYTES": "._http",
    "MAX_TOOL_PAGES": "._connection",
    "MAX_TOOLS": "._connection",
    "Connection": "._connection",
    "AskRefused": "._context",
    "CallContext": "._context",
    "LoadError": "._errors",
    "MCPError": "._errors",
    "OperatorFileError": "._errors",
    "PinError": "._errors",
    "ServerToolError": "._errors",
    "owned_privately": "._files",
    "read_manifest": "._files",
    "read_owned": "._files",
    "read_rules": "._files",
    "Refusal": "._load",
    "Registration": "._load",
    "Report": "._load",
    "load": "._load",
    "Manifest": "._manifest",
    "PinnedTool": "._manifest",
    "pin": "._pin",
    "OperatorFileReach": "._reach",
    "find_operator_file_reach": "._reach",
    "FileRule": "._rules",
    "Rule": "._rules",
    "Rules": "._rules",
    "parse_duration": "._rules",
    "rules_from_json": "._rules",
    "Sandbox": "._sandbox",
    "DEFAULT_MAX_CONTENT_BYTES": "._server",
    "Server": "._server",
}


__getattr__ = lazy_names(__name__, _WHERE, globals())
