"""``kallot sim serving``: LLM services replayed from the Azure LLM inference trace 2023 with
scale-to-zero autoscaling, placed cache-blind, cache-aware and cache-aware with pre-warm, with a
progress bar, a table, a PNG and optionally the numbers as JSON (sim.serving).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kallot.cli import sim, ui
from kallot.core.models import GB, LoadModel
from kallot.sim import serving

REPORT = sim.default_report("serving")  # --report's default


def register(app: typer.Typer) -> None:
    """Add ``serving`` to the ``sim`` group."""
    app.command("serving")(run)


def run(
    *,
    seed: sim.Seed = 0,
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
    json_file: sim.Json = None,
    png: sim.Plot = None,
    html_file: Annotated[Path, sim.report_option("serving")] = REPORT,
    config: Annotated[Path | None, sim.config_option("the shipped kallot (both policies)")] = None,
) -> None:
    """Cold starts, time to first token and GPU-hours of scale-to-zero LLM serving, by placement."""
    console = ui.console()
    load = LoadModel(startup_s=startup_s, remote_bytes_per_s=remote_gbps * GB)

    def go() -> None:
        doc = sim.load_config(config) if config is not None else None
        sim.check_outputs(json_out=json_file, plot=png, report=html_file)
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
                config=doc,
            )
        summary = cmp.summary()
        title, header, rows = _table(cmp)
        ui.print_table(console, title, header, rows, legend=LEGEND)
        ratio = summary["prewarm_vs_blind"]
        assert isinstance(ratio, dict)
        console.print(
            "cache-aware + pre-warm vs cache-blind: p99 time to first token "
            f"x{ratio['ttft_p99']:.3f}, GPU-hours x{ratio['gpu_hours']:.3f}"
        )
        model = (
            f"load-time model: {load.startup_s:g} s start-up + size / bandwidth (host memory "
            f"{load.memory_bytes_per_s / GB:g} GB/s, node disk as measured, remote "
            f"{load.remote_bytes_per_s / GB:g} GB/s)"
        )
        console.print(model)
        from kallot.sim import serving_plot  # matplotlib: only the drawing commands

        sim.write_plot(png, lambda: serving_plot.figure(cmp))
        sim.write_json(json_file, summary, sort_keys=True)
        header_long = [LEGEND.get(h, h) for h in header]
        sim.write_report(
            html_file, title, [("policies", header_long, rows)], [serving_plot.figure(cmp)], [model]
        )

    sim.guarded(go)


# The terminal table's short headers and what they stand for (printed under the table).
LEGEND = {
    "cold": "cold starts",
    "mem/disk": "starts from host memory / node disk",
    "TTFT p50": "time to first token p50, s",
    "TTFT p99": "time to first token p99, s",
    "GPU-h": "GPU-hours",
    "copies": "pre-warm copies",
    "warm GPU-h": "GPU-hours kept warm",
}


def _table(cmp: serving.Comparison) -> tuple[str, list[str], list[list[str]]]:
    """Title, header and rows of the table."""
    n = sum(s.t.size for s in cmp.services)
    title = f"kallot sim serving: {len(cmp.services)} services, {n} requests, seed {cmp.seed}"
    rows = []
    for name in serving.POLICIES:
        r = cmp.results[name]
        rows.append(
            [
                name,
                str(r.cold_starts),
                f"{r.starts['memory']} / {r.starts['disk']}",
                f"{r.ttft_p(50):.2f}",
                f"{r.ttft_p(99):.1f}",
                f"{r.gpu_hours:.2f}",
                str(r.prewarm_copies),
                f"{r.kept_gpu_seconds / 3600:.2f}",
            ]
        )
    return title, ["policy", *LEGEND], rows
