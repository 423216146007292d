"""Typed errors of the runtime, each carrying one sentence a person can act on."""

from __future__ import annotations

__all__ = [
    "AgentrtError",
    "ApprovalError",
    "ApprovalHashMismatch",
    "RegistrationError",
    "RunLeased",
    "RunNotFound",
    "RunStateError",
    "SchemaError",
    "StoreError",
    "UnsafeDatabase",
]


class AgentrtError(Exception):
    """Base class of every error agentrt raises on purpose."""


class RegistrationError(AgentrtError):
    """A tool spec was refused at registration (missing field, bad name, bad schema, duplicate)."""


class SchemaError(RegistrationError):
    """A schema is not self-contained or does not compile."""


class StoreError(AgentrtError):
    """The database cannot be used as asked."""


class UnsafeDatabase(StoreError):
    """The database file is a symbolic link, writable by others, or from a newer build."""


class RunNotFound(AgentrtError):
    """No run with the given id exists."""


class RunStateError(AgentrtError):
    """The run is not in the state the operation needs (someone else moved it first)."""


class RunLeased(RunStateError):
    """A live process holds the run's lease."""

    def __init__(self, run_id: str, owner: str, expires_at: str) -> None:
        self.run_id = run_id
        self.owner = owner
        self.expires_at = expires_at
        super().__init__(f"run {run_id} is leased by {owner} until {expires_at}")


class ApprovalError(AgentrtError):
    """An approval cannot be decided or used as asked."""


class ApprovalHashMismatch(ApprovalError):
    """The stored approval no longer matches its hash, or the hash shown to the operator."""
