"""``kallot sim autoscale``: kallot's scale-up planner and consolidation against an
integer-counting autoscaler on the Azure LLM arrivals and the openb pods (sim.autoscale), with a
progress bar, a table, a PNG and optionally the numbers as JSON.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from kallot.cli import ui
from kallot.core.errors import KallotError
from kallot.sim import autoscale


def register(app: typer.Typer) -> None:
    """Add ``autoscale`` to the ``sim`` group."""
    app.command("autoscale")(run)


def run(
    *,
    seed: Annotated[int, typer.Option(min=0, help="Seed of the workload and the sessions.")] = 0,
    pods: Annotated[int, typer.Option(min=1, help="Pods over the trace's hour (about).")] = 600,
    mix: Annotated[
        str, typer.Option(help="openb: every openb GPU pod; shares: only part-GPU pods.")
    ] = "openb",
    json_file: Annotated[
        Path | None, typer.Option("--json", help="Write the summary as JSON to this file.")
    ] = None,
    png: Annotated[Path, typer.Option("--plot", help="Write the PNG here.")] = Path(
        "kallot-autoscale.png"
    ),
) -> None:
    """Nodes, GPU-hours, waits and evictions of three autoscaling policies."""
    from kallot.sim import autoscale_plot

    console = ui.console()
    if mix not in autoscale.MIXES:
        ui.error(f"--mix: got {mix!r}, expected one of {', '.join(autoscale.MIXES)}")
        raise typer.Exit(2)
    try:
        ui.check_output(json_file, "--json")
        ui.check_output(png, "--plot")
        with ui.progress(console) as bar:
            task = bar.add_task("policies", total=len(autoscale.POLICIES))
            results = autoscale.compare(
                seed,
                pods,
                mix,
                progress=lambda name: bar.update(task, advance=1, description=f"ran: {name}"),
            )
    except KallotError as exc:
        ui.error(exc)
        raise typer.Exit(2) from None
    summary = autoscale.summary(results, seed=seed, mix=mix)
    console.print(_table(results))
    ratio = summary["gpu_hours_vs_integer"]
    assert isinstance(ratio, float)
    console.print(f"kallot+consolidate uses {ratio:.3f} of the integer autoscaler's GPU-hours")
    autoscale_plot.plot(results, png)
    console.print(f"plot: {png}")
    if json_file is not None:
        json_file.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
        console.print(f"json: {json_file}")


def _table(results: dict[str, autoscale.Result]) -> Table:
    t = Table(title="kallot sim autoscale")
    for col in (
        "policy",
        "pods bound",
        "nodes requested",
        "vs packing optimum",
        "peak nodes",
        "GPU-hours",
        "wait p50 s",
        "wait p95 s",
        "evictions/h",
        "protected evictions",
    ):
        t.add_column(col, justify="left" if col == "policy" else "right")
    for name in autoscale.POLICIES:
        r = results[name]
        t.add_row(
            name,
            f"{r.bound}/{r.pods}",
            str(r.nodes_requested),
            f"{r.nodes_vs_optimum:.3f}",
            str(r.peak_nodes),
            f"{r.gpu_hours:.1f}",
            f"{r.wait_pct(50):.0f}",
            f"{r.wait_pct(95):.0f}",
            f"{r.evictions_per_hour:.1f}",
            str(r.protected_evictions),
        )
    return t
