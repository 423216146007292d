"""Start-up: connect to every configured upstream server and take what it offers.

Servers load together, so the host waits for the slowest one rather than
for the sum of them; a server that fails is reported and left out, and the
others serve.  A tool name two servers offer goes to neither silently: the
second is refused with a line naming the first.
"""

from __future__ import annotations

from typing import IO, TYPE_CHECKING, Any, Final

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
from ._status import STATUS_TOOL
from .config import ProxyConfig, UpstreamConfig

if TYPE_CHECKING:
    from ._proxy import Loaded

__all__ = ["listed_plainly", "load_upstreams", "plainly_listable", "take_offers"]


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
        (offers.prompts, "prompt"),
        (offers.resources, "resource"),
        (offers.resource_templates, "resource template"),
    )
    for listed, noun in sections:
        for raw in listed:
            plain = plain_json(raw)
            shown = sanitize(str(raw.get("name", "")))
            # What the SDK cannot list to the host is refused alone, not the whole list.
            refusal = None if plainly_listable(noun, plain) else _model_refusal(noun, plain)
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


# The members of the SDK's Prompt, Resource and ResourceTemplate models (their wire names)
# whose values `plainly_listable` decides: a string or null, an integer or null, ...
_TEXT: Final = frozenset({"title", "description", "mimeType"})
_REQUIRED_TEXT: Final = {
    "prompt": ("name",),
    "resource": ("name", "uri"),
    "resource template": ("name", "uriTemplate"),
}
# Python names the models also accept for a member (`populate_by_name`), and the members
# whose values are models of their own: where one is present, the model decides.
_TO_THE_MODEL: Final = frozenset({"mime_type", "uri_template", "meta", "icons", "annotations"})
_ARGUMENT_TEXT: Final = frozenset({"title", "description"})


def plainly_listable(noun: str, item: Any) -> bool:
    """Whether a server's prompt, resource or resource template (`noun`, its plain JSON)
    is one the SDK's model certainly accepts, decided without importing the models
    (issue 36: `mcp_types` costs ~0.2 s at start): its required members strings, the
    others it has of the plain kinds the model takes (text or null, a 64-bit integer or
    null, an object or null for `_meta`, a prompt's arguments of the same).  False is
    not a refusal: the model decides whatever this cannot."""
    if not isinstance(item, dict):
        return False
    for key in _REQUIRED_TEXT[noun]:
        if type(item.get(key)) is not str:
            return False
    for key, value in item.items():
        if key in _TO_THE_MODEL and value is not None:
            return False
        if key in _TEXT and value is not None and type(value) is not str:
            return False
        if key == "_meta" and value is not None and type(value) is not dict:
            return False
    if noun == "resource" and not _integer_or_null(item.get("size")):
        return False
    if noun == "prompt":
        arguments = item.get("arguments")
        if arguments is not None and not (
            type(arguments) is list and all(_plain_argument(entry) for entry in arguments)
        ):
            return False
    return True


# The members of the SDK's models in the order they dump them (`by_alias`, nulls left out).
_DUMPED: Final = {
    "prompt": ("name", "title", "description", "arguments", "_meta"),
    "resource": ("name", "title", "uri", "description", "mimeType", "size", "_meta"),
    "resource template": ("name", "title", "uriTemplate", "description", "mimeType", "_meta"),
}
_ARGUMENT_DUMPED: Final = ("name", "title", "description", "required")


def listed_plainly(noun: str, items: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """`items` as the SDK's model of `noun` dumps each (`by_alias`, `mode="json"`, nulls
    left out), when every one is `plainly_listable`; None when the models must."""
    if not all(plainly_listable(noun, item) for item in items):
        return None
    listed: list[dict[str, Any]] = []
    for item in items:
        dumped = {key: item[key] for key in _DUMPED[noun] if item.get(key) is not None}
        if "arguments" in dumped:
            dumped["arguments"] = [
                {key: entry[key] for key in _ARGUMENT_DUMPED if entry.get(key) is not None}
                for entry in dumped["arguments"]
            ]
        listed.append(dumped)
    return listed


def _integer_or_null(value: Any) -> bool:
    return value is None or (type(value) is int and -(2**63) <= value < 2**63)


def _plain_argument(argument: Any) -> bool:
    if type(argument) is not dict or type(argument.get("name")) is not str:
        return False
    for key, value in argument.items():
        if key in _ARGUMENT_TEXT and value is not None and type(value) is not str:
            return False
        if key == "required" and value is not None and type(value) is not bool:
            return False
    return True


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
