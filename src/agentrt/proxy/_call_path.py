"""The proxy's call path: the gate over the served tools, the proxy's policy and `Calls`.

A host's first `tools/list` needs only what the tools are (`Proxy`); the gate, the
ledger and the calls' modules take 25-70 ms to import (by the machine's load), which
the first listing no longer waits for (issue 36, decision 0066).  `Proxy.calling`
imports this module in a worker thread at the first call, or just after the first
listing was answered, and builds the path once (`build_call_path`); every call
awaits it first, so none is served before it is built.  A configuration whose path
writes to the database or checks the rules when built has it built with the proxy,
as before (`builds_at_start`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..gate import Gate, Limits
from ..mcp import CallContext
from ..mcp._tool import ServerTool
from ..store import Store
from ..telemetry import trace_context_metadata
from ..tools import Tool
from ._calls import Calls, ProxyPolicy, WatchedTool, proxy_policy
from ._client_requests import asker_for
from ._grants import GrantCover
from ._input_required import HostCall
from ._preconditions import StatefulTool, precondition_reader
from .config import UpstreamConfig

if TYPE_CHECKING:
    from ._proxy import Loaded, Proxy

__all__ = ["CallPath", "build_call_path", "upstream_context", "watched"]


@dataclass(slots=True)
class CallPath:
    """What a call goes through once the proxy has built it: the gate and `Calls`, under
    the proxy's policy (swapped in both when the rules change, `_rules_reload`)."""

    gate: Gate
    calls: Calls

    @property
    def policy(self) -> ProxyPolicy:
        """The proxy's policy, the one the gate and `Calls` hold."""
        return self.calls.policy


def build_call_path(proxy: Proxy) -> CallPath:
    """The gate over `proxy`'s loaded tools (each watched) and its prompts' and resources'
    gate tools, under the proxy's policy, and the `Calls` that carry its host's calls."""
    config, store = proxy.config, proxy.store
    repeat_windows: dict[str, float] = {}
    tools = proxy.loaded
    wrapped = [watched(proxy, tool, upstream, tools, repeat_windows) for tool, upstream in tools]
    # Conditions, each rule's `outcome` and `fixed` values, and the policy's identity.
    policy = proxy_policy(config, store)
    policy.resource_rules = proxy.resource_rules
    # With "principals", a condition may read who asked, on resume too (`principal`).
    policy.reads_principals = config.principals is not None
    for tool in wrapped:
        if isinstance(tool, StatefulTool):
            tool.policy = policy
    if config.standing_grants is not None:
        policy.grants = GrantCover(
            store, config.session, config.standing_grants, proxy.server_names
        )
        policy.grants.record_limits()
        policy.grants.per_principal = config.principals is not None
    gate = Gate(
        store,
        [*wrapped, *proxy.offer_tools],
        policy=policy,
        limits=Limits(approval_ttl=config.approval_ttl, grant_ttl=config.grant_ttl),
        owner=proxy.owner,
        lease_ttl=config.lease_ttl,
    )
    calls = Calls(
        gate=gate,
        index=proxy.index,
        policy=policy,
        cut_off=proxy.cut_off,
        sent=proxy.sent,
        session=config.session,
        database=str(config.database),
        hold=config.hold,
        repeat_window=config.repeat_window,
        max_pending=config.max_pending,
        log=proxy.log,
        repeat_windows=repeat_windows,
        forwarded=proxy.forwarded,
        specs=proxy.specs,
        closing=proxy.closing,
    )
    calls.passkeys = config.passkeys
    calls.logins = proxy.logins
    return CallPath(gate, calls)


def upstream_context(
    call: HostCall,
    upstream: UpstreamConfig | None,
    store: Store,
    timeout: float,
    meta: Mapping[str, Any],
    *,
    progress: Callable[[float, float | None, str | None], Awaitable[None]] | None,
    log: Callable[[str, str | None, Any], Awaitable[None]],
) -> CallContext:
    """The channels by which a call's server reaches its host: its progress and log
    lines, its requests (recorded in the runs the gate opens for the call), and the
    host's W3C trace context, so the server's spans join its trace.  Here, not in
    `_proxy`, because the client requests' and telemetry's modules come with the call
    path, after the first listing."""
    runs: list[str] = []
    return CallContext(
        progress=progress,
        log=log,
        ask=None if upstream is None else asker_for(upstream, call, store, runs, timeout),
        on_run=runs.append,
        trace=trace_context_metadata(meta) or None,
    )


def watched(
    proxy: Proxy,
    tool: Tool,
    upstream: UpstreamConfig,
    tools: list[Loaded],
    repeat_windows: dict[str, float],
) -> Tool:
    """`tool` as the gate registers it: watched for a call cut off before its server
    answered, and for its state when its rule names a precondition (a `StatefulTool`,
    whose `policy` the caller sets); its rule's `repeat_window` noted in
    `repeat_windows`."""
    name = tool.spec.name
    as_sent = upstream.results == "as_sent"
    on_server = tool.server_tool_name if isinstance(tool, ServerTool) else name
    extra = upstream.tool_rules.get(on_server)
    if extra is not None and extra.repeat_window is not None:
        repeat_windows[name] = extra.repeat_window
    watching: dict[str, Any] = {
        "cut_off": proxy.cut_off,
        "sent": proxy.sent,
        "forwarded": proxy.forwarded if as_sent else None,
        "max_result_bytes": upstream.max_result_bytes if as_sent else None,
    }
    if extra is not None and extra.precondition is not None:
        reader = precondition_reader(tools, upstream, extra.precondition)
        return StatefulTool(tool, extra.precondition, reader, reconcile=extra.reconcile, **watching)
    return WatchedTool(tool, **watching)
