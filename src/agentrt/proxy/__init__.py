"""`agentrt proxy`: an MCP server a host starts in place of its real servers.

It connects to them through `agentrt.mcp`, offers the host only the tools
that loaded (and `gate_status`), and hands every `tools/call` to a Gate.
"""

from __future__ import annotations

from .config import ConfigError, ProxyConfig, UpstreamConfig, load_config, parse_duration

__all__ = ["ConfigError", "ProxyConfig", "UpstreamConfig", "load_config", "parse_duration"]
