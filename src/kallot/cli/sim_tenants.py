"""``kallot sim tenants``: five teams in a department -> team queue tree share an openb cluster;
kallot's queues (fair share, lending, reclaim, preemption) against FIFO with static quotas
(sim.tenants), with a progress bar, a table, a PNG and optionally the numbers as JSON.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kallot.cli import sim, ui
from kallot.sim import tenants, trace

REPORT = sim.default_report("tenants")  # --report's default


def register(app: typer.Typer) -> None:
    """Add ``tenants`` to the ``sim`` group."""
    app.command("tenants")(run)


def run(
    *,
    seed: sim.Seed = 0,
    nodes: Annotated[int, typer.Option(min=1, help="openb nodes sampled for the cluster.")] = 16,
    hours: Annotated[float, typer.Option(min=0.01, help="Simulated hours of arrivals.")] = 6.0,
    load: Annotated[
        float, typer.Option(min=0.01, max=10.0, help="Offered GPU-time / capacity.")
    ] = 1.3,
    period: Annotated[float, typer.Option(min=1.0, help="Seconds between sessions.")] = 60.0,
    policy: sim.Policy = "kallot",
    config: sim.Config = None,
    node_list: Annotated[
        Path | None, typer.Option("--node-list", help="openb node CSV (default: bundled).")
    ] = None,
    pod_list: Annotated[
        str,
        typer.Option("--workload", help="openb pod list: a bundled workload name or a CSV."),
    ] = "default",
    json_file: sim.Json = None,
    png: sim.Plot = None,
    html_file: Annotated[Path, sim.report_option("tenants")] = REPORT,
) -> None:
    """Compare kallot's queues with FIFO + static quotas on a multi-tenant openb workload."""
    console = ui.console()
    horizon = hours * 3600.0

    def go() -> None:
        label, doc = sim.policy_or_config(policy, config)
        sim.check_outputs(json_out=json_file, plot=png, report=html_file)
        nodes_path = trace.existing(node_list or trace.bundled(trace.BUNDLED_NODES), "--node-list")
        node_rows = trace.read_nodes(nodes_path)
        pods_path = trace.existing(trace.resolve_workload(pod_list), "--workload")
        pod_rows = trace.read_pods(pods_path)
        trace.check_gpu_specs(
            pod_rows,
            node_rows,
            pods_file=pods_path.name,
            nodes_file=str(node_list) if node_list else "the bundled nodes",
        )
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
                policy=label,
                config=doc,
                progress=lambda n: bar.advance(task, n),
            )
        summary = cmp.summary()
        title, header, rows = _table(summary)
        ui.print_table(console, title, header, rows)
        # matplotlib is imported only by commands that draw: `kallot scheduler` starts faster
        from kallot.sim import tenants_plot

        sim.write_plot(png, lambda: tenants_plot.figure(cmp))
        sim.write_json(json_file, summary, sort_keys=True)
        sim.write_report(html_file, title, [("metrics", header, rows)], [tenants_plot.figure(cmp)])

    sim.guarded(go)


def _table(summary: dict[str, object]) -> tuple[str, list[str], list[list[str]]]:
    """Title, header and rows of the table."""
    header = ["metric", "fifo", "kallot"]
    table: list[list[str]] = []
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
        table.append([label, fmt.format(float(pair["fifo"])), fmt.format(float(pair["kallot"]))])
    for label, key in (
        ("evictions", "evictions"),
        ("GPU-hours lost to evictions", "preempted_gpu_hours"),
        ("do-not-disrupt evictions", "do_not_disrupt_evictions"),
        ("partial gang evictions", "partial_gang_evictions"),
        ("evictions inside min runtime", "min_runtime_evictions"),
    ):
        table.append([label, "0", str(summary[key])])
    return "kallot sim tenants: FIFO + static quotas vs kallot queues", header, table
