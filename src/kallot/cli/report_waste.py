"""``kallot report waste`` and ``kallot rightsize``: allocated vs used GPU-hours from a
Prometheus that scrapes the kallot node agents, and the request each workload should make.

Both read the same per-pod series (report.waste.fetch); the waste report integrates them into
GPU-hours and cost (terminal table, --json, HTML with plots); rightsize hands each workload's
pooled samples to core.rightsize (table, --json, kubectl patches). Errors are one line.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from kallot.cli import ui
from kallot.core import rightsize as core_rightsize
from kallot.core.errors import KallotError
from kallot.core.workload import DeviceRequest
from kallot.kube.translate import (
    RESOURCE_GPU,
    RESOURCE_GPU_MEMORY,
    RESOURCE_GPU_MILLI,
    RESOURCE_MIG_PREFIX,
)
from kallot.report import waste
from kallot.report.prices import load_prices
from kallot.report.prom import PromError, Prometheus, parse_duration

PrometheusOpt = Annotated[
    str, typer.Option("--prometheus", help="Prometheus (or compatible) base URL.")
]
SinceOpt = Annotated[str, typer.Option(help="Window length before --end: 30m, 6h, 7d, 2w.")]
EndOpt = Annotated[
    str | None,
    typer.Option(help="End of the window: unix seconds or ISO 8601 (default: now)."),
]
StepOpt = Annotated[
    float | None, typer.Option(min=1.0, help="Resolution in seconds (default: from --since).")
]
JsonOpt = Annotated[Path | None, typer.Option("--json", help="Write the result as JSON here.")]


def register(app: typer.Typer, report_app: typer.Typer) -> None:
    """Add ``report waste`` and top-level ``rightsize``."""
    report_app.command("waste")(waste_cmd)
    app.command("rightsize")(rightsize_cmd)


def _window(since: str, end: str | None, step: float | None) -> waste.Window:
    length = parse_duration(since)
    if end is None:
        t_end = time.time()
    else:
        try:
            t_end = float(end)
        except ValueError:
            try:
                t_end = dt.datetime.fromisoformat(end).timestamp()
            except ValueError:
                raise PromError(
                    f"--end: got {end!r}, expected unix seconds or an ISO 8601 time"
                ) from None
    return waste.Window(t_end - length, t_end, step or waste.default_step(length))


def _fail(exc: Exception) -> typer.Exit:
    ui.console(stderr=True).print(f"[red]error:[/red] {exc}", soft_wrap=True)
    return typer.Exit(2)


def waste_cmd(
    *,
    prometheus: PrometheusOpt,
    since: SinceOpt = "7d",
    end: EndOpt = None,
    step: StepOpt = None,
    prices: Annotated[
        Path | None, typer.Option(help="Price per GPU-hour per model (YAML/JSON).")
    ] = None,
    top: Annotated[int, typer.Option(min=1, help="Worst offenders to list.")] = 10,
    json_file: JsonOpt = None,
    html_file: Annotated[
        Path | None, typer.Option("--html", help="Write an HTML report with plots here.")
    ] = None,
) -> None:
    """GPU-hours allocated vs used per cluster, GPU model, namespace and workload, idle hours,
    cost and the worst offenders."""
    console = ui.console()
    try:
        table = {} if prices is None else load_prices(prices).table()
        currency = "" if prices is None else load_prices(prices).currency
        window = _window(since, end, step)
        devices = waste.fetch(Prometheus(prometheus), window)
    except KallotError as exc:
        raise _fail(exc) from None
    w = waste.waste(devices, window, table)
    for title, rows in _tables(w, top):
        console.print(_rich_table(title, rows, priced=prices is not None, currency=currency))
    if w.unpriced and prices is not None:
        console.print(f"no price for: {', '.join(sorted(w.unpriced))} (cost shown as -)")
    if json_file is not None:
        data = w.as_dict(top)
        data["currency"] = currency
        json_file.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        console.print(f"json: {json_file}")
    if html_file is not None:
        from kallot.report import plots  # matplotlib: only when a report is drawn
        from kallot.sim import report as html_report

        figs = [plots.fleet_figure(w), plots.namespaces_figure(w), plots.workloads_figure(w, top)]
        images = [html_report.png_bytes(f) for f in figs]
        for f in figs:
            plots.close(f)
        header = _header(priced=prices is not None, currency=currency)
        page = html_report.html_page(
            f"kallot waste report: {waste.iso_time(window.start)} to {waste.iso_time(window.end)}",
            [
                (t, header, [_cells(r, prices is not None) for r in rows])
                for t, rows in _tables(w, top)
            ],
            images,
            notes=HTML_NOTES,
        )
        for path in html_report.write(html_file, page, images):
            console.print(f"report: {path}")


HTML_NOTES = (
    "GPU-equivalents: the larger of the compute share (1000 milli = 1) and the memory share of "
    "the GPU a pod holds or uses. Used counts use up to the allocation; idle = allocated - used. "
    "Cost = allocated GPU-hours x the model's price per GPU-hour. docs/rightsizing.md.",
)


def _tables(w: waste.Waste, top: int) -> list[tuple[str, list[waste.Row]]]:
    def by_alloc(rows: dict[str, waste.Row]) -> list[waste.Row]:
        return sorted(rows.values(), key=lambda r: (-r.allocated_h, r.name))

    return [
        ("clusters", [*by_alloc(w.clusters), w.total()]),
        ("GPU models", by_alloc(w.models)),
        ("namespaces", by_alloc(w.namespaces)),
        (f"worst offenders (workloads, top {top} by idle GPU-hours)", w.worst(top)),
    ]


def _header(*, priced: bool, currency: str) -> list[str]:
    cols = ["name", "pods", "allocated GPU-h", "used GPU-h", "idle GPU-h", "used %"]
    if priced:
        cols += [f"cost {currency}", f"idle cost {currency}"]
    return cols


def _cells(r: waste.Row, priced: bool) -> list[str]:
    cells = [
        r.name,
        str(len(r.pods)),
        f"{r.allocated_h:.3f}",
        f"{r.used_h:.3f}",
        f"{r.idle_h:.3f}",
        f"{100 * r.used_fraction:.1f}",
    ]
    if priced:
        cells += [_money(r.cost), _money(r.idle_cost)]
    return cells


def _money(x: float | None) -> str:
    return "-" if x is None else f"{x:,.2f}"


def _rich_table(title: str, rows: list[waste.Row], *, priced: bool, currency: str) -> Table:
    t = Table(title=title)
    for i, col in enumerate(_header(priced=priced, currency=currency)):
        t.add_column(col, justify="left" if i == 0 else "right")
    for r in rows:
        t.add_row(*_cells(r, priced))
    return t


def rightsize_cmd(
    *,
    prometheus: PrometheusOpt,
    since: SinceOpt = "7d",
    end: EndOpt = None,
    step: StepOpt = None,
    json_file: JsonOpt = None,
    patches: Annotated[
        Path | None,
        typer.Option(help="Write kubectl patch commands (kallot's pod API) to this file."),
    ] = None,
) -> None:
    """A recommended GPU request per workload from its observed use: a memory + compute share,
    the smallest MIG profile holding both, or the whole GPU; with confidence, saving and the
    risk of running out of memory."""
    console = ui.console()
    try:
        window = _window(since, end, step)
        devices = waste.fetch(Prometheus(prometheus), window)
    except KallotError as exc:
        raise _fail(exc) from None
    recs = [
        (u, core_rightsize.recommend(u.usage, u.current, u.model, u.gpu_mem_mib))
        for u in waste.usages(devices, window)
    ]
    t = Table(title=f"kallot rightsize: {since} to {waste.iso_time(window.end)}")
    for col in (
        "workload",
        "pods",
        "model",
        "now",
        "recommended",
        "peak MiB",
        "p99 MiB",
        "p95 milli",
        "samples",
        "confidence",
        "saving GPU-eq/pod",
    ):
        left = col in ("workload", "model", "now", "recommended")
        t.add_column(col, justify="left" if left else "right", no_wrap=left)
    for u, r in recs:
        t.add_row(
            u.workload,
            str(u.pods),
            u.model,
            describe(r.current, r),
            describe(r.request, r),
            f"{r.peak_mem_mib:.0f}",
            f"{r.quantile_mem_mib:.0f}",
            f"{r.quantile_milli:.0f}",
            str(r.samples),
            r.confidence,
            f"{r.saving_gpu_eq:.3f}",
        )
    console.print(t)
    for u, r in recs:
        console.print(f"[bold]{u.workload}[/bold]: {r.oom_risk}", soft_wrap=True)
        for note in r.notes:
            console.print(f"  note: {note}", soft_wrap=True)
    if json_file is not None:
        json_file.write_text(json.dumps([as_json(u, r) for u, r in recs], indent=2) + "\n")
        console.print(f"json: {json_file}")
    if patches is not None:
        lines = [p for u, r in recs if (p := patch(u, r))]
        patches.write_text("".join(f"{line}\n" for line in lines))
        console.print(f"patches: {patches} ({len(lines)} workloads)")


def describe(req: DeviceRequest, r: core_rightsize.Recommendation) -> str:
    if req.mig_profile:
        return f"MIG {req.mig_profile}"
    if req.whole:
        return "whole GPU"
    return f"{req.milli} milli, {req.memory_for(r.gpu_mem_mib)} MiB"


def as_json(u: waste.WorkloadUse, r: core_rightsize.Recommendation) -> dict[str, object]:
    return {
        "workload": u.workload,
        "pods": u.pods,
        "model": u.model,
        "form": r.form,
        "current": describe(r.current, r),
        "recommended": {
            "milli": r.milli,
            "mem_mib": r.mem_mib,
            "mig_profile": r.request.mig_profile,
            "whole": r.request.whole,
        },
        "peak_mem_mib": round(r.peak_mem_mib, 3),
        "quantile_mem_mib": round(r.quantile_mem_mib, 3),
        "quantile_milli": round(r.quantile_milli, 3),
        "samples": r.samples,
        "window_s": r.window_s,
        "confidence": r.confidence,
        "gpu_eq_now": round(r.gpu_eq_now, 6),
        "gpu_eq_after": round(r.gpu_eq_after, 6),
        "saving_gpu_eq_per_pod": round(r.saving_gpu_eq, 6),
        "oom_risk": r.oom_risk,
        "notes": list(r.notes),
    }


_KINDS = {"Deployment": "deployment", "StatefulSet": "statefulset", "ReplicaSet": "replicaset"}


def _pointer(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _resources(req: DeviceRequest) -> dict[str, str]:
    """The limits a request stands for in kallot's pod API (kube.translate's names)."""
    if req.mig_profile:
        return {RESOURCE_MIG_PREFIX + req.mig_profile: "1"}
    if req.whole:
        return {RESOURCE_GPU: str(req.count)}
    out = {RESOURCE_GPU_MILLI: str(req.milli)}
    if req.mem_mib:
        out[RESOURCE_GPU_MEMORY] = f"{req.mem_mib}Mi"
    return out


def patch(u: waste.WorkloadUse, r: core_rightsize.Recommendation) -> str:
    """A ``kubectl patch`` (JSON patch) of the workload's pod template to the recommended
    request, or '' where nothing changes or the owner has no pod template kubectl can patch in
    place (a bare pod, a Job: edit its manifest). The GPU request is assumed to be on the first
    container, as the pod's allocation is reported per pod."""
    ns, kind, name = ([*u.workload.split("/", 2), "", ""])[:3]
    if r.request == r.current or kind not in _KINDS:
        return ""
    path = "/spec/template/spec/containers/0/resources/limits"
    ops: list[dict[str, str]] = [
        {"op": "remove", "path": f"{path}/{_pointer(k)}"} for k in _resources(r.current)
    ]
    ops += [
        {"op": "add", "path": f"{path}/{_pointer(k)}", "value": v}
        for k, v in _resources(r.request).items()
    ]
    return f"kubectl -n {ns} patch {_KINDS[kind]} {name} --type=json -p '{json.dumps(ops)}'"
