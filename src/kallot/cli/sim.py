"""The ``kallot sim`` convention: what every simulation command shares, in one place.

Where it sits: the ``cli`` layer, between ``cli.ui`` (consoles, progress) and the ``sim_*``
command modules; a new ``kallot sim X`` builds its options and outputs from here and
``tests/cli/test_flags.py`` walks every ``kallot sim`` command to hold it to this:

- **seeds**: ``--seed N`` (one seed >= 0) on every command; a command that averages over
  seeds (``openb``, ``compare``) also takes ``--seeds`` ('42', '42,43' or '42..51'), of which
  ``--seed N`` is the one-seed form.
- **policy**: ``--policy`` (a ``ui.SIM_POLICY`` choice) defaults to ``kallot``.
- **config**: ``--config FILE`` on every command: a ``KallotSchedulerConfiguration`` (the file
  ``kallot scheduler --config`` reads) the simulated scheduler is built from instead of a
  shipped preset, through the one composition ``config.presets.framework``; labelled with the
  file's stem. It replaces ``--policy`` (``policy_or_config``); where a command compares
  several policies (``compare``, ``replay``) each ``--config`` is one more (``configs``).
  The file is checked whole before any work (``load_config``).
- **jobs**: ``--jobs N`` (worker processes, 0: one per core) on the commands that run
  independent experiments (``openb``, ``compare``).
- **outputs**: ``--json FILE`` (the numbers, ``.json``), ``--plot FILE`` (the main figure,
  ``.png``/``.svg``/``.pdf``) and ``--report FILE`` (a self-contained ``.html``, written by
  default to ``kallot-report/<command>.html`` with its PNGs next to it). ``check_outputs``
  checks all of them together before any work starts: a folder that does not exist (other
  than ``kallot-report/``, which is created), a wrong extension, a directory, a read-only
  place, two outputs on one path.
- **errors**: bad input is one line ``kallot sim X: error: <flag or file>: got ..., expected
  ...`` on stderr and exit code 2 (``guarded``), never a traceback.
- **tables**: ``ui.print_table`` fits every table in the terminal (80 columns included):
  transposed or wrapped, never cut; short headers get a ``legend``.

A new command: a module ``cli/sim_<name>.py`` with ``register(app)`` adding ``<name>``, built
from the option types here (``Seed``, ``Policy``, ``Json``, ``Plot``, ``report_option``,
``Jobs``), its body inside ``guarded`` and starting with ``check_outputs``, its outputs written
with ``write_json``, ``write_plot`` and ``write_report``; and a row in ``SIM_COMMANDS`` in
``cli/main.py`` (name -> module, the docstring's first sentence), which is how ``kallot sim``
finds it without importing it. ``cli/sim_fleet.py`` is the shortest example.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import click
import typer
from click.core import ParameterSource

from kallot.cli import ui
from kallot.core.errors import ConfigError, KallotError

if TYPE_CHECKING:
    from kallot.config.scheduler import SchedulerConfiguration

#: Where reports go unless ``--report`` says otherwise (created when missing).
REPORT_DIR = Path("kallot-report")

#: What each output flag may end with.
EXTENSIONS: Mapping[str, tuple[str, ...]] = {
    "--json": (".json",),
    "--plot": (".png", ".svg", ".pdf"),
    "--report": (".html", ".htm"),
}

#: PNGs a report may write next to its HTML (``<stem>-<i>.png``, sim.report.write).
REPORT_IMAGES = 4


def default_report(command: str) -> Path:
    """``kallot-report/<command>.html``: every command's default ``--report``."""
    return REPORT_DIR / f"{command}.html"


Seed = Annotated[int, typer.Option(min=0, help="Seed (>= 0) of everything random in the run.")]
Policy = Annotated[
    str, typer.Option(click_type=ui.SIM_POLICY, help="Placement policy (core profile).")
]
Json = Annotated[
    Path | None, typer.Option("--json", help="Write the numbers as JSON to this .json file.")
]
Plot = Annotated[
    Path | None,
    typer.Option("--plot", help="Write the main figure to this .png, .svg or .pdf file."),
]


def report_option(command: str) -> Any:
    """The ``--report`` option, defaulting to ``kallot-report/<command>.html``."""
    return typer.Option(
        "--report",
        help=f"HTML report (table + plots, PNGs next to it); default {default_report(command)}.",
    )


Jobs = Annotated[int, typer.Option(min=0, help="Worker processes (0: one per CPU core).")]

_CONFIG_HELP = (
    "KallotSchedulerConfiguration file (as for kallot scheduler --config, "
    "docs/scheduler-config.md) the simulated scheduler is built from"
)
Config = Annotated[
    Path | None, typer.Option("--config", help=f"{_CONFIG_HELP}, instead of --policy's.")
]


def config_option(instead: str) -> Any:
    """``--config`` of a command without ``--policy``: the file replaces ``instead``."""
    return typer.Option("--config", help=f"{_CONFIG_HELP}, instead of {instead}.")


Configs = Annotated[
    list[Path] | None,
    typer.Option("--config", help=f"{_CONFIG_HELP}; repeat: each one more policy (its stem)."),
]


def load_config(path: Path) -> SchedulerConfiguration:
    """The ``--config`` document, checked whole (plugins, their args) before any work: a bad
    file is the one-line error naming the field, the value and what was expected."""
    from kallot.config import presets  # the core: imported by the commands that run it
    from kallot.config import scheduler as sc

    doc = sc.load(path)
    presets.framework(doc, name=path.stem, where=path.name)
    return doc


def policy_or_config(policy: str, config: Path | None) -> tuple[str, SchedulerConfiguration | None]:
    """The label and document a single-policy command runs: ``--config FILE`` (its stem) or
    the shipped file of ``--policy`` (None: the simulator reads it). Not both."""
    if config is None:
        return policy, None
    ctx = click.get_current_context(silent=True)
    if ctx is not None and ctx.get_parameter_source("policy") is ParameterSource.COMMANDLINE:
        raise ConfigError(
            "--policy", policy, "no --policy with --config (the file names the plugins)"
        )
    return config.stem, load_config(config)


def configs(files: Sequence[Path] | None) -> dict[str, SchedulerConfiguration]:
    """label (the file's stem) -> document of each ``--config`` of a comparing command."""
    return {f.stem: load_config(f) for f in files or ()}


def _check_one(path: Path, flag: str) -> None:
    suffixes = EXTENSIONS[flag]
    if path.is_dir():
        raise ConfigError(flag, str(path), "a file path, not a directory")
    if path.suffix.lower() not in suffixes:
        raise ConfigError(flag, str(path), f"a file ending in {' or '.join(suffixes)}")
    parent = path.parent
    if parent.resolve() == REPORT_DIR.resolve() and not parent.exists():
        return  # the default report folder: created when the results are written
    if not parent.exists():
        raise ConfigError(
            flag, str(path), f"a path in an existing folder ({parent} does not exist)"
        )
    ui.check_output(path, flag)


def check_outputs(
    *, json_out: Path | None = None, plot: Path | None = None, report: Path | None = None
) -> None:
    """Every output of a command checked together, before any work: see the module docstring.
    Raises ConfigError naming the flag."""
    # The report first: a --plot onto one of its PNGs is then named as the one that collides.
    given = (("--report", report), ("--json", json_out), ("--plot", plot))
    taken: dict[Path, str] = {}
    for flag, path in given:
        if path is None:
            continue
        _check_one(path, flag)
        claims = [path]
        if flag == "--report":
            claims += [path.with_name(f"{path.stem}-{i}.png") for i in range(1, REPORT_IMAGES + 1)]
        for claim in claims:
            key = Path(os.path.abspath(claim))
            if key in taken:
                raise ConfigError(
                    flag, str(path), f"a path no other output uses ({taken[key]} writes there)"
                )
            taken[key] = flag if claim == path else f"{flag}'s PNG"


def prepare_report(path: Path) -> None:
    """Create the default report folder when the report goes there."""
    if path.parent.resolve() == REPORT_DIR.resolve():
        path.parent.mkdir(parents=True, exist_ok=True)


def write_json(path: Path | None, doc: object, *, sort_keys: bool = False) -> None:
    """``--json``: the document, indented, and a ``json: PATH`` line."""
    if path is None:
        return
    path.write_text(json.dumps(doc, indent=2, sort_keys=sort_keys) + "\n")
    ui.console().print(f"json: {path}")


def write_report(
    path: Path,
    title: str,
    tables: Sequence[tuple[str, Sequence[str], Sequence[Sequence[str]]]],
    figures: Sequence[Any],
    notes: Sequence[str] = (),
) -> None:
    """``--report``: the HTML page with ``tables`` and ``figures`` (matplotlib Figures, closed
    here) and a ``report: PATH (+ n PNG)`` line."""
    from kallot.sim import report  # matplotlib: only the commands that draw

    prepare_report(path)
    images = [report.png_bytes(f) for f in figures]
    written = report.write(path, report.html_page(title, tables, images, notes), images)
    ui.console().print(f"report: {written[0]} (+ {len(written) - 1} PNG)")


def write_plot(path: Path | None, figure: Callable[[], Any]) -> None:
    """``--plot``: the figure ``figure()`` draws, saved by extension, and a ``plot:`` line."""
    if path is None:
        return
    import matplotlib.pyplot as plt

    fig = figure()
    fig.savefig(path, dpi=110, format=path.suffix[1:].lower())  # X.PNG too
    plt.close(fig)
    ui.console().print(f"plot: {path}")


def _finite_numbers() -> None:
    """Refuse ``nan`` and ``inf`` in any number option (click takes them, and every range
    check is false for nan): a run on them measures nothing, or never ends."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return
    for param in ctx.command.params:
        value = ctx.params.get(param.name or "")
        option = isinstance(param, click.Option)
        if option and isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(param.opts[0], str(value), "a finite number")


def guarded(fn: Callable[[], None]) -> None:
    """Bad input -> one line (``kallot sim X: error: ...``) and exit code 2, never a traceback.
    Number options are checked to be finite first."""
    try:
        _finite_numbers()
        fn()
    except KallotError as exc:
        ui.error(exc)
        raise typer.Exit(2) from None
