"""`load`: turn a server's pinned, classified tools into agentrt tools, refusing what changed."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import anyio
import anyio.lowlevel

from ..canonical import JSONBoundaryError, parse_json, sha256_hex
from ..errors import RegistrationError
from ..sanitize import sanitize
from ..tools import TOOL_NAME_PATTERN, SideEffect, Tool, ToolSpec, check_tool
from . import _connection, _revision
from ._apps import check_apps, ui_meta_of, ui_resource_of
from ._errors import LoadError
from ._manifest import Manifest, PinnedTool, description_hash, schema_text
from ._phase import Phase
from ._rules import Rule, Rules
from ._server import Server
from ._tool import ServerTool
from ._upstream import Recheck, Upstream, stderr_line

__all__ = ["Refusal", "Registration", "Report", "load"]


@dataclass(frozen=True, slots=True)
class Registration:
    """A tool that registered: the server's `tool` name, its final `name`, and its class.

    `hint_mismatch` is the contradiction between the rule and the server's
    annotations that `allow_hint_mismatch` let through ("" when none).
    """

    tool: str
    name: str
    side_effect: SideEffect
    hint_mismatch: str = ""


@dataclass(frozen=True, slots=True)
class Refusal:
    """A pinned, classified tool that did not register, and the first check it failed."""

    tool: str
    reason: str


@dataclass(frozen=True, slots=True)
class Report:
    """What a load did with every tool; anything not in `registered` is unseen by the model.

    `unpinned` tools are offered but absent from the manifest; `unclassified`
    tools are pinned but have no rule.  Fields keep names as received;
    `str(report)` is one escaped line per tool.
    """

    server: str
    connection: _connection.Connection | None
    registered: list[Registration] = field(default_factory=list)
    refused: list[Refusal] = field(default_factory=list)
    unpinned: list[str] = field(default_factory=list)
    unclassified: list[str] = field(default_factory=list)
    # MCP Apps: a registered tool offered without its app, and why (`_apps.check_apps`).
    without_app: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        server = sanitize(self.server)
        lines: list[str] = []
        for registration in self.registered:
            line = (
                f"{server}: registered {sanitize(registration.tool)} as "
                f"{sanitize(registration.name)} ({registration.side_effect.value})"
            )
            if registration.hint_mismatch:
                line += f"; hint mismatch allowed: {sanitize(registration.hint_mismatch)}"
            lines.append(line)
        for refusal in self.refused:
            lines.append(f"{server}: refused {sanitize(refusal.tool)}: {sanitize(refusal.reason)}")
        for name in self.unpinned:
            lines.append(
                f"{server}: unpinned {sanitize(name)}: offered but not in the manifest; "
                "review it and pin again to use it"
            )
        for name in self.unclassified:
            lines.append(f"{server}: unclassified {sanitize(name)}: pinned but no rule names it")
        for name, reason in self.without_app.items():
            lines.append(f"{server}: {sanitize(name)} without its app: {reason}")
        return "\n".join(lines)


class _Refused(Exception):
    """One check failed for one tool; the message is the refusal's reason."""


_HIDING_KEYWORDS: Final = (
    "allOf",
    "anyOf",
    "oneOf",
    "not",
    "if",
    "then",
    "else",
    "dependentRequired",
    "dependentSchemas",
    "dependencies",
    "$defs",
    "definitions",
)


class _RevisionChanged(Exception):
    """The server speaks the other era than it was pinned over.  One sentence."""


async def load(
    server: Server,
    manifest: Manifest,
    rules: Rules,
    *,
    log: Callable[[str], None] | None = None,
) -> tuple[list[Tool], Report]:
    """Connect, list the tools again, and return a tool for each pinned, classified, unchanged one.

    A rule naming a tool the manifest does not pin, or a manifest for
    another server, is an error before anything connects.  A tool failing a
    check is refused alone and the others register; nothing registering is
    an error, and then the session is closed.  One deadline,
    `server.connect_timeout`, bounds connecting, listing and every check;
    the session returned in `Report.connection` outlives it.

    If the server later dies, the next call to one of its tools starts it
    again and holds every loaded tool to its pin as this load did (a changed
    one is refused until pinned again); `log` receives one escaped line each
    time (default: a line on stderr).
    """
    if manifest.server != server.name:
        raise LoadError(
            f'manifest is for server "{sanitize(manifest.server)}", not "{sanitize(server.name)}"'
        )
    for name in sorted(rules):
        if name not in manifest.tools:
            # A misspelled name would otherwise silently drop a tool the operator classified.
            raise LoadError(
                f'a rule names "{sanitize(name)}", which the manifest for server '
                f'"{sanitize(server.name)}" does not pin'
            )
    phase = Phase(server, "loading")
    try:
        with anyio.fail_after(server.connect_timeout):
            raw_tools = await phase.connect_and_list()
            assert phase.connection is not None
            changed = _revision.revision_change(
                server.name, manifest.revision, phase.connection.protocol_version
            )
            if changed is not None:
                raise _RevisionChanged(changed)
            for note in phase.connection.notes:
                (log if log is not None else stderr_line)(note)
            upstream = Upstream(server, phase.connection, log if log is not None else stderr_line)
            tools, report = await _check_all(server, manifest, rules, raw_tools, phase, upstream)
            phase.enter("checking the tools' apps")
            await _check_apps(server, manifest, tools, report, upstream)
    except BaseException as exc:
        await phase.close()
        if isinstance(exc, _RevisionChanged):
            raise LoadError(str(exc)) from None
        if isinstance(exc, Exception):
            raise LoadError(phase.failure(exc)) from exc
        raise
    if not tools:
        await phase.close()
        closed = Report(
            server=report.server,
            connection=None,
            registered=[],
            refused=report.refused,
            unpinned=report.unpinned,
            unclassified=report.unclassified,
        )
        reasons = "; ".join(
            f"{sanitize(refusal.tool)}: {sanitize(refusal.reason)}" for refusal in closed.refused
        )
        raise LoadError(
            f'no tool of server "{sanitize(server.name)}" registered'
            + (f" ({reasons})" if reasons else " (no pinned tool has a rule)"),
            report=closed,
        )
    upstream.recheck = _recheck(server, manifest, rules, upstream, tools)
    return tools, report


async def _check_apps(
    server: Server, manifest: Manifest, tools: list[Tool], report: Report, upstream: Upstream
) -> None:
    """Hold each loaded tool's MCP App to its pin: a changed app refuses the tool (removed from
    `tools` and `report.registered`), an unpinned one leaves the tool without it."""
    named = {
        tool.server_tool_name: (tool, uri)
        for tool in tools
        if isinstance(tool, ServerTool)
        and (uri := ui_resource_of({"_meta": tool.ui or {}})) is not None
    }
    if not named:
        return
    refused, unpinned = await check_apps(
        manifest.apps or {},
        [(name, uri) for name, (_, uri) in named.items()],
        upstream.connection,
        server.connect_timeout,
    )
    for name, reason in unpinned.items():
        named[name][0].ui = None
        report.without_app[name] = reason
    for name, reason in refused.items():
        tools.remove(named[name][0])
        report.registered[:] = [entry for entry in report.registered if entry.tool != name]
        report.refused.append(Refusal(tool=name, reason=reason))


async def take_manifest(
    server: Server, manifest: Manifest, rules: Rules, upstream: Upstream
) -> tuple[list[Tool], Report]:
    """Hold a loaded server's listing, on its running session, to a new `manifest` (the
    operator pinned it again) exactly as `load` does: the tools it registers, and the
    report.  From then on its relistings and restarts are held to the new manifest; a
    tool loaded before that no longer registers stays refused on the session.  Raises
    `LoadError` (one sentence) and changes nothing when it cannot be taken."""
    if manifest.server != server.name:
        raise LoadError(
            f'manifest is for server "{sanitize(manifest.server)}", not "{sanitize(server.name)}"'
        )
    missing = sorted(name for name in rules if name not in manifest.tools)
    if missing:
        raise LoadError(f'a rule names "{sanitize(missing[0])}", which the new manifest for '
                        f'server "{sanitize(server.name)}" does not pin')  # fmt: skip
    async with upstream.exclusive() as up:
        if not up:
            raise LoadError(f'server "{sanitize(server.name)}" is down; pin it again once it runs')
        try:
            with anyio.fail_after(server.connect_timeout):
                listing = await upstream.connection.list_tools()
                tools, report = await _check_all(
                    server, manifest, rules, listing, Phase(server, "reloading"), upstream
                )
                await _check_apps(server, manifest, tools, report, upstream)
        except Exception as exc:
            raise LoadError(f'server "{sanitize(server.name)}" could not be listed again: '
                            f"{sanitize(str(exc))}") from None  # fmt: skip
        withdrawn = {refusal.tool: refusal.reason for refusal in report.refused}
        recheck = _recheck(server, manifest, rules, upstream, tools)

        def held(raw_tools: list[_connection.RawTool]) -> dict[str, str]:
            # A tool refused when the manifest was taken stays refused in this process.
            return {**withdrawn, **recheck(raw_tools)}

        upstream.recheck = held
        upstream.adopt(held(listing), "its server's new manifest was taken")
    return tools, report


def _recheck(
    server: Server,
    manifest: Manifest,
    rules: Rules,
    upstream: Upstream,
    loaded: list[Tool],
) -> Recheck:
    """The check a restarted server's new listing gets: each loaded tool, exactly as at load."""
    specs = {tool.server_tool_name: tool.spec for tool in loaded if isinstance(tool, ServerTool)}

    def recheck(raw_tools: list[_connection.RawTool]) -> dict[str, str]:
        live = {raw.name: raw.raw for raw in raw_tools if raw.name is not None}
        refused: dict[str, str] = {}
        for name, spec in specs.items():
            try:
                tool, _ = _check_tool(
                    server, manifest.tools[name], rules[name], live.get(name), upstream
                )
                if tool.spec != spec:
                    raise _Refused("it would now register differently from when it was loaded")
            except _Refused as refusal:
                refused[name] = str(refusal)
            except Exception as exc:
                refused[name] = f"it could not be checked: {type(exc).__name__}: {exc}"
        return refused

    return recheck


async def _check_all(
    server: Server,
    manifest: Manifest,
    rules: Rules,
    raw_tools: list[_connection.RawTool],
    phase: Phase,
    upstream: Upstream,
) -> tuple[list[Tool], Report]:
    connection = upstream.connection
    live: dict[str, Mapping[str, Any]] = {
        raw_tool.name: raw_tool.raw for raw_tool in raw_tools if raw_tool.name is not None
    }
    tools: list[Tool] = []
    report = Report(server=server.name, connection=connection)
    for index, raw_tool in enumerate(raw_tools):
        if raw_tool.name is None:
            # Nothing can pin or classify it, but a silently missing tool is the
            # failure the report exists to prevent: say that it was there.
            report.refused.append(
                Refusal(tool=f"(unnamed, listed {index + 1})", reason="it has no string name")
            )
    holders: dict[str, str] = {}
    for name in sorted(manifest.tools):
        rule = rules.get(name)
        if rule is None:
            report.unclassified.append(name)
            continue
        phase.enter(f'checking the tool "{name}"')
        # The checks are synchronous; a checkpoint per tool lets the deadline fire between them.
        await anyio.lowlevel.checkpoint()
        try:
            tool, hint_mismatch = _check_tool(
                server, manifest.tools[name], rule, live.get(name), upstream
            )
            holder = holders.get(tool.spec.name)
            if holder is not None:
                raise _Refused(f'the name "{tool.spec.name}" is already taken by "{holder}"')
        except _Refused as refused:
            report.refused.append(Refusal(tool=name, reason=str(refused)))
            continue
        except Exception as exc:
            # A schema no check foresaw must cost only its own tool, never the whole load.
            report.refused.append(
                Refusal(tool=name, reason=f"it could not be checked: {type(exc).__name__}: {exc}")
            )
            continue
        holders[tool.spec.name] = name
        tools.append(tool)
        report.registered.append(
            Registration(
                tool=name,
                name=tool.spec.name,
                side_effect=rule.side_effect,
                hint_mismatch=hint_mismatch,
            )
        )
    report.unpinned.extend(sorted(name for name in live if name not in manifest.tools))
    return tools, report


def _check_tool(
    server: Server,
    pinned: PinnedTool,
    rule: Rule,
    raw_tool: Mapping[str, Any] | None,
    upstream: Upstream,
) -> tuple[ServerTool, str]:
    """Run the checks in order; raise `_Refused` naming the first that failed."""
    # Here, not at the top: JSON Schema's validators load while the server starts.
    from ..schema import check_self_contained

    if raw_tool is None:
        raise _Refused("the server no longer offers it")
    live_schema_text = schema_text(raw_tool)
    if sha256_hex(live_schema_text.encode("utf-8")) != pinned.schema_hash:
        raise _Refused("its input schema changed since it was pinned; review it and pin again")
    if description_hash(raw_tool) != pinned.description_hash:
        raise _Refused("its description changed since it was pinned; review it and pin again")
    hint_mismatch = _annotation_contradiction(rule.side_effect, pinned.annotations, live=False)
    if not hint_mismatch:
        live_annotations = raw_tool.get("annotations")
        hint_mismatch = _annotation_contradiction(
            rule.side_effect,
            live_annotations if isinstance(live_annotations, dict) else None,
            live=True,
        )
    if hint_mismatch and not rule.allow_hint_mismatch:
        raise _Refused(
            f"{hint_mismatch}; if the classification is right, set "
            '"allow_hint_mismatch": true in its rule'
        )
    timeout = rule.timeout if rule.timeout is not None else server.default_timeout
    if timeout is None:
        raise _Refused("it has no timeout: set one in its rule or the server's default_timeout")
    final_name = rule.rename if rule.rename is not None else f"{server.name}_{pinned.name}"
    if not TOOL_NAME_PATTERN.match(final_name):
        raise _Refused(
            f'its name "{final_name}" does not match ^[a-zA-Z0-9_-]{{1,64}}$, '
            "so not every provider could call it"
        )
    schema = parse_json(live_schema_text)
    if not isinstance(schema, dict) or schema.get("type") != "object":
        raise _Refused('its input schema does not describe an object ("type": "object")')
    try:
        check_self_contained(schema)
    except RegistrationError as exc:
        raise _Refused(str(exc)) from None
    fixed: dict[str, Any] = {}
    for parameter, text in rule.fixed.items():
        try:
            fixed[parameter] = parse_json(text)
        except JSONBoundaryError as exc:
            raise _Refused(f'the fixed value for "{parameter}" is not valid JSON: {exc}') from None
    hidden = [*rule.deny, *rule.fixed]
    _check_hideable(schema, hidden)
    restricted = _restricted_schema(schema, hidden)
    description = rule.description
    if description is None:
        server_description = raw_tool.get("description", "")
        description = server_description if isinstance(server_description, str) else ""
    tool = ServerTool(
        spec=ToolSpec(
            name=final_name,
            description=description,
            input_schema=restricted,
            side_effect=rule.side_effect,
            timeout=timeout,
            terminal=rule.terminal,
        ),
        server=server.name,
        tool=pinned.name,
        upstream=upstream,
        deny=rule.deny,
        fixed=fixed,
        max_content_bytes=server.max_content_bytes,
        title=raw_tool["title"] if isinstance(raw_tool.get("title"), str) else None,
        output_schema=(
            raw_tool["outputSchema"] if isinstance(raw_tool.get("outputSchema"), dict) else None
        ),
    )
    tool.ui = ui_meta_of(raw_tool)
    try:
        # The runtime's own rules, as the gate registers a tool.
        check_tool(tool)
    except RegistrationError as exc:
        raise _Refused(f"the runtime refuses it: {exc}") from None
    return tool, hint_mismatch


def _annotation_contradiction(
    side_effect: SideEffect, annotations: Mapping[str, Any] | None, *, live: bool
) -> str:
    """The contradiction between a classification and a server's hints, or "".

    Annotations only ever dispute the operator's judgement; absent ones say nothing.
    """
    if annotations is None:
        return ""
    says = "the server now says: it" if live else "the server"
    read_only_hint = annotations.get("readOnlyHint") is True
    if side_effect is SideEffect.READ_ONLY and not read_only_hint:
        return f"classified read_only, but {says} does not claim readOnlyHint"
    if (
        side_effect is not SideEffect.DESTRUCTIVE
        and not read_only_hint
        and annotations.get("destructiveHint") is True
    ):
        return f"classified {side_effect.value}, but {says} claims destructiveHint"
    return ""


def _nodes(value: Any) -> Iterator[Any]:
    stack = [value]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def _mentions(value: Any, name: str) -> bool:
    """Whether any object key or string value in `value` equals `name`."""
    for node in _nodes(value):
        if node == name and isinstance(node, str):
            return True
        if isinstance(node, dict) and name in node:
            return True
    return False


def _check_hideable(schema: dict[str, Any], hidden: list[str]) -> None:
    """Hiding is sound only when nothing else in the schema refers to the hidden names."""
    if not hidden:
        return
    properties = schema.get("properties")
    for name in hidden:
        if not isinstance(properties, dict) or name not in properties:
            # A misspelled name would otherwise hide nothing, silently.
            raise _Refused(f'the hidden parameter "{name}" is not a top-level property')
    for node in _nodes(schema):
        if not isinstance(node, dict):
            continue
        if "patternProperties" in node:
            # The patterns are ECMA-262, which is not evaluated here; one could match a hidden name.
            raise _Refused("it hides a parameter, but its schema has patternProperties")
        for keyword in _HIDING_KEYWORDS:
            if keyword not in node:
                continue
            for name in hidden:
                if _mentions(node[keyword], name):
                    raise _Refused(
                        f'the hidden parameter "{name}" is mentioned under {keyword}, '
                        "so hiding it would leave the model a schema it cannot satisfy"
                    )


def _restricted_schema(schema: dict[str, Any], hidden: list[str]) -> dict[str, Any]:
    """The schema the model is shown: hidden names removed from properties and required."""
    if not hidden:
        return schema
    restricted = copy.deepcopy(schema)
    restricted["properties"] = {
        name: value for name, value in restricted["properties"].items() if name not in hidden
    }
    if "required" in restricted:
        required = restricted["required"]
        if not isinstance(required, list):
            raise _Refused('the restricted schema cannot be built: "required" is not a list')
        remaining = [name for name in required if name not in hidden]
        if remaining:
            restricted["required"] = remaining
        else:
            # Draft-04 forbids an empty "required"; no list says the same thing.
            del restricted["required"]
    return restricted
