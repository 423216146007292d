"""What the model is told: a recorded result, or plain prose behind a fixed prefix.

Hosts and tests recognise an answer by its prefix.  `PENDING_APPROVAL`,
`IN_PROGRESS`, `INTERRUPTED`, `UNKNOWN_OUTCOME` and `UNRECORDED` are not
errors (nothing went wrong; the model should wait); the others are, and
`TOOL_ERROR` is the upstream tool's own failure.  No answer names the
database, the configuration or a run id: the model may tell the user that a
person approves in the agentrt inbox or with `agentrt approve`, and no more.  Text a server
or the model chose is sanitized and bounded before it goes into prose.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Final

from ..canonical import JSONBoundaryError, parse_json
from ..sanitize import sanitize
from ..store import epoch_to_iso
from ._forward import Forwarded

__all__ = ["Answer", "Prefix", "admits_waiting", "bounded", "listed_output_schema"]

MAX_QUOTED_CHARS: Final = 1_000


class Prefix(enum.StrEnum):
    PENDING_APPROVAL = "PENDING_APPROVAL"
    IN_PROGRESS = "IN_PROGRESS"
    INTERRUPTED = "INTERRUPTED"
    UNKNOWN_OUTCOME = "UNKNOWN_OUTCOME"
    UNRECORDED = "UNRECORDED"
    DENIED = "DENIED"
    INVALID = "INVALID"
    REJECTED = "REJECTED"
    EXPIRED = "EXPIRED"
    DUPLICATE = "DUPLICATE"
    BLOCKED = "BLOCKED"
    UNAVAILABLE = "UNAVAILABLE"
    STALE = "STALE"
    TOOL_ERROR = "TOOL_ERROR"

    @property
    def is_error(self) -> bool:
        return self not in _NOT_ERRORS


_NOT_ERRORS: Final = frozenset(
    {
        Prefix.PENDING_APPROVAL,
        Prefix.IN_PROGRESS,
        Prefix.INTERRUPTED,
        Prefix.UNKNOWN_OUTCOME,
        Prefix.UNRECORDED,
    }
)

_WAIT_FOR_A_PERSON: Final = (
    "Do not retry it and do not try another tool to do the same thing. Tell the user that "
    "a person must approve it in the agentrt inbox or with the agentrt approve command; "
    "you cannot approve it yourself. Once it is approved, call this same tool ({tool}) "
    "again with exactly the same arguments and it will run once."
)

# The structured content of an answer that waits (PENDING_APPROVAL, IN_PROGRESS, …) for a
# tool whose listing declares an `outputSchema`: the listing admits it beside the server's
# own shape (`listed_output_schema`), so a host shows a waiting call as waiting, not failed.
_WAITING_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "agentrt": {
            "type": "object",
            "properties": {
                "status": {"type": "string"},
                "message": {"type": "string"},
            },
            "required": ["status", "message"],
        }
    },
    "required": ["agentrt"],
}
# Kept at the root when a server's schema is wrapped: its `$ref`s point at them from there.
_ROOT_KEYWORDS: Final = ("$schema", "$id", "$defs", "definitions")


def listed_output_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The `outputSchema` a host is shown for a server's `schema`: the server's shape, or
    the gate's waiting answer (`_WAITING_SCHEMA`).

    Both official clients refuse a non-error result without the structured content an
    `outputSchema` promises, so without this a held call could only be sent as an error,
    which hosts show as a failure (decision 0031).  A schema whose `$ref`s point anywhere
    but its `$defs`/`definitions` cannot be wrapped without breaking them: it is listed as
    the server sent it, and such a tool's waiting answers stay errors.
    """
    if any(
        ref != "#" and not ref.startswith(("#/$defs/", "#/definitions/")) for ref in _refs(schema)
    ):
        return schema
    kept: dict[str, Any] = {key: schema[key] for key in _ROOT_KEYWORDS if key in schema}
    own = {key: value for key, value in schema.items() if key not in _ROOT_KEYWORDS}
    return {**kept, "type": "object", "anyOf": [own, _WAITING_SCHEMA]}


def admits_waiting(listed: dict[str, Any] | None) -> bool:
    """Whether a listed `outputSchema` admits the gate's waiting answer."""
    branches = listed.get("anyOf") if listed is not None else None
    return isinstance(branches, list) and bool(branches) and branches[-1] == _WAITING_SCHEMA


def _refs(value: Any) -> list[str]:
    if isinstance(value, dict):
        found = [value["$ref"]] if isinstance(value.get("$ref"), str) else []
        return found + [ref for item in value.values() for ref in _refs(item)]
    if isinstance(value, list):
        return [ref for item in value for ref in _refs(item)]
    return []


def bounded(text: str, limit: int = MAX_QUOTED_CHARS) -> str:
    """`text` sanitized and cut to `limit` characters, for quoting inside prose."""
    clean = sanitize(text)
    return clean if len(clean) <= limit else clean[:limit] + "…"


@dataclass(frozen=True, slots=True)
class Answer:
    """One `tools/call` result as the host receives it."""

    text: str
    is_error: bool
    prefix: Prefix | None = None
    result_object: dict[str, Any] | None = None
    """The server's own result object, bounded, when it is forwarded as it came."""

    # -- what the gate recorded ----------------------------------------------

    @classmethod
    def result(cls, content: str, forwarded: Forwarded | None = None) -> Answer:
        """The server's result as it came (`forwarded`), or, without it (`"results":
        "flattened"`, or a run an earlier process finished), the recorded mapping:
        a JSON string as its text, any other value as JSON."""
        try:
            value = parse_json(content)
        except JSONBoundaryError:
            value = None
        text = value if isinstance(value, str) else content
        if forwarded is not None:
            return cls(text, is_error=False, result_object=forwarded.result)
        return cls(text, is_error=False)

    def waiting_structure(self) -> dict[str, Any] | None:
        """The structured content of an answer that waits (not an error, not a result)."""
        if self.prefix is None or self.prefix.is_error:
            return None
        return {"agentrt": {"status": str(self.prefix), "message": self.text}}

    @classmethod
    def tool_error(cls, error: str) -> Answer:
        """The upstream tool failed (it said so, or its output broke its own schema)."""
        return cls._prose(Prefix.TOOL_ERROR, bounded(error, 4 * MAX_QUOTED_CHARS))

    # -- prose ---------------------------------------------------------------

    @classmethod
    def _prose(cls, prefix: Prefix, text: str) -> Answer:
        return cls(f"{prefix}: {text}", prefix.is_error, prefix)

    @classmethod
    def pending(cls, tool: str, approval_id: str) -> Answer:
        return cls._prose(
            Prefix.PENDING_APPROVAL,
            f"this call needs a person's approval and is waiting for it (approval "
            f"{approval_id}). Nothing ran. " + _WAIT_FOR_A_PERSON.format(tool=tool),
        )

    @classmethod
    def interrupted(cls, tool: str, approval_id: str) -> Answer:
        return cls._prose(
            Prefix.INTERRUPTED,
            "an earlier attempt of this exact call was cut off before it finished "
            "and may have taken effect. It will not run again unless a person decides it "
            f"should (approval {approval_id}). " + _WAIT_FOR_A_PERSON.format(tool=tool),
        )

    @classmethod
    def unknown_outcome(cls, tool: str, approval_id: str) -> Answer:
        return cls._prose(
            Prefix.UNKNOWN_OUTCOME,
            "this call ended without an answer the gate could read: it timed out, "
            "lost its connection, or the server's answer could not be read (too long or "
            "malformed), so it may or may not have taken effect. A person decides whether it "
            f"runs again (approval {approval_id}); until then other changing calls to this "
            "same tool are blocked. " + _WAIT_FOR_A_PERSON.format(tool=tool),
        )

    @classmethod
    def unrecorded_outcome(cls, tool: str) -> Answer:
        """The request reached the server, then recording how it ended failed."""
        return cls._prose(
            Prefix.UNKNOWN_OUTCOME,
            f"this call to {tool} was sent to the server, but the gate could not record how "
            "it ended, so it may or may not have taken effect. It will not run again unless "
            f"a person decides it should; until then other changing calls to {tool} are "
            "blocked. " + _WAIT_FOR_A_PERSON.format(tool=tool),
        )

    @classmethod
    def in_progress(cls, tool: str) -> Answer:
        return cls._prose(
            Prefix.IN_PROGRESS,
            f"this exact call to {tool} is already running and its outcome will be recorded. "
            "Do not start it again; call again with the same arguments later to learn how it "
            "ended.",
        )

    @classmethod
    def unrecorded(cls) -> Answer:
        return cls._prose(
            Prefix.UNRECORDED,
            "the gate is shutting down and did not take this call; nothing ran and nothing "
            "was recorded.",
        )

    @classmethod
    def denied(cls, tool: str, reason: str) -> Answer:
        return cls._prose(
            Prefix.DENIED,
            f"the policy does not allow this call to {tool} ({bounded(reason)}). Nothing ran.",
        )

    @classmethod
    def invalid(cls, tool: str, problem: str) -> Answer:
        return cls._prose(
            Prefix.INVALID,
            f"the call to {bounded(tool, 80)} was not accepted: {bounded(problem)}. Nothing "
            "ran; correct the arguments and call again.",
        )

    @classmethod
    def rejected(cls, tool: str, note: str) -> Answer:
        said = f' The reviewer said: "{bounded(note)}".' if note else ""
        return cls._prose(
            Prefix.REJECTED,
            f"a person rejected this exact call to {tool}; nothing ran.{said} Do not retry "
            "it or try another tool to do the same thing.",
        )

    @classmethod
    def expired(cls, tool: str) -> Answer:
        return cls._prose(
            Prefix.EXPIRED,
            f"nobody decided on this exact call to {tool} in time, so it was not run. Do not "
            "retry it unless the user asks for it again.",
        )

    @classmethod
    def duplicate(cls, tool: str, when: float, succeeded: bool) -> Answer:
        outcome = "succeeded" if succeeded else "failed"
        return cls._prose(
            Prefix.DUPLICATE,
            f"this exact call to {tool} already ran at {epoch_to_iso(when)} and {outcome}; "
            "it was not run again.",
        )

    @classmethod
    def blocked(cls, tool: str) -> Answer:
        return cls._prose(
            Prefix.BLOCKED,
            f"an earlier call to {tool} may or may not have taken effect and waits for a "
            f"person's decision; no other changing call to {tool} runs until then. Nothing ran.",
        )

    @classmethod
    def status_unavailable(cls) -> Answer:
        return cls._prose(
            Prefix.UNAVAILABLE,
            "the gate could not read its records just now. Nothing was changed; call "
            "gate_status again in a moment.",
        )

    @classmethod
    def stale(cls, tool: str) -> Answer:
        """An approved call whose precondition read a different state than the one approved."""
        return cls._prose(
            Prefix.STALE,
            f"the call to {tool} was not run: the state changed after it was approved; "
            "nothing ran; calling again asks for a new approval (with the same arguments; a "
            "person decides it against the state as it is now).",
        )

    @classmethod
    def unavailable(cls, why: str) -> Answer:
        return cls._prose(Prefix.UNAVAILABLE, f"{why} Nothing ran.")
