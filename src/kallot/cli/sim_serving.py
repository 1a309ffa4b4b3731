"""``kallot sim serving``: LLM services replayed from the Azure LLM inference trace 2023 with
scale-to-zero autoscaling, placed cache-blind, cache-aware and cache-aware with pre-warm, with a
progress bar, a table, a PNG and optionally the numbers as JSON (sim.serving).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from kallot.cli import ui
from kallot.core.errors import KallotError
from kallot.core.models import GB, LoadModel
from kallot.sim import serving


def register(app: typer.Typer) -> None:
    """Add ``serving`` to the ``sim`` group."""
    app.command("serving")(run)


def run(
    *,
    seed: Annotated[
        int, typer.Option(min=0, help="Seed of the services, the cluster and sessions.")
    ] = 0,
    startup_s: Annotated[
        float, typer.Option(min=0, help="Load-time model: fixed start-up seconds per replica.")
    ] = LoadModel().startup_s,
    remote_gbps: Annotated[
        float,
        typer.Option(min=0.001, help="Load-time model: remote (object storage) GB/s per node."),
    ] = LoadModel().remote_bytes_per_s / GB,
    keep_threshold: Annotated[
        float,
        typer.Option(
            min=0,
            help="Pre-warm keeps a service's last replica when predicted requests/s x cold-start "
            "seconds >= this x its GPUs.",
        ),
    ] = serving.KEEP_WARM_THRESHOLD,
    keep_budget: Annotated[
        float,
        typer.Option(
            min=0,
            help="Pre-warm keeps replicas for at most this fraction of the GPU-seconds the "
            "autoscaler asked for so far.",
        ),
    ] = serving.KEEP_WARM_BUDGET,
    json_file: Annotated[
        Path | None, typer.Option("--json", help="Write the summary as JSON to this file.")
    ] = None,
    png: Annotated[Path, typer.Option("--plot", help="Write the PNG here.")] = Path(
        "kallot-serving.png"
    ),
) -> None:
    """Cold starts, time to first token and GPU-hours of scale-to-zero LLM serving, by placement."""
    console = ui.console()
    ui.check_output(json_file, "--json")
    ui.check_output(png, "--plot")
    load = LoadModel(startup_s=startup_s, remote_bytes_per_s=remote_gbps * GB)
    try:
        services = serving.workload(seed)
        span = max(float(s.t[-1]) for s in services if s.t.size)
        with ui.progress(console) as bar:
            ids = {p: bar.add_task(p, total=round(span)) for p in serving.POLICIES}
            cmp = serving.compare(
                seed,
                load=load,
                keep_threshold=keep_threshold,
                keep_budget=keep_budget,
                progress=lambda name, dt: bar.update(ids[name], advance=round(dt)),
            )
    except KallotError as exc:
        ui.error(exc)
        raise typer.Exit(2) from None
    summary = cmp.summary()
    console.print(_table(cmp))
    ratio = summary["prewarm_vs_blind"]
    assert isinstance(ratio, dict)
    console.print(
        f"cache-aware + pre-warm vs cache-blind: p99 time to first token x{ratio['ttft_p99']:.3f}, "
        f"GPU-hours x{ratio['gpu_hours']:.3f}"
    )
    console.print(
        f"load-time model: {load.startup_s:g} s start-up + size / bandwidth (host memory "
        f"{load.memory_bytes_per_s / GB:g} GB/s, node disk as measured, remote "
        f"{load.remote_bytes_per_s / GB:g} GB/s)"
    )
    from kallot.sim.serving_plot import plot  # matplotlib: only the drawing commands

    plot(cmp, png)
    console.print(f"plot: {png}")
    if json_file is not None:
        json_file.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
        console.print(f"json: {json_file}")


def _table(cmp: serving.Comparison) -> Table:
    n = sum(s.t.size for s in cmp.services)
    table = Table(
        title=f"kallot sim serving: {len(cmp.services)} services, {n} requests, seed {cmp.seed}"
    )
    for col in (
        "policy",
        "cold starts",
        "starts from memory / disk",
        "TTFT p50 s",
        "TTFT p99 s",
        "GPU-hours",
        "pre-warm copies",
        "kept warm GPU-h",
    ):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for name in serving.POLICIES:
        r = cmp.results[name]
        table.add_row(
            name,
            str(r.cold_starts),
            f"{r.starts['memory']} / {r.starts['disk']}",
            f"{r.ttft_p(50):.2f}",
            f"{r.ttft_p(99):.1f}",
            f"{r.gpu_hours:.2f}",
            str(r.prewarm_copies),
            f"{r.kept_gpu_seconds / 3600:.2f}",
        )
    return table
