"""A run's principal: who asked for it, as the proxy's bearer token proved (issue 35).

Recorded only in the run's `run_started` event, under `"principal"`, and only when
the run has one, so a run without one (the library's, a stdio proxy's, a proxy
behind the shared `--token`) is written exactly as before.  The event is the one
record: it is hash-chained, so a principal edited afterwards fails `verify_chain`.
Never the token itself: its subject, issuer, client id, `jti`, and the scopes and
groups the proxy's rules may read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from ..canonical import parse_json
from ..sanitize import sanitize
from ._records import Connection

__all__ = [
    "PRINCIPAL_FIELD",
    "Principal",
    "principal_from_payload",
    "principal_from_row",
    "read_principal",
]

# The key of the `run_started` payload that holds it (absent when the run has none).
PRINCIPAL_FIELD: Final = "principal"

# One indexed read (`events_by_run`): a run's first event is its `run_started`.
PRINCIPAL_OF_RUN: Final = (
    "SELECT payload FROM events WHERE run_id = ? AND type = 'run_started' ORDER BY seq LIMIT 1"
)


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a run is for: the subject of a validated access token and what it carried.

    `issuer` and `subject` together name the person (a subject is unique only at its
    issuer); `client_id` the program they used; `jti` the token (to find it in the
    issuer's logs) — never the token."""

    issuer: str
    subject: str
    client_id: str | None = None
    jti: str | None = None
    scopes: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()

    def as_payload(self) -> dict[str, Any]:
        """The principal as its `run_started` field (what the chain hashes)."""
        payload: dict[str, Any] = {"issuer": self.issuer, "subject": self.subject}
        if self.client_id is not None:
            payload["client_id"] = self.client_id
        if self.jti is not None:
            payload["jti"] = self.jti
        payload["scopes"] = list(self.scopes)
        payload["groups"] = list(self.groups)
        return payload

    def label(self) -> str:
        """One line for a person: `subject (client)`, escaped."""
        client = f" via {sanitize(self.client_id)}" if self.client_id else ""
        return f"{sanitize(self.subject)}{client}"


def _strings(value: object) -> tuple[str, ...]:
    if isinstance(value, Sequence) and not isinstance(value, str):
        return tuple(str(item) for item in value)
    return ()


def _optional(value: object) -> str | None:
    return None if value is None else str(value)


def principal_from_payload(payload: Mapping[str, Any]) -> Principal | None:
    """The principal a `run_started` payload records, or None when it records none."""
    field = payload.get(PRINCIPAL_FIELD)
    if not isinstance(field, Mapping):
        return None
    return Principal(
        issuer=str(field.get("issuer", "")),
        subject=str(field.get("subject", "")),
        client_id=_optional(field.get("client_id")),
        jti=_optional(field.get("jti")),
        scopes=_strings(field.get("scopes")),
        groups=_strings(field.get("groups")),
    )


def principal_from_row(row: Any) -> Principal | None:
    """The principal in a row of `PRINCIPAL_OF_RUN` (its `run_started` payload)."""
    payload = parse_json(row[0])
    return principal_from_payload(payload) if isinstance(payload, Mapping) else None


def read_principal(connection: Connection, run_id: str) -> Principal | None:
    """The principal of `run_id` from its `run_started` event, on `connection`."""
    row = connection.execute(PRINCIPAL_OF_RUN, (run_id,)).fetchone()
    return None if row is None else principal_from_row(row)
