"""A crash-and-resume harness: kill the consumer's process at every write of a run, resume,
and check that each side effect happened at most once.

The consumer names a scenario, `module:function`, importable in a fresh
interpreter: `async def scenario(database: str, effects: str, resume: bool)`.
Called with `resume=False` it starts its run(s) on `database` through its own
Gate or Driver; with `resume=True` it finishes whatever is unfinished there
(`Driver.resume`, `Gate.resume`, and whatever a person would decide about an
interrupted action).  Its tools append one line per side effect they cause to
the file `effects` (a key that names the effect: "sent mail 7", "wrote
a.txt").

`crash_at_every_write` runs the scenario in a child process once per crash
point: the child is killed with SIGKILL just before the store's Nth write
commits, or just after it did (two points per write), for N = 1, 2, … until a
run gets through without reaching the point.  After each kill, a second child
resumes on the same database.  The report lists every effect that happened
more than once, and at which crash point.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

__all__ = ["CrashPoint", "CrashReport", "crash_at_every_write"]

CRASH_AT_VARIABLE: Final = "AGENTRT_TESTKIT_CRASH_AT"
"""The child's crash point: `N:before` or `N:after` (the Nth write of the store)."""


@dataclass(frozen=True, slots=True)
class CrashPoint:
    """Where the child was killed: just `before` or `after` the store's `write`th commit."""

    write: int
    moment: str

    def __str__(self) -> str:
        return f"{self.moment} write {self.write}"


@dataclass(frozen=True, slots=True)
class CrashReport:
    """What the harness found: the points it killed at, and the effects repeated at each."""

    points: tuple[CrashPoint, ...]
    repeated: dict[CrashPoint, dict[str, int]] = field(default_factory=dict)
    """For each crash point after which some effect happened more than once: effect → times."""

    @property
    def ok(self) -> bool:
        return not self.repeated

    def describe(self) -> str:
        if self.ok:
            return f"every effect happened at most once at each of {len(self.points)} crash points"
        lines = []
        for point, effects in self.repeated.items():
            counted = ", ".join(f"{effect!r} {times} times" for effect, times in effects.items())
            lines.append(f"killed {point}: {counted}")
        return "effects repeated after a crash and a resume:\n" + "\n".join(lines)

    def assert_at_most_once(self) -> None:
        """Raise `AssertionError` naming each crash point that repeated an effect."""
        if not self.ok:
            raise AssertionError(self.describe())


def _child(
    scenario: str, database: Path, effects: Path, resume: bool, crash_at: str | None,
    timeout: float, extra_path: Sequence[str],
) -> int:  # fmt: skip
    environment = dict(os.environ)
    environment.pop(CRASH_AT_VARIABLE, None)
    if crash_at is not None:
        environment[CRASH_AT_VARIABLE] = crash_at
    if extra_path:
        environment["PYTHONPATH"] = os.pathsep.join(
            [*extra_path, *filter(None, [environment.get("PYTHONPATH")])]
        )
    command = [sys.executable, "-m", "agentrt.testkit._crash_child", scenario, str(database),
               str(effects), "resume" if resume else "start"]  # fmt: skip
    done = subprocess.run(
        command, env=environment, capture_output=True, text=True, timeout=timeout,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    if done.returncode not in (0, -signal.SIGKILL):
        raise RuntimeError(
            f"the scenario {scenario} {'resuming' if resume else 'starting'} "
            f"(crash point {crash_at or 'none'}) exited with {done.returncode}: "
            f"{done.stderr.strip()[-2000:]}"
        )
    return done.returncode


def _effects(path: Path) -> Counter[str]:
    if not path.exists():
        return Counter()
    return Counter(line for line in path.read_text(encoding="utf-8").splitlines() if line)


def crash_at_every_write(
    scenario: str,
    *,
    workdir: str | os.PathLike[str] | None = None,
    max_writes: int = 200,
    timeout: float = 60.0,
    extra_path: Sequence[str] = (),
) -> CrashReport:
    """Kill `scenario` before and after each of its store's writes in turn; resume; count effects.

    `extra_path` is put on the children's PYTHONPATH (where the scenario's
    module lives).  Stops after the first point the scenario never reaches,
    or after `max_writes` writes (then `RuntimeError`: a run that writes
    without end is a finding of its own).  Each point's database and effects
    are kept in `workdir` when one is given; otherwise in a temporary
    directory removed before this returns.
    """
    if workdir is not None:
        return _crash_each_point(scenario, Path(workdir), max_writes, timeout, extra_path)
    with tempfile.TemporaryDirectory(prefix="agentrt-crash-") as base:
        return _crash_each_point(scenario, Path(base), max_writes, timeout, extra_path)


def _crash_each_point(
    scenario: str, base: Path, max_writes: int, timeout: float, extra_path: Sequence[str]
) -> CrashReport:
    points: list[CrashPoint] = []
    repeated: dict[CrashPoint, dict[str, int]] = {}
    for write in range(1, max_writes + 1):
        for moment in ("before", "after"):
            point = CrashPoint(write, moment)
            where = base / f"{write}-{moment}"
            where.mkdir(parents=True, exist_ok=True)
            database, effects = where / "runs.db", where / "effects.log"
            status = _child(scenario, database, effects, False, f"{write}:{moment}", timeout,
                            extra_path)  # fmt: skip
            if status == 0:
                # The scenario finished before reaching this point: every point was tried.
                return CrashReport(tuple(points), repeated)
            points.append(point)
            _child(scenario, database, effects, True, None, timeout, extra_path)
            counted = _effects(effects)
            twice = {effect: times for effect, times in counted.items() if times > 1}
            if twice:
                repeated[point] = twice
    raise RuntimeError(f"the scenario {scenario} made more than {max_writes} writes")
