"""`agentrt bench compare`: results files side by side, only when they measure the same thing."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from agentrt.cli import cli

GOLDEN = Path(__file__).parent / "golden"


@pytest.fixture
def in_golden(monkeypatch: pytest.MonkeyPatch) -> Path:
    # The report names files as they were given; relative names keep the goldens portable.
    monkeypatch.chdir(GOLDEN)
    return GOLDEN


def _compare(*args: str) -> Result:
    return CliRunner().invoke(cli, ["bench", "compare", *args])


def _refused(result: Result, exit_code: int = 1) -> str:
    assert result.exit_code == exit_code, result.output
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("agentrt: ")
    return lines[0]


@pytest.mark.parametrize(
    ("files", "golden"),
    [
        (["one-commit-a.json", "one-commit-b.json"], "compare-one-commit.md"),
        (
            ["one-commit-a.json", "other-commit.json", "--allow-mixed-commits"],
            "compare-mixed-commits.md",
        ),
    ],
)
def test_compare_renders_the_golden_markdown(
    in_golden: Path, files: list[str], golden: str
) -> None:
    result = _compare(*files)
    assert result.exit_code == 0, result.output
    assert result.stdout == (in_golden / golden).read_text(encoding="utf-8")


def test_compare_names_each_columns_commit(in_golden: Path) -> None:
    report = _compare("one-commit-a.json", "other-commit.json", "--allow-mixed-commits").stdout
    heads = report.split("## Trials")[1].splitlines()[2]
    assert heads.count("@ `0123456789ab`") == 2 and heads.count("@ `fedcba987654`") == 1
    assert "**Mixed commits:**" in report
    assert "**Mixed commits:**" not in _compare("one-commit-a.json", "one-commit-b.json").stdout


def test_compare_refuses_files_of_different_commits_unless_allowed(in_golden: Path) -> None:
    message = _refused(_compare("one-commit-a.json", "other-commit.json"))
    assert "other-commit.json measured commit fedcba9876543210fedcba9876543210fedcba98" in message
    assert "one-commit-a.json measured commit 0123456789abcdef0123456789abcdef01234567" in message
    assert "--allow-mixed-commits" in message


@pytest.mark.parametrize(
    ("other", "expected"),
    [
        ("other-taxonomy.json", 'scored against taxonomy "agentrt/other" but one-commit-a.json'),
        ("redefined-taxonomy.json", 'defines taxonomy "agentrt/example" differently from'),
    ],
)
def test_compare_refuses_files_of_different_taxonomies(
    in_golden: Path, other: str, expected: str
) -> None:
    message = _refused(_compare("one-commit-a.json", other, "--allow-mixed-commits"))
    assert expected in message
    # Each file alone still compares: the refusal is of the pair.
    assert _compare(other).exit_code == 0


def test_compare_refuses_a_file_whose_summary_does_not_follow_from_its_trials(
    tmp_path: Path,
) -> None:
    document = json.loads((GOLDEN / "one-commit-a.json").read_text(encoding="utf-8"))
    document["modes"][1]["summary"]["disqualified"] = False
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(document), encoding="utf-8")
    message = _refused(_compare(str(GOLDEN / "one-commit-a.json"), str(broken)))
    assert f"results file {broken}:" in message
    assert 'the summary of mode "reckless" says "disqualified" is false' in message


def test_compare_of_a_file_that_cannot_be_read_is_unusable(tmp_path: Path) -> None:
    message = _refused(_compare(str(tmp_path / "missing.json")), exit_code=2)
    assert "cannot read" in message and "missing.json" in message
    fifo = tmp_path / "results.fifo"
    os.mkfifo(fifo)
    # A FIFO nobody writes to is refused at once, not read until the test times out.
    assert "is not a regular file" in _refused(_compare(str(fifo)), exit_code=2)
    assert "Is a directory" in _refused(_compare(str(tmp_path)), exit_code=2)


def test_compare_escapes_text_a_file_chose(in_golden: Path) -> None:
    report = _compare("one-commit-b.json").stdout
    line = next(line for line in report.splitlines() if "write-report#1" in line)
    # The reason's pipe, backticks and tag cannot break the Markdown; the bidi override is shown.
    assert "\u202e" not in report
    assert "529 \\| overloaded \\`twice\\` \\<b\\>\\\\u202ehidden" in line
