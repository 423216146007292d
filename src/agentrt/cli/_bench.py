"""`agentrt bench`: scoring an agent that acts (see docs/bench.md).

`bench compare FILE…` reads results files strictly (a file whose summary
does not follow from its trials is refused) and prints them side by side as
Markdown.
"""

from __future__ import annotations

from pathlib import Path

import click

from ..bench import MAX_FILE_BYTES, BenchError, Results, compare_markdown, decode_results
from ..sanitize import sanitize
from ._app import EXIT_REFUSED, EXIT_UNUSABLE, CommandError

__all__ = ["bench"]


@click.group()
def bench() -> None:
    """Score an agent that acts: compare results files."""


def read_results(path: str) -> Results:
    """The results file at `path`, read whole and checked; a refusal names the file."""
    try:
        with Path(path).open("rb") as file:
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
