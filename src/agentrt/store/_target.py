"""What a database target names: a PostgreSQL URL or a file (read by the proxy's
configuration before anything of the store is imported, issue 36)."""

from __future__ import annotations

__all__ = ["is_postgres_url"]


def is_postgres_url(target: object) -> bool:
    """Whether a database target is a PostgreSQL URL rather than a file path."""
    return isinstance(target, str) and target.startswith(("postgresql://", "postgres://"))
