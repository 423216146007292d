"""What an operator reviewed: the `Manifest` of a server's tools, and how a tool is pinned."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from ..canonical import JSONBoundaryError, canonical_bytes, canonical_json, parse_json, sha256_hex
from ..sanitize import sanitize
from ._apps import PinnedApp
from ._errors import OperatorFileError

__all__ = [
    "Manifest",
    "PinnedOffer",
    "PinnedTool",
    "description_hash",
    "pin_offer",
    "pin_raw_tool",
    "schema_text",
]


@dataclass(frozen=True, slots=True)
class PinnedTool:
    """One tool as the server presented it when the operator pinned it.

    `input_schema` is canonical JSON text; `schema_hash` is the SHA-256 hex of
    its bytes and `description_hash` of the description's canonical JSON
    encoding.  `annotations` are kept as received (None when absent) for the
    cross-check at load; they are never a source of permission.
    """

    name: str
    description: str
    input_schema: str
    schema_hash: str
    description_hash: str
    annotations: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class PinnedOffer:
    """One prompt, resource or resource template as the server listed it when pinned.

    `key` is the prompt's name, the resource's `uri` or the template's
    `uriTemplate`.  `description_hash` is the SHA-256 hex of the description's
    canonical JSON; `shape_hash` of the rest that a host relies on: a
    prompt's `arguments`, a resource's or template's listing without its
    description.  Both come from the bytes the server sent, literals kept.
    """

    key: str
    name: str
    description: str
    description_hash: str
    shape_hash: str


_OFFER_FIELDS: Final = ("description", "description_hash", "key", "name", "shape_hash")
# Manifest sections for what a server offers besides tools; absent in manifests from before them.
OFFER_SECTIONS: Final = ("prompts", "resources", "resource_templates")
# The field that names a listed element of each section.
OFFER_KEYS: Final = {"prompts": "name", "resources": "uri", "resource_templates": "uriTemplate"}


def offer_shape(section: str, raw: Mapping[str, Any]) -> str:
    """The canonical JSON text a `shape_hash` is taken of, for one listed element."""
    if section == "prompts":
        return canonical_json(raw.get("arguments", []))
    return canonical_json({key: value for key, value in raw.items() if key != "description"})


def shape_hash(section: str, raw: Mapping[str, Any]) -> str:
    return sha256_hex(offer_shape(section, raw).encode("utf-8"))


def pin_offer(section: str, raw: Mapping[str, Any]) -> PinnedOffer | None:
    """Pin one listed prompt, resource or template; None when it has no usable key."""
    key = raw.get(OFFER_KEYS[section])
    if not isinstance(key, str) or not key:
        return None
    name = raw.get("name", key)
    description = raw.get("description", "")
    return PinnedOffer(
        key=key,
        name=name if isinstance(name, str) else canonical_json(name),
        description=description if isinstance(description, str) else canonical_json(description),
        description_hash=description_hash(raw),
        shape_hash=shape_hash(section, raw),
    )


_TIMESTAMP_FORMAT: Final = "%Y-%m-%dT%H:%M:%S.%fZ"
_MANIFEST_FIELDS: Final = ("pinned_at", "server", "tools")
_TOOL_FIELDS: Final = (
    "annotations",
    "description",
    "description_hash",
    "input_schema",
    "name",
    "schema_hash",
)


@dataclass(frozen=True, slots=True)
class Manifest:
    """The pins of one server's tools, keyed by the server's own tool names, and of its
    prompts, resources and resource templates (None: not pinned, as in a manifest
    written before they were; then none of them is offered)."""

    server: str
    pinned_at: datetime
    tools: dict[str, PinnedTool] = field(default_factory=dict)
    prompts: dict[str, PinnedOffer] | None = None
    resources: dict[str, PinnedOffer] | None = None
    resource_templates: dict[str, PinnedOffer] | None = None
    apps: dict[str, PinnedApp] | None = None
    """MCP Apps: each `ui://` resource's content hash as read (None: none pinned)."""
    # The protocol revision the server spoke when pinned ("2026-07-28" or the version the
    # initialize handshake chose); None in a manifest written before it was kept.
    revision: str | None = None

    def offers(self, section: str) -> dict[str, PinnedOffer] | None:
        """The pins of one section: `"prompts"`, `"resources"` or `"resource_templates"`."""
        pins: dict[str, PinnedOffer] | None = getattr(self, section)
        return pins

    def to_json(self) -> str:
        """The manifest file: indented JSON, sorted keys, snake_case, every literal kept.

        Two pins of an unchanged server differ only in `pinned_at`.
        """
        document = {
            "server": self.server,
            "pinned_at": self.pinned_at.astimezone(UTC).strftime(_TIMESTAMP_FORMAT),
            "tools": {
                name: {
                    "name": tool.name,
                    "description": tool.description,
                    "input_schema": parse_json(tool.input_schema),
                    "schema_hash": tool.schema_hash,
                    "description_hash": tool.description_hash,
                    "annotations": tool.annotations,
                }
                for name, tool in self.tools.items()
            },
        }
        for section in OFFER_SECTIONS:
            pins = self.offers(section)
            if pins is not None:
                document[section] = {
                    key: {
                        "key": offer.key,
                        "name": offer.name,
                        "description": offer.description,
                        "description_hash": offer.description_hash,
                        "shape_hash": offer.shape_hash,
                    }
                    for key, offer in pins.items()
                }
        if self.apps:
            # Written only when a server has apps: every other manifest stays byte-identical.
            document["apps"] = {
                uri: {"uri": app.uri, "content_hash": app.content_hash, "tools": list(app.tools)}
                for uri, app in self.apps.items()
            }
        if self.revision is not None:
            document["revision"] = self.revision
        return _indented(document, "") + "\n"

    @classmethod
    def from_json(cls, data: bytes | str, *, source: str = "the manifest") -> Manifest:
        """Read a manifest written by `to_json`; a missing or unknown field is refused naming it."""
        try:
            document = parse_json(data)
        except JSONBoundaryError as exc:
            raise OperatorFileError(f"{source} is not usable JSON: {sanitize(str(exc))}") from None
        _expect_fields(
            document, _MANIFEST_FIELDS, source, optional=(*OFFER_SECTIONS, "apps", "revision")
        )
        server, stamp, tools = document["server"], document["pinned_at"], document["tools"]
        if not isinstance(server, str) or not server:
            raise OperatorFileError(f'{source}: "server" must be a non-empty string')
        try:
            pinned_at = datetime.strptime(stamp, _TIMESTAMP_FORMAT).replace(tzinfo=UTC)
        except (TypeError, ValueError):
            raise OperatorFileError(
                f'{source}: "pinned_at" must be a UTC time such as "2026-01-02T03:04:05.000000Z"'
            ) from None
        if not isinstance(tools, dict):
            raise OperatorFileError(f'{source}: "tools" must be an object of tool name to pin')
        revision = document.get("revision")
        if revision is not None and (not isinstance(revision, str) or not revision):
            raise OperatorFileError(f'{source}: "revision" must be a non-empty string')
        offers = {
            section: _pinned_offers(section, document[section], source)
            for section in OFFER_SECTIONS
            if section in document
        }
        return cls(
            server=server,
            pinned_at=pinned_at,
            tools={name: _pinned_tool(name, entry, source) for name, entry in tools.items()},
            **offers,
            apps=_pinned_apps(document["apps"], source) if "apps" in document else None,
            revision=revision,
        )


def _pinned_offers(section: str, entries: Any, source: str) -> dict[str, PinnedOffer]:
    if not isinstance(entries, dict):
        raise OperatorFileError(f'{source}: "{section}" must be an object')
    pins: dict[str, PinnedOffer] = {}
    for key, entry in entries.items():
        where = f'{source}: {section} "{sanitize(key)}"'
        _expect_fields(entry, _OFFER_FIELDS, where)
        for field_name in _OFFER_FIELDS:
            if not isinstance(entry[field_name], str):
                raise OperatorFileError(f'{where}: "{field_name}" must be a string')
        if entry["key"] != key:
            raise OperatorFileError(f"{where} is pinned under another key")
        pins[key] = PinnedOffer(**{name: entry[name] for name in _OFFER_FIELDS})
    return pins


def _pinned_apps(entries: Any, source: str) -> dict[str, PinnedApp]:
    if not isinstance(entries, dict):
        raise OperatorFileError(f'{source}: "apps" must be an object')
    apps: dict[str, PinnedApp] = {}
    for uri, entry in entries.items():
        where = f'{source}: the app "{sanitize(uri)}"'
        _expect_fields(entry, ("content_hash", "tools", "uri"), where)
        tools = entry["tools"]
        if entry["uri"] != uri:
            raise OperatorFileError(f"{where} is pinned under another URI")
        if not isinstance(entry["content_hash"], str):
            raise OperatorFileError(f'{where}: "content_hash" must be a string')
        if not isinstance(tools, list) or not all(isinstance(tool, str) for tool in tools):
            raise OperatorFileError(f'{where}: "tools" must be a list of tool names')
        apps[uri] = PinnedApp(uri=uri, content_hash=entry["content_hash"], tools=tuple(tools))
    return apps


def _pinned_tool(name: str, entry: Any, source: str) -> PinnedTool:
    where = f'{source}: the tool "{sanitize(name)}"'
    _expect_fields(entry, _TOOL_FIELDS, where)
    for key in ("name", "description", "schema_hash", "description_hash"):
        if not isinstance(entry[key], str):
            raise OperatorFileError(f'{where}: "{key}" must be a string')
    if entry["name"] != name:
        raise OperatorFileError(
            f'{where} is pinned under another name, "{sanitize(entry["name"])}"'
        )
    annotations = entry["annotations"]
    if annotations is not None and not isinstance(annotations, dict):
        raise OperatorFileError(f'{where}: "annotations" must be an object or null')
    input_schema = canonical_json(entry["input_schema"])
    if sha256_hex(input_schema.encode("utf-8")) != entry["schema_hash"]:
        # A hand-edited schema would otherwise surface later as a confusing refusal.
        raise OperatorFileError(f'{where}: "schema_hash" does not match its "input_schema"')
    return PinnedTool(
        name=name,
        description=entry["description"],
        input_schema=input_schema,
        schema_hash=entry["schema_hash"],
        description_hash=entry["description_hash"],
        annotations=annotations,
    )


def _expect_fields(
    document: Any, fields: tuple[str, ...], where: str, optional: tuple[str, ...] = ()
) -> None:
    if not isinstance(document, dict):
        raise OperatorFileError(f"{where} must be a JSON object")
    for key in document:
        if key not in fields and key not in optional:
            raise OperatorFileError(f'{where} has the unknown field "{sanitize(key)}"')
    for key in fields:
        if key not in document:
            raise OperatorFileError(f'{where} has no "{key}"')


def _indented(value: Any, indent: str) -> str:
    inner = indent + "  "
    if isinstance(value, Mapping) and value:
        items = [
            f"{inner}{canonical_json(key)}: {_indented(value[key], inner)}" for key in sorted(value)
        ]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    if isinstance(value, list) and value:
        items = [f"{inner}{_indented(item, inner)}" for item in value]
        return "[\n" + ",\n".join(items) + "\n" + indent + "]"
    return canonical_json(value)


def schema_text(raw_tool: Mapping[str, Any]) -> str:
    """The canonical JSON text of a listed tool's input schema, from the bytes it was sent in."""
    return canonical_json(raw_tool.get("inputSchema"))


def description_hash(raw_tool: Mapping[str, Any]) -> str:
    """SHA-256 hex of the canonical JSON encoding of a listed tool's description."""
    # An absent description is hashed as "", so adding one later changes the hash.
    return sha256_hex(canonical_bytes(raw_tool.get("description", "")))


def pin_raw_tool(name: str, raw_tool: Mapping[str, Any]) -> PinnedTool:
    """Pin one tool from its listing entry, parsed from the raw bytes with literals kept."""
    description = raw_tool.get("description", "")
    input_schema = schema_text(raw_tool)
    annotations = raw_tool.get("annotations")
    return PinnedTool(
        name=name,
        description=description if isinstance(description, str) else canonical_json(description),
        input_schema=input_schema,
        schema_hash=sha256_hex(input_schema.encode("utf-8")),
        description_hash=description_hash(raw_tool),
        annotations=dict(annotations) if isinstance(annotations, dict) else None,
    )
