"""What says the operator's rule files changed, taken light enough to stamp them as the
configuration is read, before a server starts (decision 0047)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .config import ProxyConfig

__all__ = ["Stamp", "rule_files", "rule_stamps", "stamp"]

Stamp = tuple[int, int, int] | None


def stamp(path: Path) -> Stamp:
    """What says a file changed: its modification time, size and mode (a chmod too)."""
    try:
        info = path.stat()
    except OSError:
        return None
    return (info.st_mtime_ns, info.st_size, info.st_mode)


def rule_files(config: ProxyConfig) -> list[Path]:
    """Where `classify` writes the rules: the configuration, and each server's rules file."""
    paths = [config.path]
    paths += [up.rules_path for up in config.servers if up.rules_path is not None]
    return list(dict.fromkeys(paths))


def rule_stamps(config: ProxyConfig) -> dict[Path, Stamp]:
    """The rule files as they are now; taken as the configuration is read, so a change made
    while the servers start and load is seen at the watch's first look."""
    return {path: stamp(path) for path in rule_files(config)}
