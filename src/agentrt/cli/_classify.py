"""`agentrt classify`: the operator's judgement of each pinned tool, written as rules.

The operator classifies, the server only describes: each tool is shown as
the server presented it (name, full description, parameters, and its hints
marked as the server's claims), and the class is the operator's answer.  A
hint contradicting the answer is pointed out, and going ahead records
`allow_hint_mismatch` in the rule so the contradiction stays visible.  The
rules are written into the configuration (or the rules file it names) with
everything else in that file kept.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import click

from ..canonical import canonical_json, parse_json
from ..errors import AgentrtError
from ..mcp import Manifest, PinnedTool, read_manifest, read_owned
from ..mcp._files import write_private
from ..mcp._load import _annotation_contradiction
from ..sanitize import sanitize
from ..tools import TOOL_NAME_PATTERN, SideEffect
from ._app import EXIT_UNUSABLE, CommandError, Settings
from ._output import Output, bounded
from ._servers import _config_option, _hints, _load_config, _selected

if TYPE_CHECKING:
    from ..proxy.config import UpstreamConfig

__all__ = ["classify"]

_CHOICES: Final = {
    "r": SideEffect.READ_ONLY,
    "l": SideEffect.LOCAL_MUTATION,
    "m": SideEffect.REMOTE_MUTATION,
    "d": SideEffect.DESTRUCTIVE,
}
_MENU: Final = "[r] read-only  [l] local mutation  [m] remote mutation  [d] destructive  [s] skip"
_PARAMETERS_SHOWN: Final = 8


@dataclass(slots=True)
class _Rules:
    """One server's rules as its file holds them, and where they are written back."""

    upstream: UpstreamConfig
    manifest: Manifest | None
    entries: dict[str, Any]
    path: Path | None  # a separate rules file, or None when they live in the configuration


def _read_json_object(path: Path) -> dict[str, Any]:
    """An operator file as an ordered JSON object (it was checked already by the loader).

    Read as the loader reads it (`parse_json`), so a number keeps its literal
    and is written back with the same digits.
    """
    document = parse_json(read_owned(path))
    if not isinstance(document, dict):
        raise CommandError(f"{sanitize(str(path))} is not a JSON object", EXIT_UNUSABLE)
    return document


def _json_text(value: Any, indent: str = "") -> str:
    """`value` as two-space-indented JSON in its own key order, numbers as their literals."""
    inner = indent + "  "
    if isinstance(value, dict) and value:
        items = [
            f"{inner}{canonical_json(str(key))}: {_json_text(item, inner)}"
            for key, item in value.items()
        ]
        return "{\n" + ",\n".join(items) + f"\n{indent}}}"
    if isinstance(value, list) and value:
        items = [f"{inner}{_json_text(item, inner)}" for item in value]
        return "[\n" + ",\n".join(items) + f"\n{indent}]"
    return canonical_json(value)


def _server_entries(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {entry["name"]: entry for entry in document["servers"]}


def _side_effect(text: str, where: str) -> SideEffect:
    try:
        return SideEffect(text.strip().lower().replace("-", "_").replace(" ", "_"))
    except ValueError:
        classes = ", ".join(effect.value for effect in SideEffect)
        raise CommandError(f"{where}: {sanitize(repr(text))} is not a class ({classes})") from None


def _target(text: str, option: str, known: dict[str, _Rules]) -> tuple[_Rules, str, str]:
    """`SERVER.TOOL=VALUE` → the server's rules, the tool, the value; refused in one sentence."""
    target, equals, value = text.partition("=")
    if not equals or not value:
        raise CommandError(f"{option} {sanitize(text)} is not SERVER.TOOL=VALUE")
    # Server names may hold a dot; the longest name that fits wins.
    names = sorted((name for name in known if target.startswith(name + ".")), key=len)
    if not names:
        known_names = ", ".join(sanitize(name) for name in known) or "none"
        raise CommandError(
            f"{option} {sanitize(text)} names no server of this configuration (it has: "
            f"{known_names})"
        )
    rules = known[names[-1]]
    tool = target[len(names[-1]) + 1 :]
    if rules.manifest is None:
        raise CommandError(
            f'{option} {sanitize(text)}: server "{sanitize(names[-1])}" is not pinned yet '
            "(agentrt pin first)"
        )
    if tool not in rules.manifest.tools:
        raise CommandError(
            f'{option} {sanitize(text)}: server "{sanitize(names[-1])}" has no pinned tool '
            f'"{sanitize(tool)}"'
        )
    return rules, tool, value


def _parameters(tool: PinnedTool) -> str:
    schema = parse_json(tool.input_schema)
    properties = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(properties, dict) or not properties:
        return "none"
    required = schema.get("required") if isinstance(schema.get("required"), list) else []
    shown = []
    for name, spec in list(properties.items())[:_PARAMETERS_SHOWN]:
        kind = spec.get("type") if isinstance(spec, dict) else None
        kind_text = kind if isinstance(kind, str) else "any"
        mark = ", required" if name in required else ""
        shown.append(f"{bounded(str(name), 40, 10)} ({sanitize(kind_text)}{mark})")
    more = len(properties) - _PARAMETERS_SHOWN
    return ", ".join(shown) + (f", and {more} more" if more > 0 else "")


def _set_class(entries: dict[str, Any], tool: str, side_effect: SideEffect, allow: bool) -> None:
    rule = dict(entries.get(tool, {}))
    rule["side_effect"] = side_effect.value
    if allow:
        rule["allow_hint_mismatch"] = True
    else:
        rule.pop("allow_hint_mismatch", None)
    entries[tool] = rule


def _ask(output: Output, server: str, tool: PinnedTool) -> tuple[SideEffect, bool] | None:
    """One tool shown as the server presented it, and the operator's class (None: skip)."""
    output.line("")
    output.line(f"{sanitize(server)}.{sanitize(tool.name)}")
    output.line(f"  description: {sanitize(tool.description) or '(none)'}")
    output.line(f"  parameters: {_parameters(tool)}")
    output.line(f"  the server claims (claims classify nothing): {_hints(tool.annotations)}")
    output.line(f"  {_MENU}")
    while True:
        answer = click.prompt("  class", type=click.Choice([*_CHOICES, "s"]), show_choices=False)
        if answer == "s":
            return None
        side_effect = _CHOICES[answer]
        mismatch = _annotation_contradiction(side_effect, tool.annotations, live=False)
        if not mismatch:
            return side_effect, False
        output.line(f"  the hints contradict that: {sanitize(mismatch)}")
        if click.confirm(
            f"  classify it {side_effect.value} anyway (recorded as allow_hint_mismatch)?"
        ):
            return side_effect, True


def _open_world_warnings(manifest: Manifest, labels: list[str]) -> list[str]:
    """A server's open-world claims where its labels say nothing of the outside.  A hint
    only ever adds a warning: labels are the operator's, never set or cleared by a server."""
    if {"untrusted", "egress"} & set(labels):
        return []
    return [
        f"  the server claims {sanitize(name)} reaches the open world (openWorldHint): if it "
        "reads what outsiders wrote, label the server untrusted; if it sends, egress"
        for name, tool in sorted(manifest.tools.items())
        if isinstance(tool.annotations, dict) and tool.annotations.get("openWorldHint") is True
    ]


def _labels(text: str, known: Mapping[str, str], where: str) -> list[str]:
    """`private,untrusted` → the labels, every one known; refused in one sentence."""
    labels = [part for part in re.split(r"[,\s]+", text.strip()) if part]
    for label in labels:
        if label not in known:
            raise CommandError(
                f"{where}: {sanitize(repr(label))} is not a label (known: "
                f"{', '.join(sanitize(name) for name in known)}; declare your own under "
                '"labels" at the top of the configuration)'
            )
    return list(dict.fromkeys(labels))


def _ask_labels(output: Output, server: str, known: Mapping[str, str]) -> list[str]:
    """The operator's labels for one server (docs/flows.md); empty for none."""
    output.line("")
    output.line(f"labels of server {sanitize(server)} (Enter for none):")
    for name, meaning in known.items():
        output.line(f"  {sanitize(name)}: {sanitize(meaning)}")
    while True:
        answer = click.prompt("  labels", default="", show_default=False)
        try:
            return _labels(answer, known, "labels")
        except CommandError as exc:
            output.line(f"  {exc.format_message()}")


@click.command(short_help="Classify each pinned tool that has no rule yet.")
@_config_option
@click.argument("server_name", metavar="[SERVER]", required=False)
@click.option(
    "--set",
    "assignments",
    multiple=True,
    metavar="SERVER.TOOL=CLASS",
    help="Classify one tool without asking (read_only, local_mutation, remote_mutation, "
    "destructive); repeatable.",
)
@click.option(
    "--rename",
    "renames",
    multiple=True,
    metavar="SERVER.TOOL=NAME",
    help="The name the model sees instead of SERVER_TOOL; repeatable.",
)
@click.option(
    "--allow-hint-mismatch",
    is_flag=True,
    help="Let a --set class contradict the server's hints (recorded in the rule).",
)
@click.option(
    "--label",
    "label_settings",
    multiple=True,
    metavar="SERVER=LABEL[,LABEL]",
    help="The information-flow labels of a server's results (private, untrusted, egress, "
    "or your declared ones; docs/flows.md); repeatable.",
)
@click.pass_obj
def classify(
    settings: Settings,
    config_path: str,
    server_name: str | None,
    assignments: tuple[str, ...],
    renames: tuple[str, ...],
    allow_hint_mismatch: bool,
    label_settings: tuple[str, ...] = (),
) -> None:
    """Ask the class of every pinned tool without a rule, and the labels of every server
    without labels, and write them.

    With --set, --rename or --label nothing is asked; every entry is checked before
    anything is written.
    """
    config = _load_config(config_path)
    output = settings.output
    document = _read_json_object(config.path)
    entries = _server_entries(document)
    known: dict[str, _Rules] = {}
    for upstream in _selected(config, server_name):
        name = upstream.server.name
        try:
            manifest: Manifest | None = read_manifest(upstream.manifest_path)
        except AgentrtError:
            manifest = None
        if upstream.rules_path is not None:
            rules = _Rules(
                upstream, manifest, _read_json_object(upstream.rules_path), upstream.rules_path
            )
        else:
            rule_entries = entries[name].setdefault("rules", {})
            rules = _Rules(upstream, manifest, rule_entries, None)
        known[name] = rules

    changed: set[str] = set()
    for text in assignments:
        rules, tool, value = _target(text, "--set", known)
        side_effect = _side_effect(value, f"--set {sanitize(text)}")
        assert rules.manifest is not None
        mismatch = _annotation_contradiction(
            side_effect, rules.manifest.tools[tool].annotations, live=False
        )
        if mismatch and not allow_hint_mismatch:
            raise CommandError(
                f"--set {sanitize(text)}: {sanitize(mismatch)}; pass --allow-hint-mismatch "
                "to classify it so anyway"
            )
        _set_class(rules.entries, tool, side_effect, bool(mismatch))
        changed.add(rules.upstream.server.name)
    for text in renames:
        rules, tool, value = _target(text, "--rename", known)
        if tool not in rules.entries:
            raise CommandError(
                f"--rename {sanitize(text)}: the tool has no class yet; --set it first"
            )
        if not TOOL_NAME_PATTERN.match(value):
            raise CommandError(
                f"--rename {sanitize(text)}: a name must match ^[a-zA-Z0-9_-]{{1,64}}$"
            )
        rules.entries[tool] = {**rules.entries[tool], "rename": value}
        changed.add(rules.upstream.server.name)

    labelled: set[str] = set()
    for text in label_settings:
        name, equals, value = text.partition("=")
        if not equals or name not in entries or name not in known:
            raise CommandError(
                f"--label {sanitize(text)} is not SERVER=LABEL of this configuration"
            )
        entries[name]["labels"] = _labels(value, config.flows.labels, f"--label {sanitize(text)}")
        labelled.add(name)

    if not assignments and not renames and not label_settings:
        try:
            for name, rules in known.items():
                if rules.manifest is None:
                    waiting = _needs_login(rules.upstream)
                    output.line(
                        f'server "{sanitize(name)}" is not pinned yet: '
                        + (f"{sanitize(waiting)}; then " if waiting else "")
                        + f"agentrt pin --config {sanitize(str(config.path))} {sanitize(name)}"
                    )
                    continue
                for tool_name in sorted(rules.manifest.tools):
                    if tool_name in rules.entries:
                        continue
                    answer = _ask(output, name, rules.manifest.tools[tool_name])
                    if answer is not None:
                        _set_class(rules.entries, tool_name, *answer)
                        changed.add(name)
                if "labels" not in entries[name]:
                    for warning in _open_world_warnings(rules.manifest, []):
                        output.line(warning)
                    # Written even when empty: the operator's "none" is an answer, not asked again.
                    entries[name]["labels"] = _ask_labels(output, name, config.flows.labels)
                    labelled.add(name)
        except click.Abort:
            raise CommandError("stopped; nothing was written") from None

    for name in sorted(labelled):
        manifest = known[name].manifest
        if manifest is not None:
            for warning in _open_world_warnings(manifest, entries[name]["labels"]):
                output.line(warning.strip())
    if not changed and not labelled:
        output.line("nothing to write: every pinned tool named already has a rule or was skipped")
        return
    written: set[Path] = set()
    for name in changed:
        rules = known[name]
        if rules.path is not None:
            write_private(rules.path, _json_text(rules.entries) + "\n")
            written.add(rules.path)
    if labelled or any(known[name].path is None for name in changed):
        write_private(config.path, _json_text(document) + "\n")
        written.add(config.path)
    for name in sorted(labelled):
        if output.json:
            output.record({"record": "labels", "server": name, "labels": entries[name]["labels"]})
        else:
            output.line(f"{sanitize(name)}: labels {', '.join(entries[name]['labels']) or 'none'}")
    for name in sorted(changed):
        rules = known[name]
        for tool, rule in rules.entries.items():
            line = f"{sanitize(name)}.{sanitize(tool)}: {sanitize(str(rule.get('side_effect')))}"
            if rule.get("allow_hint_mismatch"):
                line += " (allow_hint_mismatch)"
            if rule.get("rename"):
                line += f" as {sanitize(str(rule['rename']))}"
            if output.json:
                output.record({"record": "rule", "server": name, "tool": tool, "rule": rule})
            else:
                output.line(line)
    for path in sorted(written):
        if not output.json:
            output.line(f"wrote the rules to {sanitize(str(path))}")
    _load_config(str(config.path))


def _needs_login(upstream: UpstreamConfig) -> str | None:
    """Why a remote server waits for `agentrt login`, asked of the server (docs/oauth.md)."""
    if upstream.server.endpoint is None:
        return None
    import anyio

    from ..mcp._oauth import needs_login

    return anyio.run(needs_login, upstream.server)
