"""``kubectl kallot ...``: the kubectl plugin (kubectl runs ``kubectl-kallot`` from the PATH).

Same commands as ``kallot explain`` (one function, registered on a small app of its own), so
``kubectl kallot explain POD -n NS`` and ``kallot explain POD -n NS`` print the same thing.
kubectl does not pass its flags to plugins; the plugin reads $KUBECONFIG like kubectl does.
"""

from __future__ import annotations

from typing import Annotated

import typer

from kallot.cli import ui
from kallot.cli.scheduler import explain_cmd

app = typer.Typer(
    name="kubectl kallot",
    help="kallot, the GPU scheduler, from kubectl.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.command("explain")(explain_cmd)


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=ui.print_version,
            is_eager=True,
            help="Print the version and exit.",
        ),
    ] = False,
) -> None:
    """kallot, the GPU scheduler, from kubectl."""


@app.command("version")
def version() -> None:
    """Print kallot's version."""
    from kallot import __version__

    typer.echo(f"kallot {__version__}")


def main() -> None:
    ui.run_app(app, "kubectl kallot")
