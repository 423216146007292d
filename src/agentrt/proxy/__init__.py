"""`agentrt proxy`: an MCP server a host starts in place of its real servers.

It connects to them through `agentrt.mcp`, offers the host only the tools
that loaded (and `gate_status`), and hands every `tools/call` to a Gate:
recorded, validated, held to the policy, paused on an approval bound to the
exact request, executed upstream only when allowed, and recorded again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from .._lazy import lazy_names

if TYPE_CHECKING:
    from ._answers import Prefix
    from ._lifecycle import serve_config
    from ._serve import serve
    from ._status import STATUS_TOOL
    from .config import ConfigError, ProxyConfig, UpstreamConfig, load_config, parse_duration

__all__ = [
    "STATUS_TOOL",
    "ConfigError",
    "Prefix",
    "ProxyConfig",
    "UpstreamConfig",
    "load_config",
    "parse_duration",
    "serve",
    "serve_config",
]

# Each name is imported on first use, so `agentrt.proxy.config` (which `pin` and
# `check` read) does not load the serving side.
_WHERE: Final = {
    "Prefix": "._answers",
    "serve": "._serve",
    "serve_config": "._lifecycle",
    "STATUS_TOOL": "._status",
    "ConfigError": ".config",
    "ProxyConfig": ".config",
    "UpstreamConfig": ".config",
    "load_config": ".config",
    "parse_duration": ".config",
}


__getattr__ = lazy_names(__name__, _WHERE, globals())
