"""Start-up: connect to every configured upstream server and take what it offers.

Servers load together, so the host waits for the slowest one rather than
for the sum of them; a server that fails is reported and left out, and the
others serve.  A tool name two servers offer goes to neither silently: the
second is refused with a line naming the first.
"""

from __future__ import annotations

from typing import IO, TYPE_CHECKING, Any

import anyio

from ..canonical import plain_json
from ..errors import AgentrtError
from ..mcp import Connection, Manifest, Report, load, read_manifest
from ..mcp._offers import Offers, load_offers
from ..mcp._tool import ServerTool
from ..sanitize import sanitize
from ..tools import Tool
from ._log import log_line
from ._offers import Offered
from ._plain import plainly_listable
from ._status import STATUS_TOOL
from .config import ProxyConfig, UpstreamConfig

if TYPE_CHECKING:
    from ._proxy import Loaded

__all__ = ["load_upstreams", "take_offers"]


async def load_upstreams(
    config: ProxyConfig,
    log: IO[str],
    servers_of: dict[str, str] | None = None,
    offered: Offered | None = None,
    manifests: dict[str, Manifest] | None = None,
    waiting: list[UpstreamConfig] | None = None,
) -> tuple[list[Loaded], list[Connection]]:
    """Load every upstream; one that fails is reported and left out, the others serve.

    `servers_of`, when given, is filled with each served tool's server name;
    `offered` with the prompts, resources and templates that passed their pins;
    `manifests` with each loaded server's manifest (what a later listing is held
    to, `_live.py`); `waiting` with each server left out because it waits for
    `agentrt login` (loaded once it is made, `_logins.py`)."""
    tools: list[Loaded] = []
    connections: list[Connection] = []
    taken: dict[str, str] = {STATUS_TOOL: "the proxy itself"}
    outcomes: list[tuple[list[Tool], Report] | Exception | None] = [None] * len(config.servers)
    for upstream in config.servers:
        if upstream.server.command is not None and upstream.server.sandbox is None:
            log_line(
                log,
                f"agentrt proxy: warning: server {sanitize(upstream.server.name)} has no "
                "sandbox, so it runs with every file and network this user can reach",
            )

    offer_results: list[Offers | None] = [None] * len(config.servers)

    async def load_one(position: int, upstream: UpstreamConfig) -> None:
        try:
            try:
                manifest = read_manifest(upstream.manifest_path)
            except AgentrtError:
                # A remote server not yet pinned because it waits for a login says so.
                from ..mcp._oauth import needs_login

                waiting = await needs_login(upstream.server)
                if waiting is not None:
                    raise AgentrtError(waiting) from None
                raise
            outcome = await load(upstream.server, manifest, upstream.rules)
            outcomes[position] = outcome
            if manifests is not None:
                manifests[upstream.server.name] = manifest
        except (AgentrtError, OSError, ValueError) as exc:
            outcomes[position] = exc
            return
        loaded, report = outcome
        server_tools = [tool for tool in loaded if isinstance(tool, ServerTool)]
        if offered is None or report.connection is None or not server_tools:
            return
        offer_results[position] = await load_offers(
            report.connection,
            manifest,
            prompts=upstream.prompts,
            timeout=upstream.server.connect_timeout,
        )
        offered.upstreams[upstream.server.name] = server_tools[0].upstream
        for uri, app in (manifest.apps or {}).items():
            offered.apps.setdefault(uri, (upstream.server.name, app.content_hash))

    # Together, so the host waits for the slowest server, not for the sum of them.
    async with anyio.create_task_group() as group:
        for position, upstream in enumerate(config.servers):
            group.start_soon(load_one, position, upstream)
    # In the configuration's order, so a name two servers offer goes to the first listed.
    offer_lines: list[list[str]] = []
    for upstream, offers in zip(config.servers, offer_results, strict=True):
        if offered is None or offers is None:
            offer_lines.append([])
        else:
            offer_lines.append(take_offers(offered, upstream.server.name, offers))
    for position, (upstream, outcome) in enumerate(zip(config.servers, outcomes, strict=True)):
        name = sanitize(upstream.server.name)
        if not isinstance(outcome, tuple):
            log_line(log, f"agentrt proxy: server {name} did not load: {sanitize(str(outcome))}")
            if waiting is not None and await _waits_for_login(upstream):
                waiting.append(upstream)
            continue
        loaded, report = outcome
        if report.connection is not None:
            connections.append(report.connection)
        for line in str(report).splitlines() + offer_lines[position]:
            log_line(log, f"agentrt proxy: {line}")
        for tool in loaded:
            holder = taken.get(tool.spec.name)
            if holder is not None:
                # A second tool of one name would shadow the first; neither is guessed at.
                log_line(
                    log,
                    f"agentrt proxy: server {name}: refused {tool.spec.name}: the name is "
                    f"already taken by {sanitize(holder)}; give it a rename rule",
                )
                continue
            taken[tool.spec.name] = f'server "{upstream.server.name}"'
            if servers_of is not None:
                servers_of[tool.spec.name] = upstream.server.name
            tools.append((tool, upstream))
    return tools, connections


async def _waits_for_login(upstream: UpstreamConfig) -> bool:
    """Whether `upstream` is reached with OAuth and has no tokens that serve now."""
    from ..mcp._oauth import OAuthClientFactory

    factory = upstream.server.http_client_factory
    if not isinstance(factory, OAuthClientFactory):
        return False
    return await factory.session.waiting_for_login() is not None


def take_offers(offered: Offered, name: str, offers: Offers) -> list[str]:
    """Add one server's checked prompts, resources and templates to `offered`; the lines
    to log (its refusals, and what the SDK could not list or another server took first)."""
    lines = list(offers.lines)
    sections = (
        (offers.prompts, "prompt", "prompts"),
        (offers.resources, "resource", "resources"),
        (offers.resource_templates, "resource template", "resourceTemplates"),
    )
    for listed, noun, key in sections:
        for raw in listed:
            plain = plain_json(raw)
            shown = sanitize(str(raw.get("name", "")))
            # What the SDK cannot list to the host is refused alone, not the whole list.
            refusal = None if plainly_listable(key, plain) else _model_refusal(noun, plain)
            if refusal is not None:
                lines.append(
                    f"{sanitize(name)}: refused {noun} {shown}: the host could not be sent it "
                    f"({sanitize(refusal)})"
                )
                continue
            if noun == "prompt":
                holder = offered.prompts.get(str(raw["name"]))
                if holder is not None:
                    lines.append(
                        f"{sanitize(name)}: refused prompt {shown}: the name is already "
                        f'offered by server "{sanitize(holder[1])}"'
                    )
                    continue
                offered.prompts[str(raw["name"])] = (plain, name)
            elif noun == "resource":
                offered.resources.append((plain, name))
            else:
                offered.templates.append((plain, name))
    return lines


def _model_refusal(noun: str, item: Any) -> str | None:
    """The SDK's model's first line of refusal of `item`, or None when it accepts it."""
    import mcp_types as types

    try:
        if noun == "prompt":
            types.Prompt.model_validate(item)
        elif noun == "resource":
            types.Resource.model_validate(item)
        else:
            types.ResourceTemplate.model_validate(item)
    except ValueError as exc:
        return str(exc).splitlines()[0]
    return None
