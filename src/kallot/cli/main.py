"""``kallot``: the command line. Each command group lives in its own module and registers itself
on the app here, in one explicit list (no import-time side effects elsewhere).
"""

from __future__ import annotations

from typing import Annotated

import typer

from kallot.cli import (
    agent,
    doctor,
    report_waste,
    scheduler,
    sim_fleet,
    sim_openb,
    sim_rightsize,
    sim_serving,
    sim_tenants,
    sim_training,
    ui,
)

app = typer.Typer(
    name="kallot",
    help="GPU scheduling and allocation for Kubernetes.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


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
    """GPU scheduling and allocation for Kubernetes."""


sim_app = typer.Typer(help="Trace-driven simulations on the scheduling core.", no_args_is_help=True)
app.add_typer(sim_app, name="sim")
report_app = typer.Typer(help="Reports from a fleet's Prometheus.", no_args_is_help=True)
app.add_typer(report_app, name="report")

sim_openb.register(sim_app)
sim_fleet.register(sim_app)
sim_training.register(sim_app)
sim_tenants.register(sim_app)
sim_rightsize.register(sim_app)
report_waste.register(app, report_app)
sim_serving.register(sim_app)
scheduler.register(app)
agent.register(app)
doctor.register(app)


def main() -> None:
    """The ``kallot`` console script: one-line errors (cli.ui.run_app)."""
    ui.run_app(app, "kallot")


if __name__ == "__main__":
    main()
