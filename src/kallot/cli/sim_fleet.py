"""``kallot sim fleet``: an LLM-serving fleet on H100/H200 nodes placed six ways by the core
(integer GPUs, time-slicing, MPS, static MIG, dynamic MIG, kallot choosing per workload), with a
progress bar, a table, a PNG and optionally the numbers as JSON (sim.fleet).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kallot.cli import sim, ui
from kallot.sim import fleet

REPORT = sim.default_report("fleet")  # --report's default


def register(app: typer.Typer) -> None:
    """Add ``fleet`` to the ``sim`` group."""
    app.command("fleet")(run)


def run(
    *,
    seed: sim.Seed = 0,
    services: Annotated[int, typer.Option(min=1, help="Inference services in the fleet.")] = 300,
    policy: sim.Policy = "kallot",
    config: sim.Config = None,
    json_file: sim.Json = None,
    png: sim.Plot = None,
    html_file: Annotated[Path, sim.report_option("fleet")] = REPORT,
) -> None:
    """How many GPUs an LLM-serving fleet needs under each GPU-sharing strategy."""
    console = ui.console()

    def go() -> None:
        label, doc = sim.policy_or_config(policy, config)
        sim.check_outputs(json_out=json_file, plot=png, report=html_file)
        with ui.progress(console) as bar:
            task = bar.add_task("strategies", total=len(fleet.STRATEGIES))
            cmp = fleet.compare(
                services,
                seed,
                policy=label,
                config=doc,
                progress=lambda name: bar.update(task, advance=1, description=f"placed: {name}"),
            )
        summary = cmp.summary()
        ui.print_table(console, *_table(cmp), legend=LEGEND)
        ratio = summary["kallot_vs_integer"]
        assert isinstance(ratio, float)
        console.print(f"kallot needs {ratio:.3f} of the GPUs integer allocation needs")
        # matplotlib is imported only by commands that draw: `kallot scheduler` starts faster
        from kallot.sim import fleet_plot

        sim.write_plot(png, lambda: fleet_plot.figure(cmp))
        sim.write_json(json_file, summary, sort_keys=True)
        title = f"kallot sim fleet: {len(cmp.services)} LLM-serving services, seed {cmp.seed}"
        sim.write_report(html_file, title, _html_tables(cmp), [fleet_plot.figure(cmp)], NOTES)

    sim.guarded(go)


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


# The terminal table's short headers and what they stand for (printed under the table).
LEGEND = {
    "GPUs": "GPUs needed",
    "mem %": "memory utilisation %",
    "cmp %": "compute utilisation %",
    "GPU-eq": "GPU-equivalents used",
    "strand": "stranded GPU-equivalents",
    "overc": "GPUs with memory over-commit",
    "isol": "isolation violations",
    "unpl": "services unplaced",
}


def _table(cmp: fleet.Comparison) -> tuple[str, list[str], list[list[str]]]:
    """Title, header and rows of the terminal table."""
    title = f"kallot sim fleet: {len(cmp.services)} services, seed {cmp.seed}"
    header = ["strategy", *LEGEND]
    rows = []
    for name in fleet.STRATEGIES:
        r = cmp.results[name]
        rows.append(
            [
                name,
                str(r.gpus_needed),
                f"{100 * r.memory_util:.1f}",
                f"{100 * r.compute_util:.1f}",
                f"{r.gpu_equivalents:.1f}",
                f"{r.stranded:.1f}",
                str(r.memory_overcommit_events),
                str(r.isolation_violations),
                str(r.unplaced),
            ]
        )
    return title, header, rows
