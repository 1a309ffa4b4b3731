"""``kallot sim tenants``: five teams in a department -> team queue tree share an openb cluster;
kallot's queues (fair share, lending, reclaim, preemption) against FIFO with static quotas
(sim.tenants), with a progress bar, a table, a PNG and optionally the numbers as JSON.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from kallot.cli import ui
from kallot.core.errors import KallotError
from kallot.sim import tenants, trace


def register(app: typer.Typer) -> None:
    """Add ``tenants`` to the ``sim`` group."""
    app.command("tenants")(run)


def run(
    *,
    seed: Annotated[
        int, typer.Option(min=0, help="Seed of the node sample, workload and sessions.")
    ] = 0,
    nodes: Annotated[int, typer.Option(min=1, help="openb nodes sampled for the cluster.")] = 16,
    hours: Annotated[float, typer.Option(min=0.01, help="Simulated hours of arrivals.")] = 6.0,
    load: Annotated[
        float, typer.Option(min=0.01, max=10.0, help="Offered GPU-time / capacity.")
    ] = 1.3,
    period: Annotated[float, typer.Option(min=1.0, help="Seconds between sessions.")] = 60.0,
    policy: Annotated[
        str,
        typer.Option(click_type=ui.SIM_POLICY, help="Placement policy of both schedulers."),
    ] = "bestfit",
    node_list: Annotated[
        Path | None, typer.Option("--node-list", help="openb node CSV (default: bundled).")
    ] = None,
    pod_list: Annotated[
        str,
        typer.Option("--workload", help="openb pod list: a bundled workload name or a CSV."),
    ] = "default",
    json_file: Annotated[
        Path | None, typer.Option("--json", help="Write the summary as JSON to this file.")
    ] = None,
    png: Annotated[Path, typer.Option("--plot", help="Write the PNG here.")] = Path(
        "kallot-tenants.png"
    ),
) -> None:
    """Compare kallot's queues with FIFO + static quotas on a multi-tenant openb workload."""
    console = ui.console()
    horizon = hours * 3600.0
    try:
        ui.check_output(json_file, "--json")
        ui.check_output(png, "--plot")
        node_rows = trace.read_nodes(node_list or trace.bundled(trace.BUNDLED_NODES))
        pod_rows = trace.read_pods(trace.resolve_workload(pod_list))
        with ui.progress(console) as bar:
            task = bar.add_task(
                "sessions (fifo, then kallot)", total=2 * tenants.steps(horizon, period)
            )
            cmp = tenants.compare(
                node_rows,
                pod_rows,
                n_nodes=nodes,
                horizon_s=horizon,
                period_s=period,
                load=load,
                seed=seed,
                policy=policy,
                progress=lambda n: bar.advance(task, n),
            )
    except KallotError as exc:  # ConfigError and TraceError included: bad input, named
        ui.error(exc)
        raise typer.Exit(2) from None
    summary = cmp.summary()
    console.print(_table(summary))
    # matplotlib is imported only by commands that draw: `kallot scheduler` starts faster
    from kallot.sim.tenants_plot import plot

    plot(cmp, png)
    console.print(f"plot: {png}")
    if json_file is not None:
        json_file.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
        console.print(f"json: {json_file}")


def _table(summary: dict[str, object]) -> Table:
    table = Table(title="kallot sim tenants: FIFO + static quotas vs kallot queues")
    table.add_column("metric")
    table.add_column("fifo", justify="right")
    table.add_column("kallot", justify="right")
    rows = (
        ("Jain's index (received / fair share)", "jain_index", "{:.3f}"),
        ("GPU allocation, %", "utilization_pct", "{:.1f}"),
        ("guarantee shortfall, T4-hours (value x h)", "guarantee_shortfall_value_hours", "{:.2f}"),
        ("hard-limit / quota violations", "quota_violations_by_scheduler", "{:.0f}"),
        ("pods pending at the end", "pending_at_end", "{:.0f}"),
    )
    for label, key, fmt in rows:
        pair = summary[key]
        assert isinstance(pair, dict)
        table.add_row(label, fmt.format(float(pair["fifo"])), fmt.format(float(pair["kallot"])))
    for label, key in (
        ("evictions", "evictions"),
        ("GPU-hours lost to evictions", "preempted_gpu_hours"),
        ("do-not-disrupt evictions", "do_not_disrupt_evictions"),
        ("partial gang evictions", "partial_gang_evictions"),
        ("evictions inside min runtime", "min_runtime_evictions"),
    ):
        table.add_row(label, "0", str(summary[key]))
    return table
