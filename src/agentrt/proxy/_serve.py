"""`agentrt proxy --config FILE` from the command line: read the configuration, start its
stdio servers, then import the event loop and the rest of the proxy (`_lifecycle`) while
they boot (issue 36, decision 0053).  Only what reading the configuration and starting a
process need is imported before the first spawn."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import NoReturn

from ..errors import AgentrtError, StoreError
from ..sanitize import sanitize
from ._log import log_line
from ._stamps import rule_stamps
from .config import ConfigError, ProxyConfig, load_config

__all__ = ["exit_process", "serve"]


def exit_process(status: int) -> NoReturn:
    """End the `agentrt proxy` process with `status` once `serve` returned: its work is
    recorded and its upstream servers are stopped, so only the interpreter's teardown is
    left, which frees every module (0.4-0.9 s measured on a busy machine) and would
    outlast a host's grace (Claude Code sends SIGKILL 0.5 s after its SIGINT)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)


def serve(
    config_path: str,
    *,
    http: str | None = None,
    allow_remote: bool = False,
    token: str | None = None,
) -> int:
    """`agentrt proxy --config FILE`: load the configuration and serve until the host leaves.

    Loopback only unless `allow_remote` with a `token`.  Returns the exit
    status: 0 after a clean shutdown, 1 when the configuration is refused,
    2 when the database cannot be used (the reason is written to stderr).
    """
    from ..mcp._spawn import discard_started_early

    try:
        config = load_config(config_path)
        # As read: a rules change made while the servers start is taken at the watch's first look.
        stamps = rule_stamps(config)
        if http is None:
            _start_early(config)
        # The event loop and the rest of the proxy, once its servers boot.
        import anyio

        from ._lifecycle import event_loop_factory, serve_config

        return anyio.run(
            lambda: serve_config(
                config, http=http, allow_remote=allow_remote, token=token,
                keep_signals_caught=True, stamps=stamps,
            ),
            backend_options={"loop_factory": event_loop_factory()},
        )  # fmt: skip
    except StoreError as exc:
        # An unusable database is exit 2, as for every other subcommand.
        log_line(sys.stderr, f"agentrt proxy: {exc}")
        return 2
    except (ConfigError, AgentrtError) as exc:
        log_line(sys.stderr, f"agentrt proxy: {exc}")
        return 1
    except OSError as exc:
        log_line(sys.stderr, f"agentrt proxy: {sanitize(str(exc))}")
        return 1
    finally:
        discard_started_early()


def _start_early(config: ProxyConfig) -> None:
    """Start each stdio server the configuration names as soon as the configuration is
    read, before the event loop, the MCP client and the rest of the proxy are imported, so
    that it boots meanwhile on another core (issue 36, decision 0053); its load takes it
    (`mcp._stdio.start_early`).  A server whose manifest its load would refuse before
    connecting (unreadable, for another server, a rule naming a tool it does not pin) is
    left to that load, which reports it without starting it."""
    from ..mcp._files import read_manifest
    from ..mcp._spawn import start_early

    for upstream in config.servers:
        server = upstream.server
        if server.command is None:
            continue
        try:
            manifest = read_manifest(upstream.manifest_path)
        except (AgentrtError, OSError, ValueError):
            continue
        if manifest.server == server.name and all(
            name in manifest.tools for name in upstream.rules
        ):
            start_early(server)
