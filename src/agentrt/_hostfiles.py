"""Where MCP hosts keep their server configuration on this machine.

Shared by `agentrt init` (which reads and rewrites these files) and the
proxy's configuration check (a sandboxed server may not be handed write
access to one: rewriting it would take the proxy out of the host).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

__all__ = ["application_support", "config_home", "host_configuration_files", "vscode_user"]


def config_home() -> Path:
    configured = os.environ.get("XDG_CONFIG_HOME")
    return Path(configured) if configured else Path.home() / ".config"


def application_support() -> Path:
    return Path.home() / "Library" / "Application Support"


def vscode_user() -> Path:
    if sys.platform == "darwin":
        return application_support() / "Code" / "User"
    return config_home() / "Code" / "User"


def host_configuration_files() -> list[Path]:
    """Every file a known host (Claude Desktop, Claude Code, Cursor, VS Code) may
    read its servers from, for this user and the working directory, existing or not."""
    home = Path.home()
    desktop = application_support() if sys.platform == "darwin" else config_home()
    cwd = Path.cwd()
    return [
        desktop / "Claude" / "claude_desktop_config.json",
        home / ".claude.json",
        cwd / ".mcp.json",
        home / ".cursor" / "mcp.json",
        cwd / ".cursor" / "mcp.json",
        vscode_user() / "mcp.json",
        vscode_user() / "settings.json",
        cwd / ".vscode" / "mcp.json",
    ]
