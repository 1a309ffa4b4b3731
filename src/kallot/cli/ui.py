"""Terminal output shared by the CLI commands: the console they print tables on and the progress
bar long runs show. One rule for every command, so tables look the same everywhere. Also the
checks every command makes the same way before long work: output paths are writable; and the
choices of a policy option, listed in ``--help``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from kallot.core.errors import ConfigError

if TYPE_CHECKING:
    # rich is imported where a table, a bar or an error is drawn: ``kallot scheduler`` draws
    # none before its first bind, and rich is about 0.05 s of CPU of its start-up.
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table


class _PolicyChoice(click.Choice):  # type: ignore[type-arg]
    """``config.presets.POLICY_NAMES``, read when first asked for: importing the core (numpy and
    every plugin) is most of a command's start-up, and ``kallot --help`` needs none of it."""

    def __init__(self) -> None:
        super().__init__(())

    @property
    def choices(self) -> tuple[str, ...]:
        from kallot.config.presets import POLICY_NAMES

        return POLICY_NAMES

    @choices.setter
    def choices(self, value: object) -> None:
        pass  # the base class's __init__ sets it; the names come from the core


#: ``--policy`` of the simulations: the choices appear in ``--help`` and a wrong one is refused.
SIM_POLICY = _PolicyChoice()

# Wide enough for the comparison tables when output goes to a file or a pipe (rich would use 80
# columns and abbreviate headers); a terminal keeps its own width.
PIPE_WIDTH = 140


def console(*, stderr: bool = False) -> Console:
    """A console for tables (stdout) or progress and errors (``stderr``)."""
    from rich.console import Console

    if stderr:
        return Console(stderr=True, soft_wrap=True)  # an error stays one line however long
    # $COLUMNS, when set, is the width asked for (a narrow terminal's, or a test's).
    tty = sys.stdout.isatty() or "COLUMNS" in os.environ
    return Console(width=None if tty else PIPE_WIDTH)


def progress(out: Console) -> Progress:
    """The progress bar of a long run: description, bar, done/total, time elapsed."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=out,
        transient=False,
        # Twice a second: the bar's refresh thread takes the interpreter from the run it
        # shows (at rich's default of 10 a second, about 5% of a 1.5 s openb experiment).
        refresh_per_second=2,
    )


def _table(
    title: str, header: Sequence[str], rows: Sequence[Sequence[str]], *, fold: bool = True
) -> Table:
    from rich.table import Table

    table = Table(title=title, header_style="bold")
    for i, h in enumerate(header):
        # fold, not ellipsis: a value too long for its column wraps and is never cut
        table.add_column(
            h, justify="left" if i == 0 else "right", overflow="fold" if fold else "ellipsis"
        )
    for row in rows:
        table.add_row(*row)
    return table


def _fits(out: Console, title: str, header: Sequence[str], rows: Sequence[Sequence[str]]) -> bool:
    """Whether the table fits ``out`` with no word broken (measured as words, drawn folded)."""
    from rich.measure import Measurement

    table = _table(title, header, rows, fold=False)
    wide = out.options.update(max_width=10_000)  # unclamped: what the words need
    return Measurement.get(out, wide, table).minimum <= out.width


def fit_tables(
    out: Console, title: str, header: Sequence[str], rows: Sequence[Sequence[str]]
) -> list[Table]:
    """The table as it reads best in ``out``'s width (80 columns included): as given when its
    words fit; else transposed (one row per column) when that fits; else wrapped: several
    tables of as many columns as fit, each repeating the first column. A value is never cut
    short with an ellipsis (a column narrower than a word folds it)."""
    if _fits(out, title, header, rows):
        return [_table(title, header, rows)]
    flipped_header = [header[0], *(r[0] for r in rows)]
    flipped_rows = [[h, *(r[i] for r in rows)] for i, h in enumerate(header) if i > 0]
    if _fits(out, title, flipped_header, flipped_rows):
        return [_table(title, flipped_header, flipped_rows)]
    groups: list[list[int]] = [[]]
    for i in range(1, len(header)):
        trial = [0, *groups[-1], i]
        part = ([header[j] for j in trial], [[r[j] for j in trial] for r in rows])
        if groups[-1] and not _fits(out, title, *part):
            groups.append([])
        groups[-1].append(i)
    return [
        _table(
            title if k == 0 else f"{title} (continued)",
            [header[j] for j in (0, *g)],
            [[r[j] for j in (0, *g)] for r in rows],
        )
        for k, g in enumerate(groups)
    ]


def print_table(
    out: Console,
    title: str,
    header: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    legend: Mapping[str, str] | None = None,
) -> None:
    """Print ``fit_tables``; ``legend`` (short header -> meaning) on the lines below."""
    from rich.text import Text

    for table in fit_tables(out, title, header, rows):
        out.print(table)
    if legend:
        out.print(
            Text("; ".join(f"{k}: {v}" for k, v in legend.items() if k in header), style="dim")
        )


def check_output(path: Path | None, flag: str) -> None:
    """Fail before any long work if ``path`` cannot be written: it is a directory, or its nearest
    existing parent is not a writable directory (missing parents are created when writing)."""
    if path is None:
        return
    if path.is_dir():
        raise ConfigError(flag, str(path), "a file path, not a directory")
    parent = path.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(flag, str(path), f"a path in a writable directory ({parent} is not)")
    if path.exists() and not os.access(path, os.W_OK):
        raise ConfigError(flag, str(path), "a writable file")


def error(message: object) -> None:
    """``<command>: error: <message>`` on stderr, on one line (no wrapping, no markup in the
    message): the same prefix as the usage errors ``run_app`` prints."""
    from rich.text import Text

    ctx = click.get_current_context(silent=True)
    where = f"{ctx.command_path}: " if ctx is not None else ""
    text = " ".join(str(message).split()) if "\n" not in str(message) else str(message)
    console(stderr=True).print(Text.assemble(where, ("error:", "red"), " ", text))


def _say(line: str, **kw: Any) -> None:
    """One line on stderr as ``Text`` (no markup read in it)."""
    from rich.text import Text

    console(stderr=True).print(Text(line), **kw)


def run_app(app: Any, prog: str) -> None:
    """Run a typer app as a console script: usage errors and bad input become one line on stderr
    (``<command>: error: <what>``) and exit code 2, never a box or a traceback."""
    from kallot.core.errors import KallotError

    try:
        code = app(prog_name=prog, standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as exc:
        exc.show()
        code = exc.exit_code
    except click.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx is not None else prog
        message = " ".join(exc.format_message().split())
        _say(f"{where}: error: {message} (see {where} --help)", highlight=False)
        code = exc.exit_code
    except click.ClickException as exc:
        _say(f"{prog}: error: {exc.format_message()}")
        code = exc.exit_code
    except click.exceptions.Abort:
        code = 130
    except KallotError as exc:  # bad input a command did not catch itself
        _say(f"{prog}: error: {' '.join(str(exc).split())}")
        code = 2
    sys.exit(code if isinstance(code, int) else 0)


def print_version(value: bool) -> None:
    """``--version`` (an eager option's callback): print ``kallot <version>`` and exit."""
    if value:
        import typer

        from kallot import __version__

        typer.echo(f"kallot {__version__}")
        raise typer.Exit()
