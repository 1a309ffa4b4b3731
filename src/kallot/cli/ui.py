"""Terminal output shared by the CLI commands: the console they print tables on and the progress
bar long runs show. One rule for every command, so tables look the same everywhere. Also the
checks every command makes the same way before long work: output paths are writable; and the
choices of a policy option, listed in ``--help``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from kallot.core.errors import ConfigError
from kallot.core.policies import POLICY_NAMES

#: ``--policy`` of the simulations: the choices appear in ``--help`` and a wrong one is refused.
SIM_POLICY = click.Choice(POLICY_NAMES)

# Wide enough for the comparison tables when output goes to a file or a pipe (rich would use 80
# columns and abbreviate headers); a terminal keeps its own width.
PIPE_WIDTH = 140


def console(*, stderr: bool = False) -> Console:
    """A console for tables (stdout) or progress and errors (``stderr``)."""
    if stderr:
        return Console(stderr=True, soft_wrap=True)  # an error stays one line however long
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
        # Twice a second: the bar's refresh thread takes the interpreter from the run it
        # shows (at rich's default of 10 a second, about 5% of a 1.5 s openb experiment).
        refresh_per_second=2,
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
    """``error: <message>`` on stderr, on one line (no wrapping, no markup in the message)."""
    console(stderr=True).print(Text.assemble(("error:", "red"), " ", str(message)))


def run_app(app: Any, prog: str) -> None:
    """Run a typer app as a console script: usage errors and bad input become one line on stderr
    (``<command>: error: <what>``) and exit code 2, never a box or a traceback."""
    import click

    from kallot.core.errors import KallotError

    try:
        code = app(prog_name=prog, standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as exc:
        exc.show()
        code = exc.exit_code
    except click.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx is not None else prog
        message = " ".join(exc.format_message().split())
        console(stderr=True).print(
            Text(f"{where}: error: {message} (see {where} --help)"), highlight=False
        )
        code = exc.exit_code
    except click.ClickException as exc:
        console(stderr=True).print(Text(f"{prog}: error: {exc.format_message()}"))
        code = exc.exit_code
    except click.exceptions.Abort:
        code = 130
    except KallotError as exc:  # bad input a command did not catch itself
        console(stderr=True).print(Text(f"{prog}: error: {' '.join(str(exc).split())}"))
        code = 2
    sys.exit(code if isinstance(code, int) else 0)


def print_version(value: bool) -> None:
    """``--version`` (an eager option's callback): print ``kallot <version>`` and exit."""
    if value:
        import typer

        from kallot import __version__

        typer.echo(f"kallot {__version__}")
        raise typer.Exit()
