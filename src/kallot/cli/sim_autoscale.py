"""``kallot sim autoscale``: kallot's scale-up planner and consolidation against an
integer-counting autoscaler on the Azure LLM arrivals and the openb pods (sim.autoscale), with a
progress bar, a table, a PNG, a report and optionally the numbers as JSON.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kallot.cli import sim, ui
from kallot.core.errors import ConfigError
from kallot.sim import autoscale

REPORT = sim.default_report("autoscale")  # --report's default


def register(app: typer.Typer) -> None:
    """Add ``autoscale`` to the ``sim`` group."""
    app.command("autoscale")(run)


def run(
    *,
    seed: sim.Seed = 0,
    pods: Annotated[int, typer.Option(min=1, help="Pods over the trace's hour (about).")] = 600,
    mix: Annotated[
        str, typer.Option(help="openb: every openb GPU pod; shares: only part-GPU pods.")
    ] = "openb",
    json_file: sim.Json = None,
    png: sim.Plot = None,
    html_file: Annotated[Path, sim.report_option("autoscale")] = REPORT,
    config: Annotated[Path | None, sim.config_option("the shipped kallot (every policy)")] = None,
) -> None:
    """Nodes, GPU-hours, waits and evictions of three autoscaling policies."""
    console = ui.console()

    def go() -> None:
        doc = sim.load_config(config) if config is not None else None
        if mix not in autoscale.MIXES:
            raise ConfigError("--mix", mix, f"one of {', '.join(autoscale.MIXES)}")
        sim.check_outputs(json_out=json_file, plot=png, report=html_file)
        with ui.progress(console) as bar:
            task = bar.add_task("policies", total=len(autoscale.POLICIES))
            results = autoscale.compare(
                seed,
                pods,
                mix,
                progress=lambda name: bar.update(task, advance=1, description=f"ran: {name}"),
                config=doc,
            )
        summary = autoscale.summary(results, seed=seed, mix=mix)
        title, header, rows = _table(results, seed, mix)
        ui.print_table(console, title, header, rows, legend=LEGEND)
        ratio = summary["gpu_hours_vs_integer"]
        assert isinstance(ratio, float)
        console.print(f"kallot+consolidate uses {ratio:.3f} of the integer autoscaler's GPU-hours")
        from kallot.sim import autoscale_plot  # matplotlib: only the commands that draw

        sim.write_plot(png, lambda: autoscale_plot.figure(results))
        sim.write_json(json_file, summary, sort_keys=True)
        sim.write_report(
            html_file, title, [(title, header, rows)], [autoscale_plot.figure(results)], NOTES
        )

    sim.guarded(go)


NOTES = (
    "Nodes requested vs optimum: per scale-up, the packing LP's fewest GPUs for the planned "
    "pods over 8 GPUs a node, rounded up (docs/autoscaling.md).",
    "integer: an autoscaler counting nvidia.com/gpu, one whole GPU per GPU a pod names, with "
    "the same planner; protected evictions: evictions of do-not-disrupt or min-runtime pods.",
)
LEGEND = {
    "bound": "pods bound / pods",
    "nodes": "nodes requested",
    "vs opt": "nodes requested / packing optimum",
    "peak": "peak nodes",
    "GPU-h": "GPU-hours",
    "p50 s": "wait pending -> bound, median (s)",
    "p95 s": "wait pending -> bound, 95th percentile (s)",
    "ev/h": "evictions per hour",
    "prot": "protected evictions",
}


def _table(
    results: dict[str, autoscale.Result], seed: int, mix: str
) -> tuple[str, list[str], list[list[str]]]:
    """Title, header and rows of the terminal table."""
    title = f"kallot sim autoscale: mix {mix}, seed {seed}"
    rows = []
    for name in autoscale.POLICIES:
        r = results[name]
        rows.append(
            [
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
            ]
        )
    return title, ["policy", *LEGEND], rows
