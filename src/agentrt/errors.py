"""Typed errors of the runtime, each carrying one sentence a person can act on."""

from __future__ import annotations

from .sanitize import sanitize

__all__ = [
    "AgentrtError",
    "ApprovalError",
    "ApprovalHashMismatch",
    "LeaseLost",
    "RegistrationError",
    "ResultNotRecorded",
    "RunLeased",
    "RunNotFound",
    "RunStateError",
    "SchemaError",
    "StoreBusy",
    "StoreConflict",
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
    """The database is not safe to use: a symbolic link, writable or deletable by others,
    from a newer build, not ours, damaged, or behind its head anchor."""


def newer_build(label: str, version: int, known: int) -> UnsafeDatabase:
    """The refusal of a database whose schema a newer build wrote (`label` already shown safe)."""
    return UnsafeDatabase(
        f"database {label} is from a newer build of agentrt (schema {version}, "
        f"this build knows {known}); upgrade agentrt to open it"
    )


class StoreBusy(StoreError):
    """Another writer held the database past the store's busy deadline; nothing was written."""


class StoreConflict(StoreError):
    """The database refused a write that breaks a unique key or a reference (PostgreSQL's
    integrity errors; SQLite raises `sqlite3.IntegrityError`, see `store.INTEGRITY_ERRORS`)."""


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


class LeaseLost(RunStateError):
    """Another gate took the run's lease over since this one acquired it."""


class ResultNotRecorded(AgentrtError):
    """A tool was called but its result could not be recorded: its outcome is unknown.

    The step stays `executing`, so recovery treats it as interrupted (a
    mutating tool then pauses on an `interrupted_side_effect` approval).
    """

    def __init__(self, run_id: str, step: int, cause: BaseException) -> None:
        self.run_id = run_id
        self.step = step
        self.cause = cause
        super().__init__(
            f"run {sanitize(run_id)} step {step}: the tool was called but its result was not "
            f"recorded ({sanitize(str(cause) or type(cause).__name__)}); its outcome is unknown"
        )
