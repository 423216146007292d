"""The operator's log: the proxy's stderr, one line at a time."""

from __future__ import annotations

from typing import IO

__all__ = ["log_line"]


def log_line(stream: IO[str], line: str) -> None:
    """One line on the operator's log (the proxy's stderr)."""
    stream.write(line + "\n")
    stream.flush()
