"""``kallot``: the command line. Each command group lives in its own module and registers itself
on the app through the explicit tables here (no import-time side effects elsewhere).

Each command's module is imported only when that command runs (``_LazyGroup``): the
scheduler's first bind waits for the process's imports, and ``kallot --help`` should not pay
for numpy, the core and the Kubernetes client (the other commands' modules, the node agent's
gRPC and NVML stack, the simulators, would add a good part of a second of CPU).
"""

from __future__ import annotations

import importlib
import sys
from typing import Annotated, Any, ClassVar

import click
import typer
import typer.main
from typer.core import TyperGroup

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


# Every command, by group, loaded when it runs (or its own --help is asked for): `kallot
# --help` and `kallot sim --help` list them from here without importing their modules (which
# bring numpy, the core, the Kubernetes client: about a second of CPU). name -> (the module
# whose ``register`` adds it, the short help its docstring's first sentence gives:
# tests/cli/test_startup_imports.py checks they agree).
ROOT_COMMANDS: dict[str, tuple[str, str]] = {
    "scheduler": (
        "kallot.cli.scheduler",
        "Run the live scheduler: binds pods with spec.schedulerName=kallot.",
    ),
    "explain": ("kallot.cli.scheduler", "Why is POD pending, or which GPUs did it get."),
    "doctor": (
        "kallot.cli.doctor",
        "Preflight: CRDs, RBAC, scheduler, agents, other device plugins, MPS daemon, versions.",
    ),
    "agent": ("kallot.cli.agent", "The node agent: NVML discovery, device plugin, GPU metrics."),
    "rightsize": (
        "kallot.cli.report_waste",
        "A recommended GPU request per workload from its observed use.",
    ),
}
SIM_COMMANDS: dict[str, tuple[str, str]] = {
    "openb": (
        "kallot.cli.sim_openb",
        "The FGD paper's experiment (shuffle, inflate to 130%, place one by one) for one policy.",
    ),
    "compare": ("kallot.cli.sim_openb", "Policies x workloads x seeds in parallel processes."),
    "replay": ("kallot.cli.sim_openb", "Replay creation and deletion times with a pending queue."),
    "fleet": (
        "kallot.cli.sim_fleet",
        "How many GPUs an LLM-serving fleet needs under each GPU-sharing strategy.",
    ),
    "training": (
        "kallot.cli.sim_training",
        "Compare topology-aware kallot with a topology-blind policy on generated training jobs.",
    ),
    "tenants": (
        "kallot.cli.sim_tenants",
        "Compare kallot's queues with FIFO + static quotas on a multi-tenant openb workload.",
    ),
    "rightsize": (
        "kallot.cli.sim_rightsize",
        "GPUs a serving fleet needs as requested and right-sized, and what right-sizing risks.",
    ),
    "serving": (
        "kallot.cli.sim_serving",
        "Cold starts, time to first token and GPU-hours of scale-to-zero LLM serving, by placement.",
    ),
    "autoscale": (
        "kallot.cli.sim_autoscale",
        "Nodes, GPU-hours, waits and evictions of three autoscaling policies.",
    ),
}
REPORT_COMMANDS: dict[str, tuple[str, str]] = {
    "waste": (
        "kallot.cli.report_waste",
        "GPU-hours allocated vs used per cluster, GPU model, namespace and workload.",
    ),
}


def _load(module: str) -> dict[str, click.Command]:
    """The commands ``module``'s ``register`` adds, as click commands."""
    mod = importlib.import_module(module)
    app, report_app = typer.Typer(), typer.Typer()
    if module == "kallot.cli.report_waste":
        mod.register(app, report_app)  # report waste, and the top-level rightsize
    else:
        mod.register(app)
    out: dict[str, click.Command] = {}
    for t in (app, report_app):
        if t.registered_commands or t.registered_groups:
            out.update(typer.main.get_group(t).commands)
    return out


class _LazyGroup(TyperGroup):
    """A command group whose commands are imported when one runs. ``LAZY``: name ->
    (module, short help), listed in ``--help`` without importing anything. Code that reads
    the ``commands`` mapping itself (a test walking the tree) gets every command, loaded."""

    LAZY: ClassVar[dict[str, tuple[str, str]]] = {}
    _loaded: dict[str, click.Command]

    @property  # type: ignore[override]
    def commands(self) -> dict[str, click.Command]:
        for name in self.LAZY:
            self._load(name)
        return self._loaded

    @commands.setter
    def commands(self, value: dict[str, click.Command]) -> None:
        self._loaded = dict(value)  # click's __init__

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        self._loaded[name or cmd.name or ""] = cmd  # without loading the lazy ones

    def _load(self, cmd_name: str) -> None:
        if cmd_name in self._loaded or cmd_name not in self.LAZY:
            return
        for name, cmd in _load(self.LAZY[cmd_name][0]).items():
            if name in self.LAZY and name not in self._loaded:
                self._loaded[name] = cmd

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*self._loaded, *(n for n in self.LAZY if n not in self._loaded)]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self._loaded and cmd_name in self.LAZY:
            if getattr(ctx, "_kallot_listing", False):  # --help of the group: the short help
                short = self.LAZY[cmd_name][1]
                return click.Command(cmd_name, help=short, short_help=short)
            self._load(cmd_name)
        return self._loaded.get(cmd_name)

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        ctx._kallot_listing = True  # type: ignore[attr-defined]
        try:
            super().format_help(ctx, formatter)
        finally:
            ctx._kallot_listing = False  # type: ignore[attr-defined]


class _Root(_LazyGroup):
    LAZY = ROOT_COMMANDS


class _Sim(_LazyGroup):
    LAZY = SIM_COMMANDS


class _Report(_LazyGroup):
    LAZY = REPORT_COMMANDS


def build(only: str | None = None) -> typer.Typer:
    """The ``kallot`` app; its commands are imported when one runs (``only`` is kept for
    callers that name the one command they run: it changes nothing now)."""
    del only
    app = typer.Typer(
        name="kallot",
        help="GPU scheduling and allocation for Kubernetes.",
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        cls=_Root,
    )
    app.callback()(_root)
    sim_app = typer.Typer(
        help="Trace-driven simulations on the scheduling core.", no_args_is_help=True, cls=_Sim
    )
    app.add_typer(sim_app, name="sim")
    report_app = typer.Typer(
        help="Reports from a fleet's Prometheus.", no_args_is_help=True, cls=_Report
    )
    app.add_typer(report_app, name="report")
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
    ``kubernetes.aio``'s ``ApiClient`` and config loader only, in ``kube/api/client.py``); that
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
