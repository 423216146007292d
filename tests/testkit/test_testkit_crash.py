"""The crash-and-resume harness against a deliberately non-idempotent tool: kill -9 before and
after every write, resume, count the mails sent."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrt.testkit import CrashPoint, crash_at_every_write

HERE = str(Path(__file__).parent)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_a_run_resumed_through_the_gate_sends_each_mail_at_most_once(tmp_path: Path) -> None:
    report = crash_at_every_write(
        "crash_scenarios:careful", workdir=tmp_path, extra_path=[HERE], timeout=90
    )
    report.assert_at_most_once()
    # Two points a write, for every write of the whole run (start, two sends, the end).
    assert len(report.points) >= 2 * 6
    assert report.points[0] == CrashPoint(1, "before")
    # Every point was reached: a run killed at each one left its database to resume.
    for point in report.points:
        assert (tmp_path / f"{point.write}-{point.moment}" / "runs.db").exists()


def test_a_resume_that_bypasses_the_gate_is_caught_sending_twice(tmp_path: Path) -> None:
    report = crash_at_every_write(
        "crash_scenarios:careless", workdir=tmp_path, extra_path=[HERE], timeout=90
    )
    assert not report.ok
    # Killed after a send and before its result was recorded, it sends that mail again.
    assert any(effects.get("mail to ann") == 2 for effects in report.repeated.values())
    with pytest.raises(AssertionError, match="effects repeated after a crash and a resume"):
        report.assert_at_most_once()


def test_without_a_workdir_the_harness_removes_its_temporary_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    report = crash_at_every_write("crash_scenarios:idle", extra_path=[HERE], timeout=90)
    assert report.ok and report.points == ()
    assert list(tmp_path.iterdir()) == []
