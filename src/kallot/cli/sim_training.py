"""``kallot sim training``: distributed-training gangs on a multi-rack cluster, topology-aware
kallot against a topology-blind policy (sim.training), with a progress bar, a table, a PNG and
optionally the numbers as JSON (``--json FILE``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import click
import typer

from kallot.cli import sim, ui
from kallot.core.errors import ConfigError
from kallot.core.workload import TopologyMode
from kallot.sim import training

REPORT = sim.default_report("training")  # --report's default


def register(app: typer.Typer) -> None:
    """Add ``training`` to the ``sim`` group."""
    app.command("training")(run)


def run(
    *,
    jobs: Annotated[
        int, typer.Option("--training-jobs", min=1, help="Training jobs to generate.")
    ] = 300,
    seed: sim.Seed = 0,
    racks: Annotated[
        int, typer.Option(min=1, help="Racks (kinds cycle: HGX, HGX, PCIe, HGX, HGX, NVL pairs).")
    ] = 6,
    nodes_per_rack: Annotated[int, typer.Option(min=1, help="Nodes per rack.")] = 8,
    racks_per_block: Annotated[int, typer.Option(min=1, help="Racks per block (spine).")] = 3,
    load: Annotated[
        float, typer.Option(min=0.01, max=10.0, help="Offered load (GPU-time / capacity).")
    ] = 0.9,
    locality: Annotated[
        float,
        typer.Option(
            min=0.0, max=1.0, help="Weight of topology against fragmentation in kallot's score."
        ),
    ] = 0.5,
    overlap: Annotated[
        float,
        typer.Option(
            min=0.0,
            max=1.0,
            help="Share of a step's compute the all-reduce hides behind (0 = none, 1 = all).",
        ),
    ] = 0.0,
    gang: Annotated[
        str,
        typer.Option(
            click_type=click.Choice(["preferred", "required", "none"]),
            help="How hard each gang's one-rack constraint is for kallot: preferred, required "
            "(wait for a rack) or none.",
        ),
    ] = "preferred",
    json_file: sim.Json = None,
    png: sim.Plot = None,
    html_file: Annotated[Path, sim.report_option("training")] = REPORT,
    config: Annotated[
        Path | None, sim.config_option("the shipped topology (kallot's side)")
    ] = None,
) -> None:
    """Compare topology-aware kallot with a topology-blind policy on generated training jobs."""
    console = ui.console()
    modes = {"preferred": TopologyMode.PREFERRED, "required": TopologyMode.REQUIRED}
    modes["none"] = TopologyMode.NONE

    def go() -> None:
        doc = sim.load_config(config) if config is not None else None
        sim.check_outputs(json_out=json_file, plot=png, report=html_file)
        if gang not in modes:
            raise ConfigError("--gang", gang, "one of preferred, required, none")
        spec = training.ClusterSpec(
            racks=racks, nodes_per_rack=nodes_per_rack, racks_per_block=racks_per_block
        )
        with ui.progress(console) as bar:
            task = bar.add_task("jobs finished (blind, then kallot)", total=2 * jobs)
            cmp = training.compare(
                n_jobs=jobs,
                seed=seed,
                spec=spec,
                load=load,
                locality=locality,
                gang_mode=modes[gang],
                fabric=training.Fabric(overlap=overlap),
                progress=lambda n: bar.advance(task, n),
                config=doc,
            )
        summary = cmp.summary()
        title, header, rows = _table(summary)
        ui.print_table(console, title, header, rows)
        # matplotlib is imported only by commands that draw: `kallot scheduler` starts faster
        from kallot.sim import training_plot

        sim.write_plot(png, lambda: training_plot.figure(cmp))
        sim.write_json(json_file, summary, sort_keys=True)
        sim.write_report(html_file, title, [("metrics", header, rows)], [training_plot.figure(cmp)])

    sim.guarded(go)


def _table(summary: dict[str, object]) -> tuple[str, list[str], list[list[str]]]:
    """Title, header and rows of the table."""
    header = ["metric", "blind", "kallot", "kallot / blind"]
    table: list[list[str]] = []
    rows = (
        ("jobs in one NVLink island (2-8 GPUs), %", "in_one_island_pct", "{:.1f}"),
        ("multi-pod jobs in one rack, %", "in_one_rack_pct", "{:.1f}"),
        ("mean job time (run), h", "mean_job_time_s", "h"),
        ("mean completion (wait + run), h", "mean_completion_s", "h"),
        ("GPU-hours used", "gpu_hours", "{:.0f}"),
        ("GPUs idle while jobs wait, %", "stranded_gpu_pct", "{:.1f}"),
        ("time in run_session, s", "schedule_s", "{:.1f}"),
    )
    for label, key, fmt in rows:
        pair = summary[key]
        assert isinstance(pair, dict)
        b, k = float(pair["blind"]), float(pair["kallot"])
        if fmt == "h":
            cells = (f"{b / 3600:.2f}", f"{k / 3600:.2f}")
        else:
            cells = (fmt.format(b), fmt.format(k))
        table.append([label, *cells, f"{k / b:.3f}" if b else "-"])
    table.append(
        ["partial gangs after a session", "", "", str(summary["partial_gangs_after_session"])]
    )
    table.append(["makespan", "", "", f"{float(str(summary['makespan_ratio'])):.3f}"])
    return "kallot sim training: topology-blind vs kallot", header, table
