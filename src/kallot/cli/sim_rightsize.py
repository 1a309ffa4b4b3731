"""``kallot sim rightsize``: a serving fleet driven by real request arrivals (Azure LLM trace),
placed as requested (a whole GPU each) and as right-sized by ``core.rightsize`` from the first
part of the trace, then replayed on the rest: GPUs needed, memory overruns, contention; a
progress bar, a table, a PNG and optionally JSON (sim.rightsize).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from kallot.cli import ui
from kallot.core.errors import KallotError
from kallot.sim import rightsize


def register(app: typer.Typer) -> None:
    """Add ``rightsize`` to the ``sim`` group."""
    app.command("rightsize")(run)


def run(
    *,
    seed: Annotated[
        int, typer.Option(min=0, help="Seed of the fleet and of the traffic split.")
    ] = 0,
    services: Annotated[int, typer.Option(min=1, help="Inference services in the fleet.")] = 60,
    policy: Annotated[
        str, typer.Option(click_type=ui.SIM_POLICY, help="Placement policy (core profile).")
    ] = "kallot",
    trace: Annotated[
        Path | None,
        typer.Option(help="Arrivals CSV (TIMESTAMP,ContextTokens,GeneratedTokens; .gz ok)."),
    ] = None,
    json_file: Annotated[
        Path | None, typer.Option("--json", help="Write the summary as JSON to this file.")
    ] = None,
    png: Annotated[Path, typer.Option("--plot", help="Write the PNG here.")] = Path(
        "kallot-rightsize.png"
    ),
) -> None:
    """GPUs a serving fleet needs as requested and right-sized, and what right-sizing risks."""
    console = ui.console()
    ui.check_output(json_file, "--json")
    ui.check_output(png, "--plot")
    try:
        arrivals = rightsize.load_arrivals(trace)
        with ui.progress(console) as bar:
            task = bar.add_task("stages", total=len(rightsize.STAGES))
            res = rightsize.run(
                services,
                seed,
                policy=policy,
                arrivals=arrivals,
                progress=lambda s: bar.update(task, advance=1, description=f"done: {s}"),
            )
    except (OSError, ValueError, KallotError) as exc:
        ui.error(exc)
        raise typer.Exit(2) from None
    summary = res.summary()
    console.print(_table(res))
    console.print(
        f"right-sized needs {summary['ratio']:.3f} of the GPUs as requested; "
        f"{res.memory_overruns} memory overruns on the held-out {res.replay_s / 60:.0f} min"
    )
    from kallot.sim.rightsize_plot import plot  # matplotlib: only the drawing commands

    plot(res, png)
    console.print(f"plot: {png}")
    if json_file is not None:
        json_file.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
        console.print(f"json: {json_file}")


def _table(res: rightsize.Result) -> Table:
    table = Table(
        title=(
            f"kallot sim rightsize: {len(res.services)} services, seed {res.seed}, trained on "
            f"{res.train_s / 60:.0f} min, replayed {res.replay_s / 60:.0f} min"
        )
    )
    for col in (
        "placement",
        "GPUs needed",
        "unplaced",
        "memory overruns (pods)",
        "overrun pod-minutes",
        "contention GPU-minutes",
    ):
        table.add_column(col, justify="left" if col == "placement" else "right")
    for name, placed, rep in (
        ("as requested", res.as_requested, res.as_requested_replay),
        ("right-sized", res.rightsized, res.rightsized_replay),
    ):
        table.add_row(
            name,
            str(placed.gpus_needed),
            str(placed.unplaced),
            str(rep.memory_overruns),
            f"{rep.overrun_pod_minutes:.1f}",
            f"{rep.contention_gpu_minutes:.1f}",
        )
    return table
