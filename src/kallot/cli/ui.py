"""Terminal output shared by the CLI commands: the console they print tables on and the progress
bar long runs show. One rule for every command, so tables look the same everywhere.
"""

from __future__ import annotations

import sys

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

# Wide enough for the comparison tables when output goes to a file or a pipe (rich would use 80
# columns and abbreviate headers); a terminal keeps its own width.
PIPE_WIDTH = 140


def console(*, stderr: bool = False) -> Console:
    """A console for tables (stdout) or progress and errors (``stderr``)."""
    if stderr:
        return Console(stderr=True)
    return Console(width=None if sys.stdout.isatty() else PIPE_WIDTH)


def progress(out: Console) -> Progress:
    """The progress bar of a long run: description, bar, done/total, time elapsed."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=out,
        transient=False,
    )
