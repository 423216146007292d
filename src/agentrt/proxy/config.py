"""The proxy's one configuration file: which servers, which rules, which policy, which database.

Whoever can write this file chooses how every tool is classified and where
approvals are kept, so it is read only when the current user owns it and
nobody else can write it.  Every object refuses a field it does not know,
naming the field and the file: a misspelled `require_approval` would
otherwise silently fall back to a default.

A server's `rules` may be left out (no tool is classified yet, which is how
`agentrt init` writes it before `agentrt classify` names the tools); a rule's
`rename` replaces the final `<server>_<tool>` name the model sees.  A
server's `default_timeout` bounds a call whose rule sets no `timeout`, and is
`DEFAULT_SERVER_TIMEOUT` when left out.  `max_result_bytes` bounds what of
a result is forwarded to the host (`results: "flattened"` forwards the
recorded mapping instead); a rule's `repeat_window` and `outcome` are read
here and taken out before the rest is checked as a rules file is.  `"0s"`
turns `hold`, `repeat_window` and the expiries off.  `headers` (an endpoint's only) are
sent on every request to it, by a client that follows no redirect, so a
token is never handed to another host.  An endpoint without `headers` is
reached with the OAuth tokens `agentrt login` stored (its `auth` says which
client and grant: docs/oauth.md).  `note` is free text for the
operator (why a server is not pinned, how to install it once); nothing reads it.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from .._hostfiles import host_configuration_files
from ..canonical import JSONBoundaryError, canonical_json, parse_json
from ..errors import AgentrtError
from ..mcp import (
    Rules,
    Sandbox,
    Server,
    find_operator_file_reach,
    parse_duration,
    read_owned,
    rules_from_json,
)
from ..passkeys._config import parse_passkey_mode, tool_quorum
from ..passkeys._mode import PasskeyMode
from ..policy import ClassPolicy, DefaultPolicy, Outcome
from ..sanitize import sanitize
from ..store import GrantLimits, is_postgres_url
from ..tools import SideEffect
from ._flows import Flows, declared_labels, flow_rules, label_list, session_key
from ._forward import DEFAULT_MAX_RESULT_BYTES, MIN_MAX_RESULT_BYTES

if TYPE_CHECKING:
    # A section's reader is imported where the section is present: a configuration that
    # uses none of them reaches the servers' spawn sooner (issue 36).
    from ..mcp._tokens import AuthSettings
    from ._conditions import Condition
    from ._host_approval import HostApproval
    from ._notify import NotifyTarget
    from ._precondition_rule import Precondition
    from ._resource import PrincipalsConfig

__all__ = [
    "DEFAULT_APPROVAL_TTL",
    "DEFAULT_GRANT_TTL",
    "DEFAULT_HOLD",
    "DEFAULT_LEASE_TTL",
    "DEFAULT_MAX_PENDING",
    "DEFAULT_REPEAT_WINDOW",
    "DEFAULT_SERVER_TIMEOUT",
    "ConfigError",
    "InboxConfig",
    "ProxyConfig",
    "TelemetryConfig",
    "ToolRule",
    "UpstreamConfig",
    "load_config",
    "parse_duration",
]

DEFAULT_HOLD: Final = 15.0
DEFAULT_REPEAT_WINDOW: Final = 600.0
DEFAULT_MAX_PENDING: Final = 5
DEFAULT_APPROVAL_TTL: Final = 24 * 3600.0
DEFAULT_GRANT_TTL: Final = 24 * 3600.0
DEFAULT_LEASE_TTL: Final = 30.0
DEFAULT_SERVER_TIMEOUT: Final = 60.0
"""Seconds a call may take when neither its rule nor its server names a timeout."""

SESSION_PATTERN: Final = re.compile(r"^[A-Za-z0-9_-]{1,64}\Z")  # \Z: "$" allows a final newline

_TOP_FIELDS: Final = frozenset(
    {
        "database",
        "session",
        "servers",
        "policy",
        "hold",
        "repeat_window",
        "max_pending",
        "approval_ttl",
        "grant_ttl",
        "lease_ttl",
        "inbox",
        "telemetry",
        "labels",
        "stateless_session",
        "notify",
        "standing_grants",
        "approve_in_host",
        "checkpoint",
        "principals",
        "approval_auth",
        "approvers",
        "approvals",
    }
)
_CHECKPOINT_FIELDS: Final = frozenset({"key", "log", "every_events", "every"})
_INBOX_FIELDS: Final = frozenset({"listen", "notify", "token_file"})
_TELEMETRY_FIELDS: Final = frozenset({"otlp_endpoint", "content"})
_STANDING_GRANT_FIELDS: Final = frozenset({"max_for", "max_calls", "destructive"})
_APPROVE_IN_HOST_FIELDS: Final = frozenset(
    {"exclude_classes", "exclude_tools", "exclude_servers", "wait"}
)
_AUTH_FIELDS: Final = frozenset(
    {"grant", "client_id", "client_secret_file", "scope", "client_metadata_url"}
    # private_key_jwt and the identity assertion grant (docs/decisions/0045).
    | {"private_key_file", "alg", "authorization_server", "idp_token_endpoint"}
    | {"idp_client_id", "idp_client_secret_file", "id_token_file"}
)
_AUTH_TEXTS: Final = (
    "client_id",
    "scope",
    "client_metadata_url",
    "alg",
    "idp_client_id",
    "authorization_server",
    "idp_token_endpoint",
)
_AUTH_FILES: Final = (
    "client_secret_file",
    "private_key_file",
    "idp_client_secret_file",
    "id_token_file",
)
_SERVER_FIELDS: Final = frozenset(
    {
        "name",
        "command",
        "endpoint",
        "env",
        "inherit_env",
        "connect_timeout",
        "default_timeout",
        "manifest",
        "rules",
        "sandbox",
        "note",
        "revision",
        "headers",
        "max_result_bytes",
        "results",
        "prompts",
        "resource_rules",
        "client_requests",
        "labels",
        "auth",
    }
)
_CLIENT_REQUESTS: Final = {
    # kind: (the capability advertised upstream when forwarded, the answers allowed)
    "elicitation": ("elicitation", frozenset({"forward", "refuse", "forward_url"})),
    "sampling": ("sampling", frozenset({"forward", "refuse"})),
    "roots": ("roots", frozenset({"forward", "refuse"})),
}
_RESOURCE_RULE_FIELDS: Final = frozenset({"uri", "outcome"})
# Rule fields only the proxy reads; the rest of a rule is checked as a rules file is.
_PROXY_RULE_FIELDS: Final = frozenset(
    {"repeat_window", "outcome", "precondition", "reconcile", "labels", "approvals"}
)
_RESULT_MODES: Final = frozenset({"as_sent", "flattened"})
# "0s", "0", "0ms", "0m0s": a duration that is off.
_ZERO_DURATION: Final = re.compile(r"^(?:0+(?:\.0*)?(?:ns|us|µs|ms|s|m|h)?)+$")
_SANDBOX_FIELDS: Final = frozenset({"read", "write", "network", "home", "devices", "hide"})
# The proxy answers the host itself or passes a call on; it never ends a run
# on a model's request, so `abort` is not offered.
_POLICY_OUTCOMES: Final = {
    "allow": Outcome.ALLOW,
    "require_approval": Outcome.REQUIRE_APPROVAL,
    "deny": Outcome.DENY,
}


class ConfigError(AgentrtError):
    """The proxy configuration cannot be used; the message names the file and the field."""


@dataclass(frozen=True, slots=True)
class ToolRule:
    """A rule's proxy-only fields: `repeat_window` (seconds; 0 turns DUPLICATE and the
    REJECTED/EXPIRED repeats off for the tool) and `outcome` (overrides the class policy)."""

    repeat_window: float | None = None
    outcome: Outcome | None = None
    # The read-only tool of the same server whose result the tool's approvals bind
    # (`_precondition_rule.py`).
    precondition: Precondition | None = None
    # A retry of a cut-off call whose state already is its intended result is settled
    # as reconciled instead of asking a person (needs a precondition).
    reconcile: bool = False
    # Information-flow labels of this one tool, over its server's (docs/flows.md).
    labels: tuple[str, ...] = ()
    # `"approvals": {"require": N}`: the distinct approvers' passkeys this tool's approvals
    # need, over its side-effect class's quorum (passkey mode only; docs/identity.md).
    require: int | None = None


@dataclass(frozen=True, slots=True)
class UpstreamConfig:
    """One upstream server, with the manifest it was pinned to and the operator's rules.

    `results` is `"as_sent"` (the server's blocks forwarded, bounded by
    `max_result_bytes`) or `"flattened"` (the recorded mapping as one text).
    `tool_rules` holds the proxy-only rule fields, by the tool's name on its server.
    """

    server: Server
    manifest_path: Path
    rules: Rules
    rules_path: Path | None = None
    max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES
    results: str = "as_sent"
    tool_rules: dict[str, ToolRule] = field(default_factory=dict)
    # Each tool's compiled "when" list, keyed like `rules` (by the server's tool name).
    conditions: dict[str, tuple[Condition, ...]] = field(default_factory=dict)
    # The prompts the server may offer: None is every pinned one; () is none.
    prompts: tuple[str, ...] | None = None
    # (URI glob, outcome) in order; the first that matches a resources/read decides it.
    resource_rules: tuple[tuple[str, Outcome], ...] = ()
    # "elicitation" / "sampling" / "roots" → "forward" | "refuse" | "forward_url".
    client_requests: dict[str, str] = field(default_factory=dict)
    # Information-flow labels of every tool of the server (docs/flows.md).
    labels: tuple[str, ...] = ()
    # An endpoint's OAuth settings (`auth`), for `agentrt login` (docs/oauth.md).
    auth: AuthSettings | None = None

    def forwards(self, kind: str) -> str:
        """What the operator's rule says for one kind of server request (default refuse)."""
        return self.client_requests.get(kind, "refuse")


@dataclass(frozen=True, slots=True)
class InboxConfig:
    """The approval inbox the proxy serves alongside itself (loopback only)."""

    listen: str
    notify: bool = False
    token_file: Path | None = None


@dataclass(frozen=True, slots=True)
class TelemetryConfig:
    """`"telemetry"`: where spans go (an OTLP/HTTP base URL; else the standard variables) and
    whether arguments and results go with them (off unless the operator says `true`)."""

    otlp_endpoint: str | None = None
    content: bool = False


@dataclass(frozen=True, slots=True)
class ProxyConfig:
    """Everything `agentrt proxy` (and `agentrt pin/check`) reads from the file.

    Durations are float seconds; paths are absolute.  `hold` and
    `repeat_window` may be 0 (answer at once; no repeat rules);
    `approval_ttl`/`grant_ttl` are None for "never expires" (`"0s"`).
    """

    path: Path
    # A file (SQLite), or a `postgresql://` URL: several proxies may share one
    # PostgreSQL database (docs/postgresql.md).
    database: Path | str
    session: str
    servers: list[UpstreamConfig]
    policy: ClassPolicy = field(default_factory=DefaultPolicy)
    hold: float = DEFAULT_HOLD
    repeat_window: float = DEFAULT_REPEAT_WINDOW
    max_pending: int = DEFAULT_MAX_PENDING
    approval_ttl: float | None = DEFAULT_APPROVAL_TTL
    grant_ttl: float | None = DEFAULT_GRANT_TTL
    lease_ttl: float = DEFAULT_LEASE_TTL
    inbox: InboxConfig | None = None
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    # The labels and flow rules (docs/flows.md); the default: built-in labels, no rule.
    flows: Flows = field(default_factory=Flows)

    @property
    def labelled(self) -> bool:
        """Whether any server or rule carries a label: only then is taint kept and recorded."""
        return any(
            upstream.labels or any(rule.labels for rule in upstream.tool_rules.values())
            for upstream in self.servers
        )

    # `"notify"`: who is told of approvals, signed, from the outbox (`_notify.py`).
    notify: tuple[NotifyTarget, ...] = ()

    # `"checkpoint"`: the proxy signs the chain's head on its own (docs/retention.md).
    checkpoint: CheckpointConfig | None = None

    # The operator's maximum for standing grants; None: no grant may be given.
    standing_grants: GrantLimits | None = None
    # `"approve_in_host"`: a held call may ask the host's user (stdio only); None: never.
    approve_in_host: HostApproval | None = None
    # `"principals"`: over HTTP, the proxy is an OAuth protected resource (docs/identity.md).
    principals: PrincipalsConfig | None = None
    # `"approval_auth": "passkey"`: decisions only with approvers' passkeys (docs/identity.md).
    passkeys: PasskeyMode | None = None

    def protected_paths(self) -> list[Path]:
        """The files a server must never be pointed at: whoever writes them governs the proxy."""
        paths = [self.path]
        if isinstance(self.database, Path):
            paths.append(self.database)
            paths += [Path(f"{self.database}{suffix}") for suffix in ("-wal", "-shm", "-journal")]
        if self.inbox is not None and self.inbox.token_file is not None:
            paths.append(self.inbox.token_file)  # whoever reads it can decide approvals
        paths += [target.secret_file for target in self.notify]  # it signs what they are told
        if self.passkeys is not None:  # whoever writes it adds an approver's key
            paths.append(self.passkeys.registry)
        if self.checkpoint is not None:  # whoever holds the key signs history
            paths += [self.checkpoint.key, self.checkpoint.log]
        for upstream in self.servers:
            paths.append(upstream.manifest_path)
            if upstream.rules_path is not None:
                paths.append(upstream.rules_path)
        return paths


class _Reader:
    """Field access that names the file and the field in every refusal."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, where: str, problem: str) -> ConfigError:
        return ConfigError(f"{self.path}: {where} {problem}")

    def object(self, value: Any, where: str, known: frozenset[str]) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(where, "must be a JSON object")
        for name in value:
            if name not in known:
                raise self.fail(f"{where}.{sanitize(name)}", "is not a field this file may have")
        return value

    def string(self, value: Any, where: str) -> str:
        if not isinstance(value, str) or not value:
            raise self.fail(where, "must be a non-empty string")
        return value

    def strings(self, value: Any, where: str) -> list[str]:
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise self.fail(where, "must be a list of strings")
        return list(value)

    def duration(self, value: Any, where: str, *, off: bool = False) -> float:
        """A duration in seconds; with `off`, `"0s"` is accepted and is 0."""
        if not isinstance(value, str):
            raise self.fail(where, "must be a duration string like 15s, 1m30s or 250ms")
        if off and _ZERO_DURATION.match(value):
            return 0.0
        try:
            return parse_duration(value)
        except ValueError as exc:
            raise self.fail(where, f"is wrong: {exc}") from None

    def count(self, value: Any, where: str) -> int:
        if isinstance(value, bool) or not isinstance(value, (int, Decimal)):
            raise self.fail(where, "must be a positive whole number")
        if isinstance(value, Decimal) and value != value.to_integral_value():
            raise self.fail(where, "must be a positive whole number")
        number = int(value)
        if number < 1:
            raise self.fail(where, "must be a positive whole number")
        return number

    def path_field(self, value: Any, where: str) -> Path:
        text = self.string(value, where)
        candidate = Path(text).expanduser()
        if not candidate.is_absolute():
            candidate = self.path.parent / candidate
        return Path(os.path.abspath(candidate))


def load_config(path: str | os.PathLike[str]) -> ProxyConfig:
    """Read and check the proxy configuration at `path`.

    The file is read through `read_owned`, parsed with repeated keys refused,
    and every field checked; relative paths are relative to the file.  Raises
    `ConfigError` with one sentence naming the file and the field.
    """
    config_path = Path(os.path.abspath(Path(path).expanduser()))
    reader = _Reader(config_path)
    try:
        data = read_owned(config_path)
    except AgentrtError as exc:
        raise ConfigError(f"the proxy configuration: {exc}") from None
    try:
        document = parse_json(data)
    except JSONBoundaryError as exc:
        raise ConfigError(f"{config_path} is not usable JSON: {exc}") from None
    top = reader.object(document, "the configuration", _TOP_FIELDS)
    for required in ("database", "session", "servers"):
        if required not in top:
            raise reader.fail(required, "is required")

    session = reader.string(top["session"], "session")
    if not SESSION_PATTERN.match(session):
        raise reader.fail("session", "must be 1 to 64 letters, digits, '_' or '-'")
    database: Path | str
    if is_postgres_url(top["database"]):
        database = top["database"]
    else:
        database = reader.path_field(top["database"], "database")

    raw_servers = top["servers"]
    if not isinstance(raw_servers, list) or not raw_servers:
        raise reader.fail("servers", "must be a non-empty list of servers")
    servers = [_upstream(reader, raw, f"servers[{index}]") for index, raw in enumerate(raw_servers)]
    seen: set[str] = set()
    for upstream in servers:
        if upstream.server.name in seen:
            raise reader.fail(
                "servers", f'name the server "{sanitize(upstream.server.name)}" twice'
            )
        seen.add(upstream.server.name)

    known_labels = declared_labels(top["labels"], reader.fail) if "labels" in top else None
    flows = Flows() if known_labels is None else Flows(labels=known_labels)
    _check_labels(reader, servers, flows.labels)
    policy: ClassPolicy = DefaultPolicy()
    if "policy" in top:
        raw_policy = top["policy"]
        if isinstance(raw_policy, dict) and "flows" in raw_policy:
            raw_policy = {name: value for name, value in raw_policy.items() if name != "flows"}
            flows = dataclasses.replace(
                flows, rules=flow_rules(top["policy"]["flows"], flows.labels, reader.fail)
            )
        policy = _policy(reader, raw_policy)
    if "stateless_session" in top:
        flows = dataclasses.replace(
            flows, stateless_session=session_key(top["stateless_session"], reader.fail)
        )

    def duration(name: str, default: float, *, off: bool = False) -> float:
        return reader.duration(top[name], name, off=off) if name in top else default

    def expiry(name: str, default: float) -> float | None:
        # "0s" is "never expires".
        seconds = duration(name, default, off=True)
        return None if seconds == 0 else seconds

    config = ProxyConfig(
        path=config_path,
        database=database,
        session=session,
        servers=servers,
        policy=policy,
        hold=duration("hold", DEFAULT_HOLD, off=True),
        repeat_window=duration("repeat_window", DEFAULT_REPEAT_WINDOW, off=True),
        max_pending=(
            reader.count(top["max_pending"], "max_pending")
            if "max_pending" in top
            else DEFAULT_MAX_PENDING
        ),
        approval_ttl=expiry("approval_ttl", DEFAULT_APPROVAL_TTL),
        grant_ttl=expiry("grant_ttl", DEFAULT_GRANT_TTL),
        lease_ttl=duration("lease_ttl", DEFAULT_LEASE_TTL),
        inbox=_inbox(reader, top["inbox"]) if "inbox" in top else None,
        telemetry=_telemetry(reader, top["telemetry"]) if "telemetry" in top else TelemetryConfig(),
        flows=flows,
        notify=_notify(top["notify"], config_path) if "notify" in top else (),
        checkpoint=_checkpoint(reader, top["checkpoint"]) if "checkpoint" in top else None,
        standing_grants=(
            _standing_grants(reader, top["standing_grants"]) if "standing_grants" in top else None
        ),
        approve_in_host=(
            _approve_in_host(reader, top["approve_in_host"]) if "approve_in_host" in top else None
        ),
        passkeys=parse_passkey_mode(top, reader.path_field, reader.fail),
        principals=_principals(reader, top["principals"]) if "principals" in top else None,
    )
    config = _with_tool_quorums(reader, config)
    _refuse_servers_that_reach_the_operators_files(config)
    return _hide_the_operators_files(config)


def _upstream(reader: _Reader, raw: Any, where: str) -> UpstreamConfig:
    entry = reader.object(raw, where, _SERVER_FIELDS)
    for required in ("name", "manifest"):
        if required not in entry:
            raise reader.fail(f"{where}.{required}", "is required")
    name = reader.string(entry["name"], f"{where}.name")
    where = f'server "{sanitize(name)}"'
    command = reader.strings(entry["command"], f"{where} command") if "command" in entry else None
    endpoint = (
        reader.string(entry["endpoint"], f"{where} endpoint") if "endpoint" in entry else None
    )
    options: dict[str, Any] = {}
    if "env" in entry:
        options["env"] = reader.strings(entry["env"], f"{where} env")
    if "inherit_env" in entry:
        options["inherit_env"] = reader.strings(entry["inherit_env"], f"{where} inherit_env")
    if "connect_timeout" in entry:
        options["connect_timeout"] = reader.duration(
            entry["connect_timeout"], f"{where} connect_timeout"
        )
    options["default_timeout"] = (
        reader.duration(entry["default_timeout"], f"{where} default_timeout")
        if "default_timeout" in entry
        else DEFAULT_SERVER_TIMEOUT
    )
    # The proxy keeps a session with a server that speaks both eras: subscriptions, list
    # changes and a server's mid-call requests ride it (docs/decisions/0036).
    revision = entry.get("revision", "session")
    if revision not in ("auto", "session", "legacy"):
        raise reader.fail(f"{where} revision", 'must be "auto", "session" or "legacy"')
    options["revision"] = revision
    if "note" in entry and not isinstance(entry["note"], str):
        raise reader.fail(f"{where} note", "must be a string")
    if "headers" in entry:
        headers = entry["headers"]
        if endpoint is None:
            raise reader.fail(f"{where} headers", "are only for a server with an endpoint")
        if not isinstance(headers, dict) or not all(
            isinstance(value, str) for value in headers.values()
        ):
            raise reader.fail(f"{where} headers", "must be an object of header names to strings")
        options["http_client_factory"] = _client_sending(dict(headers))
    auth = _auth(reader, entry["auth"], where, endpoint, entry) if "auth" in entry else None
    if endpoint is not None and "headers" not in entry:
        # A remote server without static headers is an OAuth resource: its client
        # carries the tokens `agentrt login` stored, and only to its own origin.
        from ..mcp._oauth import oauth_client_factory

        options["http_client_factory"] = oauth_client_factory(name, endpoint)
    if "sandbox" in entry:
        options["sandbox"] = _sandbox(reader, entry["sandbox"], f"{where} sandbox")
    client_requests = _client_requests(reader, entry.get("client_requests", {}), where)
    # The server learns of a capability only when the operator forwards it.
    options["client_capabilities"] = {
        _CLIENT_REQUESTS[kind][0]: {} for kind, rule in client_requests.items() if rule != "refuse"
    }
    try:
        server = Server(name=name, command=command, endpoint=endpoint, **options)
    except ValueError as exc:
        raise ConfigError(f"{reader.path}: {exc}") from None

    manifest_path = reader.path_field(entry["manifest"], f"{where} manifest")
    max_result_bytes = DEFAULT_MAX_RESULT_BYTES
    if "max_result_bytes" in entry:
        max_result_bytes = reader.count(entry["max_result_bytes"], f"{where} max_result_bytes")
        if max_result_bytes < MIN_MAX_RESULT_BYTES:
            raise reader.fail(
                f"{where} max_result_bytes", f"must be at least {MIN_MAX_RESULT_BYTES}"
            )
    results = entry.get("results", "as_sent")
    if results not in _RESULT_MODES:
        raise reader.fail(f"{where} results", 'must be "as_sent" or "flattened"')
    raw_rules = entry.get("rules", {})
    rules_path: Path | None = None
    try:
        if isinstance(raw_rules, str):
            rules_path = reader.path_field(raw_rules, f"{where} rules")
            document = parse_json(read_owned(rules_path))
            source = sanitize(str(rules_path))
        elif isinstance(raw_rules, dict):
            document = raw_rules
            source = f"{reader.path} ({where} rules)"
        else:
            raise reader.fail(f"{where} rules", "must be an object or the path of a rules file")
        document, tool_rules = _proxy_rule_fields(reader, document, source)
        # Checked exactly as a rules file is: the same fields, the same refusals.
        file_rules = rules_from_json(canonical_json(document), source=source)
        rules: Rules = {
            tool: rule.to_rule(conditions_handled=True) for tool, rule in file_rules.items()
        }
        conditions = _conditions(file_rules)
    except ConfigError:
        raise
    except (OSError, ValueError, AgentrtError) as exc:
        raise ConfigError(f"{reader.path}: {where} rules: {exc}") from None
    _check_preconditions(reader, rules, tool_rules, where)
    return UpstreamConfig(
        server=server,
        manifest_path=manifest_path,
        rules=rules,
        rules_path=rules_path,
        max_result_bytes=max_result_bytes,
        results=str(results),
        auth=auth,
        tool_rules=tool_rules,
        conditions=conditions,
        prompts=_prompts(reader, entry.get("prompts", "all"), where),
        resource_rules=_resource_rules(reader, entry.get("resource_rules", []), where),
        client_requests=client_requests,
        labels=tuple(reader.strings(entry["labels"], f"{where} labels"))
        if "labels" in entry
        else (),
    )


def _prompts(reader: _Reader, raw: Any, where: str) -> tuple[str, ...] | None:
    if raw == "all":
        return None
    if raw == "none":
        return ()
    if isinstance(raw, list):
        return tuple(reader.strings(raw, f"{where} prompts"))
    raise reader.fail(f"{where} prompts", 'must be "all", "none" or a list of prompt names')


def _resource_rules(reader: _Reader, raw: Any, where: str) -> tuple[tuple[str, Outcome], ...]:
    if not isinstance(raw, list):
        raise reader.fail(f"{where} resource_rules", "must be a list of {uri, outcome} objects")
    rules: list[tuple[str, Outcome]] = []
    for position, item in enumerate(raw):
        place = f"{where} resource_rules[{position}]"
        rule = reader.object(item, place, _RESOURCE_RULE_FIELDS)
        if "uri" not in rule or "outcome" not in rule:
            raise reader.fail(place, 'needs "uri" (a glob) and "outcome"')
        outcome = (
            _POLICY_OUTCOMES.get(rule["outcome"]) if isinstance(rule["outcome"], str) else None
        )
        if outcome is None:
            raise reader.fail(f"{place} outcome", 'must be "allow", "require_approval" or "deny"')
        rules.append((reader.string(rule["uri"], f"{place} uri"), outcome))
    return tuple(rules)


def _client_requests(reader: _Reader, raw: Any, where: str) -> dict[str, str]:
    entry = reader.object(raw, f"{where} client_requests", frozenset(_CLIENT_REQUESTS))
    chosen: dict[str, str] = {}
    for kind, value in entry.items():
        allowed = _CLIENT_REQUESTS[kind][1]
        if value not in allowed:
            raise reader.fail(
                f"{where} client_requests.{kind}",
                "must be one of " + ", ".join(f'"{word}"' for word in sorted(allowed)),
            )
        chosen[kind] = str(value)
    return chosen


def _proxy_rule_fields(
    reader: _Reader, document: Any, source: str
) -> tuple[Any, dict[str, ToolRule]]:
    """Take the proxy-only fields out of each rule, checked; the rest is left for
    `rules_from_json`, which refuses any field it does not know."""
    if not isinstance(document, dict):
        return document, {}
    rest: dict[str, Any] = {}
    tool_rules: dict[str, ToolRule] = {}
    for tool, entry in document.items():
        if not isinstance(entry, dict):
            rest[tool] = entry
            continue
        where = f'the rule for "{sanitize(tool)}" in {source}:'
        repeat_window: float | None = None
        outcome: Outcome | None = None
        if "repeat_window" in entry:
            repeat_window = reader.duration(
                entry["repeat_window"], f"{where} repeat_window", off=True
            )
        if "outcome" in entry:
            value = entry["outcome"]
            if not isinstance(value, str) or value not in _POLICY_OUTCOMES:
                raise ConfigError(f"{where} outcome must be allow, require_approval or deny")
            outcome = _POLICY_OUTCOMES[value]
        precondition: Precondition | None = None
        if "precondition" in entry:
            from ._precondition_rule import parse_precondition

            try:
                precondition = parse_precondition(entry["precondition"], where)
            except ValueError as exc:
                raise ConfigError(f"{reader.path}: {exc}") from None
        reconcile = entry.get("reconcile", False)
        if not isinstance(reconcile, bool):
            raise ConfigError(f"{reader.path}: {where} reconcile must be true or false")
        if reconcile and precondition is None:
            raise ConfigError(
                f"{reader.path}: {where} reconcile needs a precondition to read the state with"
            )
        labels: tuple[str, ...] = ()
        if "labels" in entry:
            labels = tuple(reader.strings(entry["labels"], f"{where} labels"))
        require = (
            tool_quorum(entry["approvals"], f"{where} approvals", reader.fail)
            if "approvals" in entry
            else None
        )
        if (
            repeat_window is not None
            or outcome is not None
            or precondition is not None
            or labels
            or require is not None
        ):
            tool_rules[tool] = ToolRule(
                repeat_window=repeat_window, outcome=outcome, precondition=precondition,
                reconcile=reconcile, labels=labels, require=require,
            )  # fmt: skip
        rest[tool] = {
            name: value for name, value in entry.items() if name not in _PROXY_RULE_FIELDS
        }
    return rest, tool_rules


def _with_tool_quorums(reader: _Reader, config: ProxyConfig) -> ProxyConfig:
    """Each tool rule's `"approvals": {"require": N}` joins passkey mode's quorum, by the
    tool's final name (the rename, else `<server>_<tool>`, as the approvals record it)."""
    by_tool: dict[str, int] = {}
    for upstream in config.servers:
        for tool, extra in upstream.tool_rules.items():
            if extra.require is None:
                continue
            if config.passkeys is None:
                raise reader.fail(
                    f'server "{sanitize(upstream.server.name)}" rule "{sanitize(tool)}" approvals',
                    'counts approvers\' passkeys: it needs "approval_auth": "passkey"',
                )
            rule = upstream.rules.get(tool)
            renamed = rule.rename if rule is not None else None
            by_tool[renamed if renamed is not None else f"{upstream.server.name}_{tool}"] = (
                extra.require
            )
    if not by_tool or config.passkeys is None:
        return config
    quorum = dataclasses.replace(config.passkeys.quorum, by_tool=by_tool)
    return dataclasses.replace(config, passkeys=dataclasses.replace(config.passkeys, quorum=quorum))


def _check_preconditions(
    reader: _Reader, rules: Rules, tool_rules: dict[str, ToolRule], where: str
) -> None:
    """A precondition must name a tool of the same server the operator classified read-only:
    reading the state must never change it."""
    for tool, extra in tool_rules.items():
        if extra.precondition is None:
            continue
        read = extra.precondition.tool
        rule = rules.get(read)
        if rule is None or rule.side_effect is not SideEffect.READ_ONLY:
            raise ConfigError(
                f'{reader.path}: {where}: the rule for "{sanitize(tool)}" has the precondition '
                f'"{sanitize(read)}", which is not a tool of this server classified read_only'
            )


def _check_labels(reader: _Reader, servers: list[UpstreamConfig], known: Mapping[str, str]) -> None:
    """Every label a server or rule names is built in or declared at the top: a misspelled
    `egres` would otherwise leave a sending tool unlabelled."""
    for upstream in servers:
        where = f'server "{sanitize(upstream.server.name)}"'
        label_list(list(upstream.labels), known, f"{where} labels", reader.fail)
        for tool, rule in upstream.tool_rules.items():
            label_list(
                list(rule.labels), known, f'{where} rule "{sanitize(tool)}" labels', reader.fail
            )


def _notify(raw: Any, config_path: Path) -> tuple[NotifyTarget, ...]:
    from ._notify import parse_notify

    return parse_notify(raw, config_path)


def _principals(reader: _Reader, raw: Any) -> PrincipalsConfig:
    from ._resource import parse_principals

    return parse_principals(raw, reader.fail)


def _conditions(file_rules: Mapping[str, Any]) -> dict[str, tuple[Condition, ...]]:
    """Each rule's `when`, compiled (the conditions engine imported only for one)."""
    if not any(rule.when for rule in file_rules.values()):
        return {}
    from ._conditions import compile_when

    return {
        tool: compile_when(rule.when, f'the rule for "{sanitize(tool)}"')
        for tool, rule in file_rules.items()
        if rule.when
    }


def _standing_grants(reader: _Reader, raw: Any) -> GrantLimits:
    entry = reader.object(raw, "standing_grants", _STANDING_GRANT_FIELDS)
    if "max_for" not in entry:
        raise reader.fail("standing_grants.max_for", "is required (the longest a grant may last)")
    max_calls = (
        reader.count(entry["max_calls"], "standing_grants.max_calls")
        if "max_calls" in entry
        else None
    )
    destructive = entry.get("destructive", False)
    if not isinstance(destructive, bool):
        raise reader.fail("standing_grants.destructive", "must be true or false")
    return GrantLimits(
        reader.duration(entry["max_for"], "standing_grants.max_for"), max_calls, destructive
    )


def _approve_in_host(reader: _Reader, raw: Any) -> HostApproval | None:
    from ._host_approval import HostApproval

    if raw is False:
        return None
    if raw is True:
        return HostApproval()
    if not isinstance(raw, dict):
        raise reader.fail("approve_in_host", "must be true, false or an object")
    entry = reader.object(raw, "approve_in_host", _APPROVE_IN_HOST_FIELDS)
    classes = reader.strings(
        entry.get("exclude_classes", ["destructive"]), "approve_in_host.exclude_classes"
    )
    known = {str(side_effect) for side_effect in SideEffect}
    for name in classes:
        if name not in known:
            raise reader.fail(
                "approve_in_host.exclude_classes", f'names no class "{sanitize(name)}"'
            )
    return HostApproval(
        exclude_classes=frozenset(classes),
        exclude_tools=frozenset(
            reader.strings(entry.get("exclude_tools", []), "approve_in_host.exclude_tools")
        ),
        exclude_servers=frozenset(
            reader.strings(entry.get("exclude_servers", []), "approve_in_host.exclude_servers")
        ),
        wait=(
            reader.duration(entry["wait"], "approve_in_host.wait")
            if "wait" in entry
            else HostApproval().wait
        ),
    )


def _inbox(reader: _Reader, raw: Any) -> InboxConfig:
    from ..inbox import DEFAULT_LISTEN, InboxError, parse_listen

    entry = reader.object(raw, "inbox", _INBOX_FIELDS)
    listen = reader.string(entry.get("listen", DEFAULT_LISTEN), "inbox.listen")
    try:
        # Checked as a remote one would be, then held to loopback: the
        # proxy's inbox has no TLS, so its token must never cross a network.
        listener = parse_listen(listen, allow_remote=True, tls_cert="-", tls_key="-")
    except InboxError as exc:
        raise reader.fail("inbox.listen", f"is refused: {exc}") from None
    if not listener.loopback:
        raise reader.fail(
            "inbox.listen",
            "must be a loopback address such as 127.0.0.1:0; a remote inbox is "
            "`agentrt inbox --allow-remote` with TLS",
        )
    notify = entry.get("notify", False)
    if not isinstance(notify, bool):
        raise reader.fail("inbox.notify", "must be true or false")
    token_file = (
        reader.path_field(entry["token_file"], "inbox.token_file")
        if "token_file" in entry
        else None
    )
    return InboxConfig(listen=listen, notify=notify, token_file=token_file)


def _sandbox(reader: _Reader, raw: Any, where: str) -> Sandbox:
    entry = reader.object(raw, where, _SANDBOX_FIELDS)
    paths = {
        kind: [
            str(reader.path_field(item, f"{where} {kind}"))
            for item in reader.strings(entry[kind], f"{where} {kind}")
        ]
        for kind in ("read", "write", "hide")
        if kind in entry
    }
    network = entry.get("network", False)
    if not isinstance(network, bool):
        raise reader.fail(f"{where} network", "must be true or false")
    try:
        return Sandbox(
            network=network,
            home=reader.string(entry.get("home", "private"), f"{where} home"),
            devices=reader.string(entry.get("devices", "minimal"), f"{where} devices"),
            **paths,
        )
    except ValueError as exc:
        raise reader.fail(where, f"is wrong: {exc}") from None


def _auth(reader: _Reader, raw: Any, where: str, endpoint: str | None, entry: Any) -> AuthSettings:
    """A server's `auth`: its OAuth grant and client (docs/oauth.md)."""
    from ..mcp._tokens import AuthSettings

    if endpoint is None or "headers" in entry:
        raise reader.fail(f"{where} auth", "is only for a server with an endpoint and no headers")
    value = reader.object(raw, f"{where} auth", _AUTH_FIELDS)
    grant = value.get("grant", "authorization_code")
    if grant not in ("authorization_code", "client_credentials", "identity_assertion"):
        raise reader.fail(
            f"{where} auth.grant",
            'must be "authorization_code", "client_credentials" or "identity_assertion"',
        )
    texts: dict[str, str] = {
        key: reader.string(value[key], f"{where} auth.{key}") for key in _AUTH_TEXTS if key in value
    }
    files: dict[str, Path] = {
        key: reader.path_field(value[key], f"{where} auth.{key}")
        for key in _AUTH_FILES
        if key in value
    }
    secret = files.get("client_secret_file")
    for key in ("authorization_server", "idp_token_endpoint"):
        if key in texts and not texts[key].startswith(("http://", "https://")):
            raise reader.fail(f"{where} auth.{key}", "must be an http:// or https:// URL")
    if grant == "client_credentials" and (
        "client_id" not in texts or (secret is None) == ("private_key_file" not in files)
    ):
        raise reader.fail(
            f"{where} auth",
            "with the client_credentials grant needs client_id and client_secret_file "
            "or private_key_file (one of them)",
        )
    if "private_key_file" in files and grant != "client_credentials":
        raise reader.fail(f"{where} auth.private_key_file", "is for the client_credentials grant")
    if "alg" in texts:
        from ..mcp._assertions import SIGNING_ALGORITHMS

        if "private_key_file" not in files:
            raise reader.fail(f"{where} auth.alg", "needs a private_key_file beside it")
        if texts["alg"] not in SIGNING_ALGORITHMS:
            raise reader.fail(
                f"{where} auth.alg", f"must be one of {', '.join(sorted(SIGNING_ALGORITHMS))}"
            )
    assertion_fields = ("idp_token_endpoint", "idp_client_id", "id_token_file")
    if grant == "identity_assertion":
        needed = ("client_id", "client_secret_file", *assertion_fields)
        if any(key not in texts and key not in files for key in needed):
            raise reader.fail(
                f"{where} auth", f"with the identity_assertion grant needs {', '.join(needed)}"
            )
    else:
        for key in (*assertion_fields, "idp_client_secret_file", "authorization_server"):
            if key in texts or key in files:
                raise reader.fail(f"{where} auth.{key}", "is for the identity_assertion grant")
    if secret is not None and "client_id" not in texts:
        raise reader.fail(f"{where} auth.client_secret_file", "needs a client_id beside it")
    settings: dict[str, Any] = {**texts, **files}
    return AuthSettings(grant=grant, **settings)


def _client_sending(headers: dict[str, str]) -> Callable[[], Any]:
    """A factory of one new HTTP client per connection, sending `headers` and following
    no redirect (a redirect would hand the headers, often a token, to another host)."""

    def client() -> Any:
        import httpx2

        return httpx2.AsyncClient(
            headers=headers, follow_redirects=False, timeout=httpx2.Timeout(30.0, read=300.0)
        )

    return client


@dataclass(frozen=True, slots=True)
class CheckpointConfig:
    """`"checkpoint"`: sign the chain's head with `key` into `log` every `every_events` new
    events and/or every `every_seconds` (when there is anything new), as `agentrt checkpoint`
    does (docs/retention.md)."""

    key: Path
    log: Path
    every_events: int | None = None
    every_seconds: float | None = None


def _checkpoint(reader: _Reader, raw: Any) -> CheckpointConfig:
    entry = reader.object(raw, "checkpoint", _CHECKPOINT_FIELDS)
    for name in ("key", "log"):
        if name not in entry:
            raise reader.fail(f"checkpoint.{name}", "is required")
    every_events = (
        reader.count(entry["every_events"], "checkpoint.every_events")
        if "every_events" in entry
        else None
    )
    if every_events is not None and every_events < 1:
        raise reader.fail("checkpoint.every_events", "must be at least 1")
    every_seconds = (
        reader.duration(entry["every"], "checkpoint.every") if "every" in entry else None
    )
    if every_events is None and every_seconds is None:
        raise reader.fail("checkpoint", "needs every_events, every, or both")
    return CheckpointConfig(
        key=reader.path_field(entry["key"], "checkpoint.key"),
        log=reader.path_field(entry["log"], "checkpoint.log"),
        every_events=every_events,
        every_seconds=every_seconds,
    )


def _telemetry(reader: _Reader, raw: Any) -> TelemetryConfig:
    entries = reader.object(raw, "telemetry", _TELEMETRY_FIELDS)
    endpoint = None
    if "otlp_endpoint" in entries:
        endpoint = reader.string(entries["otlp_endpoint"], "telemetry.otlp_endpoint")
        if not endpoint.startswith(("http://", "https://")):
            raise reader.fail("telemetry.otlp_endpoint", "must be an http:// or https:// URL")
    content = entries.get("content", False)
    if not isinstance(content, bool):
        raise reader.fail("telemetry.content", "must be true or false")
    return TelemetryConfig(endpoint, content)


def _policy(reader: _Reader, raw: Any) -> ClassPolicy:
    known = frozenset(str(side_effect) for side_effect in SideEffect)
    entries = reader.object(raw, "policy", known)
    outcomes: dict[SideEffect, Outcome] = {}
    for name, value in entries.items():
        if not isinstance(value, str) or value not in _POLICY_OUTCOMES:
            raise reader.fail(f"policy.{name}", "must be allow, require_approval or deny")
        outcomes[SideEffect(name)] = _POLICY_OUTCOMES[value]
    # A class the file leaves out is denied (ClassPolicy's rule), never
    # silently given the default's more generous answer.
    return ClassPolicy(outcomes)


def _names_or_holds(path: str, protected: str) -> bool:
    return protected == path or protected.startswith(path.rstrip(os.sep) + os.sep)


def _refuse_servers_that_reach_the_operators_files(config: ProxyConfig) -> None:
    """A stdio server handed the configuration, a manifest, the rules or the
    database (or a directory holding one), in its arguments or its environment,
    could rewrite the policy or forge an approval, so it is refused before it
    is ever started.  Paths are resolved, not compared as strings
    (`agentrt.mcp.find_operator_file_reach`)."""
    protected = config.protected_paths()
    resolved = [os.path.realpath(path) for path in protected]
    resolved += [os.path.abspath(path) for path in protected]
    for upstream in config.servers:
        if upstream.server.command is None:
            continue
        if upstream.server.sandbox is not None:
            # A sandboxed server sees only what is bound, so the binds are the
            # boundary: whatever its arguments say, it cannot reach beyond them.
            _refuse_binds_that_reach_the_operators_files(config, upstream.server, resolved)
            continue
        reach = find_operator_file_reach(upstream.server, protected)
        if reach is None:
            continue
        through = "" if reach.token == reach.value else f" (through {sanitize(repr(reach.token))})"
        raise ConfigError(
            f'{config.path}: server "{sanitize(upstream.server.name)}" '
            f"would be started with {sanitize(repr(reach.value))}{through}, which "
            f"reaches {sanitize(reach.protected)}; a server that can write it can rewrite "
            "the policy or forge an approval"
        )


def _refuse_binds_that_reach_the_operators_files(
    config: ProxyConfig, server: Server, protected: list[str]
) -> None:
    assert server.sandbox is not None
    # The files that exist are named first; one that does not yet could still be created.
    files = sorted(host_configuration_files(), key=lambda path: not path.exists())
    hosts = [os.path.abspath(path) for path in files]
    for bound in server.sandbox.write:
        for form in {os.path.abspath(bound), os.path.realpath(bound)}:
            for path in hosts:
                if _names_or_holds(form, path):
                    raise ConfigError(
                        f'{config.path}: server "{sanitize(server.name)}" has a sandbox '
                        f"write path {sanitize(bound)}, which holds {sanitize(path)}, where a "
                        "host keeps its MCP servers; a server that can write it can take the "
                        "proxy out of the host"
                    )
    for kind, paths in (("read", server.sandbox.read), ("write", server.sandbox.write)):
        for bound in paths:
            for form in {os.path.abspath(bound), os.path.realpath(bound)}:
                for path in protected:
                    if _names_or_holds(form, path):
                        raise ConfigError(
                            f'{config.path}: server "{sanitize(server.name)}" has a sandbox '
                            f"{kind} path {sanitize(bound)}, which reaches {path}; a server "
                            "that can see it can read the approvals or rewrite the policy"
                        )


def _hide_the_operators_files(config: ProxyConfig) -> ProxyConfig:
    """Mask the operator's files inside every sandbox, in case the command's own
    installation (bound for it) holds one of them."""
    protected = [str(path) for path in config.protected_paths()]
    servers = []
    for upstream in config.servers:
        sandbox = upstream.server.sandbox
        if sandbox is not None:
            hidden = dataclasses.replace(sandbox, hide=[*sandbox.hide, *protected])
            upstream = dataclasses.replace(
                upstream, server=dataclasses.replace(upstream.server, sandbox=hidden)
            )
        servers.append(upstream)
    return dataclasses.replace(config, servers=servers)
