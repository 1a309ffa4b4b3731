"""``kallot``: the command line. Each command group lives in its own module and registers itself
on the app here, in one explicit list (no import-time side effects elsewhere).
"""

from __future__ import annotations

import typer

from kallot.cli import (
    agent,
    report_waste,
    scheduler,
    sim_fleet,
    sim_openb,
    sim_rightsize,
    sim_tenants,
    sim_training,
)

app = typer.Typer(
    name="kallot",
    help="GPU scheduling and allocation for Kubernetes.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
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
scheduler.register(app)
agent.register(app)


if __name__ == "__main__":
    app()
