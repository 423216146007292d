"""agentrt's version: the one place it is written.  The build reads it (`pyproject.toml`'s
dynamic version), and so do the proxy's answer to a host and its handshake with a server,
without reading the installed distribution's metadata (`importlib.metadata` and `email`
cost ~15 ms of a proxy's start-up, issue 36)."""

from typing import Final

__all__ = ["VERSION"]

VERSION: Final = "0.1.0"
