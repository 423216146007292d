"""`agentrt bench`: scoring an agent that acts (see docs/bench.md).

`bench compare FILE…` reads results files strictly (a file whose summary
does not follow from its trials is refused) and prints them side by side as
Markdown.  `bench run SCENARIOS --model M…` runs the built-in scenarios
through the gate and writes a results file.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import click

from ..bench import (
    MAX_FILE_BYTES,
    BenchError,
    Results,
    compare_markdown,
    decode_results,
    encode_results,
)
from ..errors import AgentrtError
from ..mcp._files import write_private
from ..sanitize import sanitize
from ._app import EXIT_REFUSED, EXIT_UNUSABLE, CommandError

if TYPE_CHECKING:
    from ..bench._scenarios import Scenario

__all__ = ["bench"]

_COMMIT = re.compile(r"[0-9a-f]{7,64}")


@click.group()
def bench() -> None:
    """Score an agent that acts: run scenarios, compare results files."""


def read_results(path: str) -> Results:
    """The results file at `path`, read whole and checked; a refusal names the file."""
    try:
        # Not blocking, and only a regular file: a FIFO named here must not hang the command.
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(descriptor, "rb") as file:
            if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
                raise CommandError(f"{sanitize(path)} is not a regular file", EXIT_UNUSABLE)
            data = file.read(MAX_FILE_BYTES + 1)
    except OSError as error:
        reason = sanitize(error.strerror or type(error).__name__)
        raise CommandError(f"cannot read {sanitize(path)}: {reason}", EXIT_UNUSABLE) from None
    try:
        return decode_results(data, path)
    except BenchError as error:
        raise CommandError(str(error), EXIT_REFUSED) from None


@bench.command()
@click.argument("files", nargs=-1, required=True, metavar="FILE...")
@click.option(
    "--allow-mixed-commits",
    is_flag=True,
    help="Compare files measured at different commits (each column names its commit).",
)
def compare(files: tuple[str, ...], allow_mixed_commits: bool) -> None:
    """Print results files side by side as Markdown tables.

    Refuses files of different taxonomies, and of different commits unless
    --allow-mixed-commits is given.
    """
    loaded = [(path, read_results(path)) for path in files]
    try:
        report = compare_markdown(loaded, allow_mixed_commits=allow_mixed_commits)
    except BenchError as error:
        raise CommandError(str(error), EXIT_REFUSED) from None
    click.echo(report, nl=False)


@bench.command()
@click.argument("scenarios", metavar="SCENARIOS")
@click.option(
    "--model",
    "models",
    multiple=True,
    required=True,
    help="scripted:careful, scripted:obedient, ollama:NAME, openai:NAME or anthropic:NAME; "
    "repeat for several modes.",
)
@click.option("--base-url", help="The model endpoint, for a provider model.")
@click.option("--repeats", type=click.IntRange(1, 100), default=1, show_default=True)
@click.option("--out", "out_path", metavar="FILE", help="Write the results here (else stdout).")
@click.option("--commit", help="The commit measured (default: the source tree's HEAD).")
@click.option(
    "--work",
    "work_dir",
    metavar="DIR",
    help="A new directory for the trials' database and sandboxes (default: a fresh one, kept).",
)
def run(
    scenarios: str,
    models: tuple[str, ...],
    base_url: str | None,
    repeats: int,
    out_path: str | None,
    commit: str | None,
    work_dir: str | None,
) -> None:
    """Run built-in SCENARIOS (comma-separated names, or all) through the gate.

    Each trial is classified from its run's audit trail, which stays in the
    work directory's bench.db (agentrt --db DIR/bench.db events RUN).
    """
    from ..bench._run import run_bench
    from ..bench._scenarios import SCENARIOS
    from ..demo import default_example_dir
    from ..store import open_store

    chosen = _chosen(scenarios, SCENARIOS)
    _check_models(models, base_url)
    measured = _commit(commit)
    work = _work(work_dir)
    click.echo(f"agentrt: trials in {sanitize(str(work))}", err=True)
    with open_store(work / "bench.db") as store:
        try:
            results = anyio.run(
                lambda: run_bench(
                    chosen,
                    models,
                    commit=measured,
                    work=work,
                    store=store,
                    example_dir=default_example_dir(),
                    repeats=repeats,
                    base_url=base_url,
                    log=lambda line: click.echo(sanitize(line), err=True),
                )
            )
        except BenchError as error:
            raise CommandError(str(error), EXIT_REFUSED) from None
    data = encode_results(results)
    if out_path is None:
        click.echo(data.decode("ascii"), nl=False)
    else:
        write_private(Path(out_path), data.decode("ascii"))


def _chosen(names: str, scenarios: tuple[Scenario, ...]) -> list[Scenario]:
    if names == "all":
        return list(scenarios)
    known = {scenario.name: scenario for scenario in scenarios}
    chosen = []
    for name in names.split(","):
        if name not in known:
            raise CommandError(
                f"no built-in scenario is called {sanitize(name)!r}; there are " + ", ".join(known),
                EXIT_UNUSABLE,
            )
        chosen.append(known[name])
    return chosen


def _check_models(models: tuple[str, ...], base_url: str | None) -> None:
    """Refuse a repeated, misnamed or unknown model before any trial starts."""
    from ..bench._scenarios import SCRIPTED_MODELS
    from ..bench._vocabulary import check_name
    from ..providers import agent_for

    if len(set(models)) != len(models):
        raise CommandError("a --model value is given twice; each model is one mode", EXIT_UNUSABLE)
    for model in models:
        try:
            check_name(model, "the --model value")
            if model not in SCRIPTED_MODELS:
                agent_for(model, base_url=base_url)
        except AgentrtError as error:
            raise CommandError(str(error), EXIT_UNUSABLE) from None


def _commit(given: str | None) -> str:
    if given is not None:
        if _COMMIT.fullmatch(given) is None:
            raise CommandError(
                f"--commit {sanitize(given)!r} is not 7-64 lowercase hexadecimal digits",
                EXIT_UNUSABLE,
            )
        return given
    source = Path(__file__).resolve().parents[3]
    try:
        found = subprocess.run(
            ["git", "-C", str(source), "rev-parse", "HEAD"],
            capture_output=True, text=True, timeout=10, check=False,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        found = None
    head = found.stdout.strip() if found is not None and found.returncode == 0 else ""
    if _COMMIT.fullmatch(head) is None:
        raise CommandError(
            "the commit measured is not known (agentrt is not run from a git checkout); "
            "pass --commit",
            EXIT_UNUSABLE,
        )
    return head


def _work(given: str | None) -> Path:
    if given is None:
        return Path(tempfile.mkdtemp(prefix="agentrt-bench-"))
    work = Path(given)
    try:
        work.mkdir(mode=0o700, parents=True, exist_ok=False)
    except OSError as error:
        reason = sanitize(error.strerror or type(error).__name__)
        raise CommandError(
            f"cannot create the work directory {sanitize(given)}: {reason} (it must be new)",
            EXIT_UNUSABLE,
        ) from None
    return work
