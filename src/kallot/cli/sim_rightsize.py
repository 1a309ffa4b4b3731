"""``kallot sim rightsize``: a serving fleet driven by real request arrivals (Azure LLM trace),
placed as requested (a whole GPU each) and as right-sized by ``core.rightsize`` from the first
part of the trace, then replayed on the rest: GPUs needed, memory overruns, contention; a
progress bar, a table, a PNG and optionally JSON (sim.rightsize).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kallot.cli import sim, ui
from kallot.sim import rightsize

REPORT = sim.default_report("rightsize")  # --report's default


def register(app: typer.Typer) -> None:
    """Add ``rightsize`` to the ``sim`` group."""
    app.command("rightsize")(run)


def run(
    *,
    seed: sim.Seed = 0,
    services: Annotated[int, typer.Option(min=1, help="Inference services in the fleet.")] = 60,
    policy: sim.Policy = "kallot",
    config: sim.Config = None,
    trace: Annotated[
        Path | None,
        typer.Option(help="Arrivals CSV (TIMESTAMP,ContextTokens,GeneratedTokens; .gz ok)."),
    ] = None,
    json_file: sim.Json = None,
    png: sim.Plot = None,
    html_file: Annotated[Path, sim.report_option("rightsize")] = REPORT,
) -> None:
    """GPUs a serving fleet needs as requested and right-sized, and what right-sizing risks."""
    console = ui.console()

    def go() -> None:
        label, doc = sim.policy_or_config(policy, config)
        sim.check_outputs(json_out=json_file, plot=png, report=html_file)
        arrivals = rightsize.load_arrivals(trace)
        with ui.progress(console) as bar:
            task = bar.add_task("stages", total=len(rightsize.STAGES))
            res = rightsize.run(
                services,
                seed,
                policy=label,
                config=doc,
                arrivals=arrivals,
                progress=lambda s: bar.update(task, advance=1, description=f"done: {s}"),
            )
        summary = res.summary()
        title, header, rows = _table(res)
        ui.print_table(console, title, header, rows)
        line = (
            f"right-sized needs {summary['ratio']:.3f} of the GPUs as requested; "
            f"{res.memory_overruns} memory overruns on the held-out {res.replay_s / 60:.0f} min"
        )
        console.print(line)
        from kallot.sim import rightsize_plot  # matplotlib: only the drawing commands

        sim.write_plot(png, lambda: rightsize_plot.figure(res))
        sim.write_json(json_file, summary, sort_keys=True)
        sim.write_report(
            html_file, title, [("placements", header, rows)], [rightsize_plot.figure(res)], [line]
        )

    sim.guarded(go)


def _table(res: rightsize.Result) -> tuple[str, list[str], list[list[str]]]:
    """Title, header and rows of the table."""
    title = (
        f"kallot sim rightsize: {len(res.services)} services, seed {res.seed}, trained on "
        f"{res.train_s / 60:.0f} min, replayed {res.replay_s / 60:.0f} min"
    )
    header = [
        "placement",
        "GPUs needed",
        "unplaced",
        "memory overruns (pods)",
        "overrun pod-minutes",
        "contention GPU-minutes",
    ]
    rows = []
    for name, placed, rep in (
        ("as requested", res.as_requested, res.as_requested_replay),
        ("right-sized", res.rightsized, res.rightsized_replay),
    ):
        rows.append(
            [
                name,
                str(placed.gpus_needed),
                str(placed.unplaced),
                str(rep.memory_overruns),
                f"{rep.overrun_pod_minutes:.1f}",
                f"{rep.contention_gpu_minutes:.1f}",
            ]
        )
    return title, header, rows
