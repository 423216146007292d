"""The README's library quick start is a program that runs, not a sketch."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_readme_library_quick_start_runs(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", readme, re.DOTALL)
    program = next(block for block in blocks if "anyio.run(main)" in block)
    finished = subprocess.run(
        [sys.executable, "-c", program], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert finished.returncode == 0, finished.stderr
    assert finished.stdout.strip().endswith("completed note written")
    assert "'lines': 1" in finished.stdout and "'path': 'today.md'" in finished.stdout
    assert (tmp_path / "notes" / "today.md").read_text() == "hello\n"
    assert (tmp_path / "runs.db").stat().st_mode & 0o777 == 0o600
