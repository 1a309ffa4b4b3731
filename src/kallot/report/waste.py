"""The waste report and the right-sizing input, from the node agents' per-pod series.

Where it sits: the report shell. ``fetch`` reads the four per-pod series the agent exports
(``docs/node-agent.md``: allocated and used compute and memory, one label set) over a window on a
step grid; ``waste`` integrates them into GPU-hours per cluster, GPU model, namespace and
workload; ``usages`` pools each workload's samples for ``core.rightsize``.

Accounting, in GPU-equivalents (the core's unit, ``core.fit.gpu_equivalents``): at each step a
pod's device is *allocated* max(compute allocated / 1000, memory allocated / GPU memory) and
*uses* max(compute used / 1000, memory used / GPU memory) (memory alone where NVML has no
per-process compute sample, as inside MIG instances). GPU-hours = sum over the steps where the
pod exists of the value x step / 3600. Idle GPU-hours = allocated - used, counting only steps
where the pod used less than it was allocated. Cost = GPU-hours x the price of the GPU model
per GPU-hour (``--prices``). GPU memory per model comes from ``core.resources.GPU_MODELS``.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from kallot.core.resources import GPU_MODELS, MILLI, canonical_model
from kallot.core.rightsize import Usage
from kallot.core.workload import DeviceRequest
from kallot.report.prom import PromError, Prometheus, Series

F64 = NDArray[np.float64]
MIB = 1 << 20

ALLOC_MILLI = "kallot_pod_gpu_compute_allocated_milli"
ALLOC_MEM = "kallot_pod_gpu_memory_allocated_bytes"
USED_MILLI = "kallot_pod_gpu_compute_used_milli"
USED_MEM = "kallot_pod_gpu_memory_used_bytes"
METRICS = (ALLOC_MILLI, ALLOC_MEM, USED_MILLI, USED_MEM)
PEAK_MEM = "peak_mem"  # max_over_time of USED_MEM over each step (at least PEAK_RANGE_S)
PEAK_RANGE_S = 30
# Labels that name one pod on one device (the agent's POD_LABELS; ``cluster`` where a
# multi-cluster Prometheus adds it).
KEY = ("cluster", "namespace", "pod", "UUID", "Hostname", "GPU_I_PROFILE", "modelName", "workload")
DEFAULT_CLUSTER = "default"


def default_step(window_s: float) -> float:
    """At most ~2000 points per series, at least 15 s (a usual scrape interval)... or the
    window / 20 for very short windows (tests), never below 1 s."""
    return max(1.0, min(15.0, window_s / 20), math.ceil(window_s / 2000))


@dataclass(slots=True)
class PodDevice:
    """One pod on one device over the window, on the step grid (NaN where absent)."""

    labels: dict[str, str]
    alloc_milli: F64
    alloc_mem_mib: F64
    used_milli: F64
    used_mem_mib: F64
    gpu_mem_mib: int  # 0: unknown model
    # the highest memory use within each step (at least PEAK_RANGE_S): peaks between the points
    # of a coarse grid are not lost for right-sizing
    peak_mem_mib: F64 = field(default_factory=lambda: np.zeros(0))

    @property
    def model(self) -> str:
        return canonical_model(self.labels.get("modelName", "")) or "unknown"

    @property
    def workload(self) -> str:
        """``namespace/Kind/name`` (``namespace/Pod/name`` for a pod without an owner)."""
        owner = self.labels.get("workload") or f"Pod/{self.labels.get('pod', '')}"
        return f"{self.labels.get('namespace', '')}/{owner}"

    def alloc_eq(self) -> F64:
        return _eq(self.alloc_milli, self.alloc_mem_mib, self.gpu_mem_mib)

    def used_eq(self) -> F64:
        return _eq(self.used_milli, self.used_mem_mib, self.gpu_mem_mib)


def _eq(milli: F64, mem: F64, gpu_mem: int) -> F64:
    c: F64 = milli / MILLI
    m = mem / gpu_mem if gpu_mem > 0 else np.full_like(mem, np.nan)
    return np.asarray(np.fmax(c, m), dtype=np.float64)  # NaN only where both are absent


@dataclass(frozen=True, slots=True)
class Window:
    start: float
    end: float
    step: float

    @property
    def grid(self) -> F64:
        n = math.floor((self.end - self.start) / self.step + 1e-9) + 1
        return self.start + self.step * np.arange(n, dtype=np.float64)


def fetch(prom: Prometheus, window: Window) -> list[PodDevice]:
    """The per-pod series over ``window``; PromError when they are missing or empty."""
    names = prom.metric_names()
    missing = [m for m in (ALLOC_MILLI, ALLOC_MEM, USED_MEM) if m not in names]
    if missing:
        raise PromError(
            f"Prometheus at {prom.url} has no {', '.join(missing)}: is the kallot node agent "
            "(its /metrics) scraped?"
        )
    grid = window.grid
    got: dict[str, list[Series]] = {
        m: (prom.query_range(m, window.start, window.end, window.step) if m in names else [])
        for m in METRICS
    }
    peak_range = int(max(window.step, PEAK_RANGE_S))
    got[PEAK_MEM] = prom.query_range(
        f"max_over_time({USED_MEM}[{peak_range}s])", window.start, window.end, window.step
    )
    if not got[ALLOC_MILLI] and not got[USED_MEM]:
        raise PromError(
            f"Prometheus at {prom.url} has no kallot per-pod samples between "
            f"{iso_time(window.start)} and {iso_time(window.end)}: the window is empty (try a longer "
            "--since)"
        )
    by_key: dict[tuple[str, ...], dict[str, F64]] = {}
    labels_of: dict[tuple[str, ...], dict[str, str]] = {}
    for metric, series in got.items():
        for s in series:
            lab = {k: s.labels.get(k, "") for k in KEY}
            lab["cluster"] = lab["cluster"] or DEFAULT_CLUSTER
            key = tuple(lab[k] for k in KEY)
            labels_of[key] = lab
            values = np.full(grid.size, np.nan)
            idx = np.rint((s.t - window.start) / window.step).astype(np.int64)
            ok = (idx >= 0) & (idx < grid.size)
            values[idx[ok]] = s.v[ok]
            by_key.setdefault(key, {})[metric] = values
    out = []
    for key, vals in sorted(by_key.items()):
        lab = labels_of[key]
        model = canonical_model(lab["modelName"])
        gpu_mem = GPU_MODELS[model].memory_mib if model in GPU_MODELS else 0
        nan = np.full(grid.size, np.nan)
        out.append(
            PodDevice(
                labels=lab,
                alloc_milli=vals.get(ALLOC_MILLI, nan),
                alloc_mem_mib=vals.get(ALLOC_MEM, nan) / MIB,
                used_milli=vals.get(USED_MILLI, nan),
                used_mem_mib=vals.get(USED_MEM, nan) / MIB,
                gpu_mem_mib=gpu_mem,
                peak_mem_mib=vals.get(PEAK_MEM, vals.get(USED_MEM, nan)) / MIB,
            )
        )
    return out


def iso_time(t: float) -> str:
    """Unix seconds as ISO 8601 UTC, for messages and the JSON."""
    return dt.datetime.fromtimestamp(t, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(slots=True)
class Row:
    """GPU-hours of one group (a cluster, a model, a namespace or a workload)."""

    name: str
    allocated_h: float = 0.0
    used_h: float = 0.0
    idle_h: float = 0.0
    pods: set[str] = field(default_factory=set)
    models: set[str] = field(default_factory=set)
    cost: float | None = 0.0
    idle_cost: float | None = 0.0

    @property
    def used_fraction(self) -> float:
        return self.used_h / self.allocated_h if self.allocated_h > 0 else 0.0

    def as_dict(self) -> dict[str, object]:
        return {
            "allocated_gpu_hours": round(self.allocated_h, 6),
            "used_gpu_hours": round(self.used_h, 6),
            "idle_gpu_hours": round(self.idle_h, 6),
            "used_fraction": round(self.used_fraction, 6),
            "pods": len(self.pods),
            "models": sorted(self.models),
            "cost": None if self.cost is None else round(self.cost, 4),
            "idle_cost": None if self.idle_cost is None else round(self.idle_cost, 4),
        }


@dataclass(slots=True)
class Waste:
    window: Window
    clusters: dict[str, Row]
    models: dict[str, Row]
    namespaces: dict[str, Row]
    workloads: dict[str, Row]
    t: F64  # the step grid
    fleet_allocated: F64  # GPU-equivalents allocated at each step
    fleet_used: F64
    unpriced: set[str]  # models without a price
    per_workload_used: dict[str, F64]  # used (up to the allocation) / allocated per step

    def total(self) -> Row:
        r = Row("total", cost=0.0, idle_cost=0.0)
        for c in self.clusters.values():
            _add_row(r, c)
        return r

    def worst(self, n: int = 10) -> list[Row]:
        """The workloads with the most idle GPU-hours."""
        return sorted(self.workloads.values(), key=lambda r: (-r.idle_h, r.name))[:n]

    def as_dict(self, top: int = 10) -> dict[str, object]:
        return {
            "window": {
                "start": iso_time(self.window.start),
                "end": iso_time(self.window.end),
                "step_s": self.window.step,
            },
            "total": self.total().as_dict(),
            "clusters": {k: v.as_dict() for k, v in sorted(self.clusters.items())},
            "models": {k: v.as_dict() for k, v in sorted(self.models.items())},
            "namespaces": {k: v.as_dict() for k, v in sorted(self.namespaces.items())},
            "workloads": {k: v.as_dict() for k, v in sorted(self.workloads.items())},
            "worst_offenders": [r.name for r in self.worst(top)],
            "unpriced_models": sorted(self.unpriced),
        }


def _add_row(into: Row, r: Row) -> None:
    into.allocated_h += r.allocated_h
    into.used_h += r.used_h
    into.idle_h += r.idle_h
    into.pods |= r.pods
    into.models |= r.models
    into.cost = None if into.cost is None or r.cost is None else into.cost + r.cost
    into.idle_cost = (
        None if into.idle_cost is None or r.idle_cost is None else into.idle_cost + r.idle_cost
    )


def waste(devices: Iterable[PodDevice], window: Window, prices: Mapping[str, float]) -> Waste:
    """Integrate the series into GPU-hours per group (module docstring)."""
    grid = window.grid
    groups: dict[str, dict[str, Row]] = {"c": {}, "m": {}, "n": {}, "w": {}}
    fleet_a = np.zeros(grid.size)
    fleet_u = np.zeros(grid.size)
    unpriced: set[str] = set()
    ratio: dict[str, list[F64]] = {}
    hours = window.step / 3600
    for d in devices:
        a = d.alloc_eq()
        u = d.used_eq()
        present = ~np.isnan(a)
        a0 = np.where(present, a, 0.0)
        u0 = np.where(present & ~np.isnan(u), u, 0.0)
        fleet_a += a0
        fleet_u += np.minimum(u0, a0)
        alloc_h = float(a0.sum()) * hours
        used_h = float(np.minimum(u0, a0).sum()) * hours
        idle_h = float(np.clip(a0 - u0, 0, None).sum()) * hours
        model = d.model
        price = prices.get(model)
        if price is None:
            unpriced.add(model)
        pod = f"{d.labels['namespace']}/{d.labels['pod']}"
        for g, name in (
            ("c", d.labels["cluster"]),
            ("m", model),
            ("n", d.labels["namespace"]),
            ("w", d.workload),
        ):
            row = groups[g].setdefault(name, Row(name))
            _add_row(
                row,
                Row(
                    name,
                    alloc_h,
                    used_h,
                    idle_h,
                    {pod},
                    {model},
                    None if price is None else alloc_h * price,
                    None if price is None else idle_h * price,
                ),
            )
        if present.any():
            ratio.setdefault(d.workload, []).append(
                np.where(a0 > 0, np.minimum(u0, a0) / np.where(a0 > 0, a0, 1), np.nan)[present]
            )
    return Waste(
        window=window,
        clusters=groups["c"],
        models=groups["m"],
        namespaces=groups["n"],
        workloads=groups["w"],
        t=grid,
        fleet_allocated=fleet_a,
        fleet_used=fleet_u,
        unpriced=unpriced,
        per_workload_used={k: np.concatenate(v) for k, v in ratio.items()},
    )


@dataclass(frozen=True, slots=True)
class WorkloadUse:
    """What ``kallot rightsize`` needs of one workload: its pooled samples, its request, its GPU."""

    workload: str
    model: str
    gpu_mem_mib: int
    current: DeviceRequest
    usage: Usage
    pods: int


def usages(devices: Iterable[PodDevice], window: Window) -> list[WorkloadUse]:
    """Each workload's memory and compute samples, pooled over its pods and devices (memory: the
    highest use within each step, ``peak_mem_mib``), with the request its latest pod holds."""
    pooled: dict[str, list[PodDevice]] = {}
    for d in devices:
        if d.gpu_mem_mib > 0 and not np.all(np.isnan(d.alloc_milli)):
            pooled.setdefault(d.workload, []).append(d)
    out = []
    for name, ds in sorted(pooled.items()):
        mem = np.concatenate([_peaks(d)[~np.isnan(_peaks(d))] for d in ds])
        milli = np.concatenate([d.used_milli[~np.isnan(d.used_milli)] for d in ds])
        steps = max(int(np.count_nonzero(~np.isnan(_peaks(d)))) for d in ds)
        last = ds[-1]
        out.append(
            WorkloadUse(
                workload=name,
                model=last.model,
                gpu_mem_mib=last.gpu_mem_mib,
                current=request_of(last),
                usage=Usage.of(mem, milli if milli.size else np.zeros(0), steps * window.step),
                pods=len({d.labels["pod"] for d in ds}),
            )
        )
    return out


def _peaks(d: PodDevice) -> F64:
    return d.peak_mem_mib if d.peak_mem_mib.size else d.used_mem_mib


def request_of(d: PodDevice) -> DeviceRequest:
    """The request a pod's allocation stands for: a MIG profile, a whole GPU (all compute and
    all memory), or a share."""
    profile = d.labels.get("GPU_I_PROFILE", "")
    model = frozenset({d.model})
    if profile:
        return DeviceRequest(count=1, mig_profile=profile, models=model)
    milli = _last(d.alloc_milli)
    mem = _last(d.alloc_mem_mib)
    if milli >= MILLI and mem >= d.gpu_mem_mib:
        return DeviceRequest(count=1, models=model)
    return DeviceRequest(
        count=1, milli=max(1, min(MILLI, int(milli))), mem_mib=int(mem), models=model
    )


def _last(x: F64) -> float:
    ok = x[~np.isnan(x)]
    return float(ok[-1]) if ok.size else 0.0
