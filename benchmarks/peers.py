"""Peer proxies in venvs of their own, made on first use with `python -m venv` and pip.

Each peer is pinned by exact version.  A peer that does not install is
reported as such (with the tail of pip's output) instead of failing the run.
"""

from __future__ import annotations

import subprocess
import sys
import venv
from dataclasses import dataclass
from pathlib import Path
from typing import Final

PEERS_DIR: Final = Path(__file__).resolve().parent / ".peers"

# name -> pinned requirements.  mcp-proxy 0.13.0 needs mcp<2; FastMCP 4.1.6 runs on mcp 2.3.0.
PEERS: Final[dict[str, list[str]]] = {
    "mcp-proxy": ["mcp-proxy==0.13.0"],
    "fastmcp": ["fastmcp==4.1.6", "mcp==2.3.0"],
}


@dataclass(frozen=True)
class Peer:
    name: str
    python: Path | None
    problem: str = ""

    @property
    def bin(self) -> Path:
        assert self.python is not None
        return self.python.parent


def ensure(name: str, *, timeout: float = 420.0) -> Peer:
    """The peer's venv, created and installed if it is not there yet."""
    root = PEERS_DIR / name
    python = root / "bin" / "python"
    stamp = root / ".installed"
    requirements = PEERS[name]
    wanted = "\n".join(requirements)
    if stamp.exists() and stamp.read_text() == wanted and python.exists():
        return Peer(name, python)
    try:
        venv.EnvBuilder(with_pip=True, clear=True).create(root)
        completed = subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
             *requirements],
            capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError) as exc:
        return Peer(name, None, f"{name}: the venv could not be made: {exc}")
    if completed.returncode != 0:
        tail = (completed.stderr or completed.stdout).strip().splitlines()[-3:]
        return Peer(name, None, f"{name} does not install here: {' / '.join(tail)}")
    stamp.write_text(wanted)
    return Peer(name, python)


if __name__ == "__main__":
    for peer_name in sys.argv[1:] or list(PEERS):
        peer = ensure(peer_name)
        print(peer_name, peer.python or peer.problem)
