"""``kallot sim fleet``: an LLM-serving fleet on H100/H200 nodes placed six ways by the core
(integer GPUs, time-slicing, MPS, static MIG, dynamic MIG, kallot choosing per workload), with a
progress bar, a table, a PNG and optionally the numbers as JSON (sim.fleet).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from kallot.cli import ui
from kallot.core.errors import KallotError
from kallot.core.policies import POLICY_NAMES
from kallot.sim import fleet


def register(app: typer.Typer) -> None:
    """Add ``fleet`` to the ``sim`` group."""
    app.command("fleet")(run)


def run(
    *,
    seed: Annotated[int, typer.Option(min=0, help="Seed of the fleet and the sessions.")] = 0,
    services: Annotated[int, typer.Option(min=1, help="Inference services in the fleet.")] = 300,
    policy: Annotated[
        str, typer.Option(click_type=ui.SIM_POLICY, help="Placement policy (core profile).")
    ] = "kallot",
    json_file: Annotated[
        Path | None, typer.Option("--json", help="Write the summary as JSON to this file.")
    ] = None,
    png: Annotated[Path, typer.Option("--plot", help="Write the PNG here.")] = Path(
        "kallot-fleet.png"
    ),
    html_file: Annotated[
        Path | None,
        typer.Option("--report", help="Write a self-contained HTML report (table + plot)."),
    ] = None,
) -> None:
    """How many GPUs an LLM-serving fleet needs under each GPU-sharing strategy."""
    # matplotlib is imported only by commands that draw: `kallot scheduler` starts faster
    from kallot.sim import fleet_plot, report

    console = ui.console()
    if policy not in POLICY_NAMES:
        ui.error(f"--policy: got {policy!r}, expected one of {', '.join(POLICY_NAMES)}")
        raise typer.Exit(2)
    try:
        ui.check_output(json_file, "--json")
        ui.check_output(png, "--plot")
        ui.check_output(html_file, "--report")
        with ui.progress(console) as bar:
            task = bar.add_task("strategies", total=len(fleet.STRATEGIES))
            cmp = fleet.compare(
                services,
                seed,
                policy=policy,
                progress=lambda name: bar.update(task, advance=1, description=f"placed: {name}"),
            )
    except KallotError as exc:
        ui.error(exc)
        raise typer.Exit(2) from None
    summary = cmp.summary()
    console.print(_table(cmp))
    ratio = summary["kallot_vs_integer"]
    assert isinstance(ratio, float)
    console.print(f"kallot needs {ratio:.3f} of the GPUs integer allocation needs")
    fleet_plot.plot(cmp, png)
    console.print(f"plot: {png}")
    if json_file is not None:
        json_file.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
        console.print(f"json: {json_file}")
    if html_file is not None:
        images = [report.png_bytes(fleet_plot.figure(cmp))]
        title = f"kallot sim fleet: {len(cmp.services)} LLM-serving services, seed {cmp.seed}"
        page = report.html_page(title, _html_tables(cmp), images, notes=NOTES)
        for path in report.write(html_file, page, images):
            console.print(f"report: {path}")


NOTES = (
    "GPUs needed: GPUs holding at least one service after the whole fleet is placed, by the "
    "core, on a cluster with a GPU to spare for every service (docs/design/005-sharing.md).",
    "Memory over-commit: GPUs whose tenants' real memory exceeds the GPU (time-slicing does not "
    "limit memory). Isolation violations: services on a mechanism their isolation rules out.",
    "Stranded: GPU-equivalents free on GPUs in use that no request can use with them "
    "(core.sharing_frag): compute without memory on share GPUs, MIG slices outside the largest "
    "instance that still fits.",
)


def _html_tables(cmp: fleet.Comparison) -> list[tuple[str, list[str], list[list[str]]]]:
    header = [
        "strategy",
        "GPUs needed",
        "H100",
        "H200",
        "memory util %",
        "compute util %",
        "GPU-equivalents",
        "stranded GPU-eq",
        "mem over-commit GPUs",
        "isolation violations",
        "MIG reconfigurations",
    ]
    rows = []
    for name in fleet.STRATEGIES:
        r = cmp.results[name]
        rows.append(
            [
                name,
                str(r.gpus_needed),
                str(r.gpus_by_model.get(fleet.H100, 0)),
                str(r.gpus_by_model.get(fleet.H200, 0)),
                f"{100 * r.memory_util:.1f}",
                f"{100 * r.compute_util:.1f}",
                f"{r.gpu_equivalents:.1f}",
                f"{r.stranded:.1f}",
                str(r.memory_overcommit_events),
                str(r.isolation_violations),
                str(r.reconfigurations),
            ]
        )
    services = [
        [
            c.name,
            f"{c.mem_mib / 1024:.1f}",
            f"{c.gpu_s}",
            f"{c.rate_range[0]}-{c.rate_range[1]}",
            str(sum(1 for s in cmp.services if s.kind == c.name)),
        ]
        for c in fleet.CLASSES
    ]
    return [
        ("strategies", header, rows),
        ("fleet", ["class", "memory GiB", "GPU-s / request", "requests/s", "services"], services),
    ]


def _table(cmp: fleet.Comparison) -> Table:
    table = Table(title=f"kallot sim fleet: {len(cmp.services)} services, seed {cmp.seed}")
    for col in (
        "strategy",
        "GPUs needed",
        "memory util %",
        "compute util %",
        "GPU-equivalents",
        "stranded GPU-eq",
        "mem over-commit GPUs",
        "isolation violations",
        "unplaced",
    ):
        table.add_column(col, justify="left" if col == "strategy" else "right")
    for name in fleet.STRATEGIES:
        r = cmp.results[name]
        table.add_row(
            name,
            str(r.gpus_needed),
            f"{100 * r.memory_util:.1f}",
            f"{100 * r.compute_util:.1f}",
            f"{r.gpu_equivalents:.1f}",
            f"{r.stranded:.1f}",
            str(r.memory_overcommit_events),
            str(r.isolation_violations),
            str(r.unplaced),
        )
    return table
