"""``kallot``: the command line. Each command group lives in its own module and registers itself
on the app here, in one explicit list (no import-time side effects elsewhere).

``kallot scheduler`` builds an app with its own command alone: the scheduler's first bind waits
for the process's imports, and the other commands' modules (the node agent's gRPC and NVML
stack, the simulators) would add a good part of a second of CPU to them.
"""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from kallot.cli import ui


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


def build(only: str | None = None) -> typer.Typer:
    """The ``kallot`` app with every command, or with ``only`` (``"scheduler"``) alone."""
    app = typer.Typer(
        name="kallot",
        help="GPU scheduling and allocation for Kubernetes.",
        no_args_is_help=True,
        pretty_exceptions_enable=False,
    )
    app.callback()(_root)
    if only == "scheduler":
        from kallot.cli import scheduler

        scheduler.register(app)
        return app
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
    )

    sim_app = typer.Typer(
        help="Trace-driven simulations on the scheduling core.", no_args_is_help=True
    )
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
    return app


def __getattr__(name: str) -> Any:
    """``kallot.cli.main.app``: the full app, built on first use."""
    if name == "app":
        full = build()
        globals()["app"] = full
        return full
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _without_sync_kubernetes() -> None:
    """Let ``kubernetes.aio`` load without running ``kubernetes/__init__.py``.

    Importing ``kubernetes.aio.client`` first imports its parent package, whose ``__init__``
    loads the synchronous client, its kubeconfig loaders, ``requests``, ``oauthlib`` and
    ``websocket``, none of which the scheduler uses (it talks to the API through
    ``kubernetes.aio``'s ``ApiClient`` and config loader only, in ``kube/client.py``); that
    is about a third of the ``kubernetes`` import's CPU on the scheduler's start-up path. The
    packages are registered as plain namespaces over the installed directories, so every
    submodule still imports from the installed library as usual. Only for the ``kallot
    scheduler`` process, which imports nothing else of ``kubernetes``."""
    import importlib.machinery
    import importlib.util

    for name in ("kubernetes", "kubernetes.aio"):
        if name in sys.modules:
            return
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            return  # not installed as a package directory: import it the usual way
        package = importlib.util.module_from_spec(
            importlib.machinery.ModuleSpec(name, None, is_package=True)
        )
        package.__path__ = list(spec.submodule_search_locations)
        sys.modules[name] = package


def main() -> None:
    """The ``kallot`` console script: one-line errors (cli.ui.run_app)."""
    only = "scheduler" if sys.argv[1:2] == ["scheduler"] else None
    if only == "scheduler":
        _without_sync_kubernetes()
    ui.run_app(build(only), "kallot")


if __name__ == "__main__":
    main()
