"""The openb experiment protocol of the FGD paper (USENIX ATC '23), on kallot's core.

Where it sits: ``sim.trace`` reads the CSVs; this module turns them into a Snapshot and Tasks,
runs the paper's protocol through ``Scheduler.run_session`` on the simulation kernel's
cluster (``sim.kernel``: one session at time 0, its Decision applied pod by pod) and measures
what the paper measures; ``sim.report`` draws it and ``cli.sim_openb`` is the command line.

Protocol (``docs/design/002-openb.md``, ``/work/shared/reference/fgd-protocol.md`` section 3):
1. target workload = the most popular (cpu, gpu milli, gpu count, models) shapes covering
   >= 95% of the *original* pod list;
2. pods sorted by name and shuffled with the seed, then inflated to 130% of GPU capacity by
   appending seeded resamples of the originals (tuned down by seeded removal when above);
3. node ties broken by a seeded node order (the session draws it from the same rng);
4. every pod is tried once, in order, with no departures (one session: pods arrive in queue
   order and a pod that fits nowhere is dropped);
5. after every pod: arrived GPU request, allocated milli-GPU, fragment amount and idle milli.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from kallot.config import presets
from kallot.config.scheduler import SchedulerConfiguration
from kallot.core import frag
from kallot.core.resources import GPU_MODELS, SharingMode
from kallot.core.scheduler import Scheduler
from kallot.core.snapshot import GpuSpec, NodeSpec, Snapshot, SnapshotBuilder
from kallot.core.workload import DeviceRequest, Task
from kallot.sim import kernel
from kallot.sim.trace import NodeRow, PodRow

I64 = NDArray[np.int64]
F64 = NDArray[np.float64]

INFLATE = 1.3  # the paper's -tune 1.3
COVERAGE = 0.95  # podPopularityThreshold 95
# The authors' simulator has no per-GPU client limit; MPS's 48 would bind on some traces.
OPENB_MAX_CLIENTS = 1000
OPENB_MAX_PODS = 1001  # what the simulator's NodeResourcesFit sees per node


def node_specs(nodes: Sequence[NodeRow]) -> list[NodeSpec]:
    """openb nodes as core NodeSpecs: GPUs in MPS mode (shares allowed), memory from the model
    table (docs/gpu-models.md; openb carries none), no client limit."""
    out = []
    for node in nodes:
        model = node.model
        mem = GPU_MODELS[model].memory_mib if model in GPU_MODELS else 16384
        gpus = [
            GpuSpec(
                model=model,
                mem_mib=mem,
                uuid=f"GPU-{node.name}-{g}",
                mode=SharingMode.MPS,
                max_clients=OPENB_MAX_CLIENTS,
            )
            for g in range(node.gpus)
        ]
        out.append(
            NodeSpec(
                name=node.name,
                cpu_milli=node.cpu_milli,
                mem_mib=node.memory_mib,
                gpus=gpus,
                max_pods=OPENB_MAX_PODS,
            )
        )
    return out


def snapshot_of(nodes: Sequence[NodeRow]) -> Snapshot:
    return SnapshotBuilder().extend(node_specs(nodes)).build()


@functools.lru_cache(maxsize=4096)
def _gpu_request(count: int, milli: int, spec: tuple[str, ...]) -> DeviceRequest:
    """One (immutable) DeviceRequest per pod shape: a trace has a few hundred shapes and an
    experiment builds tens of thousands of tasks."""
    return DeviceRequest(count=count, milli=milli, models=frozenset(spec))


def task_of(pod: PodRow, index: int, *, created: float | None = None) -> Task:
    """A pod row as a core Task; ``index`` keeps arrival order among equal creation times."""
    gpu = None
    if pod.num_gpu > 0:
        gpu = _gpu_request(pod.num_gpu, pod.gpu_milli, pod.gpu_spec)
    return Task(
        id=pod.name,
        cpu_milli=pod.cpu_milli,
        mem_mib=pod.memory_mib,
        gpu=gpu,
        created=float(index) if created is None else created,
    )


def target_workload(pods: Sequence[PodRow], *, coverage: float = COVERAGE) -> frag.TargetWorkload:
    """The protocol's target workload: typical shapes of the original pod list."""
    return frag.TargetWorkload.typical(
        (task_of(p, i) for i, p in enumerate(pods)), coverage=coverage
    )


def arrival_order(
    pods: Sequence[PodRow],
    capacity_milli: int,
    rng: np.random.Generator,
    *,
    inflate: float = INFLATE,
) -> list[PodRow]:
    """Steps 2 of the protocol: name sort, seeded shuffle, inflation (or deflation) to
    ``inflate`` x capacity.

    Inflation keeps a quirk of the authors' tuneUpPods on purpose: it stops when the *per-GPU*
    milli of the next resample would cross the target, then adds its *total* milli.
    """
    by_name = sorted(pods, key=lambda p: p.name)
    order = [by_name[i] for i in rng.permutation(len(by_name))]
    target = inflate * capacity_milli
    total = sum(p.gpu_milli_total for p in order)
    if total < target:
        i = 0
        while True:
            q = by_name[int(rng.integers(len(by_name)))]
            if total + q.gpu_milli > target:
                break
            total += q.gpu_milli_total
            order.append(_renamed(q, f"{q.name}-tuned-{i}"))
            i += 1
    else:
        while total > target and order:
            q = order.pop(int(rng.integers(len(order))))
            total -= q.gpu_milli_total
    return order


def _renamed(p: PodRow, name: str) -> PodRow:
    return PodRow(
        name=name,
        cpu_milli=p.cpu_milli,
        memory_mib=p.memory_mib,
        num_gpu=p.num_gpu,
        gpu_milli=p.gpu_milli,
        gpu_spec=p.gpu_spec,
        qos=p.qos,
        phase=p.phase,
    )


@dataclass(slots=True)
class Run:
    """One experiment: per-event series (event i = the i-th arriving pod)."""

    workload: str
    policy: str
    seed: int
    capacity_milli: int
    arrived_milli: I64  # cumulative GPU request after event i (failed pods count)
    used_milli: I64  # allocated milli-GPU after event i
    frag_milli: F64  # cluster fragment amount after event i
    idle_milli: I64  # idle milli-GPU after event i
    placed: NDArray[np.bool_]
    wall_s: float
    schedule_s: float  # time inside run_session alone
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def attempts(self) -> int:
        return int(self.placed.size)

    def arrived_pct(self) -> I64:
        """The paper's ``round(arrived_gpu_milli / capacity_gpus / 10)``."""
        return np.rint(100.0 * self.arrived_milli / self.capacity_milli).astype(np.int64)

    def _at(self, series: F64, x: int) -> float:
        """Mean of ``series`` over events whose rounded arrival is ``x`` (else within x +- 1,
        else the value after the last event below ``x``: on a small cluster one multi-GPU pod
        can jump over several percent of capacity, and the state when the arrived request
        crosses ``x`` is the state after the last event before it)."""
        pct = self.arrived_pct()
        hit = pct == x
        if not hit.any():
            hit = np.abs(pct - x) <= 1
        if not hit.any():
            below = np.flatnonzero(pct < x)
            if below.size == 0 or below[-1] == pct.size - 1:
                return float("nan")  # never reached x
            return float(series[below[-1]])
        return float(series[hit].mean())

    def alloc_pct(self) -> F64:
        return np.asarray(100.0 * self.used_milli / self.capacity_milli, dtype=np.float64)

    def alloc_at(self, x: int) -> float:
        return self._at(self.alloc_pct(), x)

    def unallocated_at(self, x: int) -> float:
        return 100.0 - self.alloc_at(x)

    def frag_pct_at(self, x: int) -> float:
        """Fragment amount as % of capacity ("Frag / Total")."""
        return self._at(100.0 * self.frag_milli / self.capacity_milli, x)

    def frag_rate_at(self, x: int) -> float:
        """Fragment amount as % of idle milli ("Frag Rate")."""
        rate = np.divide(
            100.0 * self.frag_milli,
            self.idle_milli,
            out=np.zeros_like(self.frag_milli),
            where=self.idle_milli > 0,
        )
        return self._at(rate, x)

    def curve(self, xs: Sequence[int]) -> list[float]:
        return [self.alloc_at(x) for x in xs]


def run(
    nodes: Sequence[NodeRow],
    pods: Sequence[PodRow],
    *,
    policy: str,
    seed: int,
    workload: str = "",
    inflate: float = INFLATE,
    coverage: float = COVERAGE,
    config: SchedulerConfiguration | None = None,
) -> Run:
    """One experiment of the protocol (module docstring) with ``policy`` (the shipped file of
    that name, or ``config``) and ``seed``."""
    start = time.perf_counter()
    cluster = kernel.Cluster(snapshot_of(nodes))
    snapshot = cluster.snapshot()
    capacity = int(snapshot.gpu_cap_milli[snapshot.gpu_valid].sum())
    target = target_workload(pods, coverage=coverage)
    rng = np.random.default_rng(seed)
    order = arrival_order(pods, capacity, rng, inflate=inflate)
    tasks = [task_of(p, i) for i, p in enumerate(order)]
    framework = presets.framework(presets.document(policy, config), name=policy, target=target)
    scheduler = Scheduler(framework, explain=False)
    t0 = time.perf_counter()
    decision = scheduler.run_session(snapshot, tasks, now=0.0, rng=rng)
    schedule_s = time.perf_counter() - t0
    placements = {p.task_id: p for p in decision.placements}

    # Apply the decision to the kernel's cluster in arrival order, measuring after every pod
    # as the paper does (only the placed pod's node changes).
    inputs = frag.FragInputs.build(target, snapshot.models)
    ok = snapshot.gpu_valid & snapshot.gpu_healthy & (snapshot.gpu_mode != SharingMode.MIG)
    use = frag.usable(inputs, snapshot.gpu_model, ok)
    cap, cpu_cap, usage = snapshot.gpu_cap_milli, snapshot.node_cpu_milli, cluster.usage
    left = np.where(ok, cap - usage.gpu_milli, 0).astype(np.int64)
    cpu_left = (cpu_cap - usage.cpu).astype(np.int64)
    node_frag = frag.stats(inputs, left, cpu_left, use).frag.copy()
    total_frag = float(node_frag.sum())
    idle = int(left.sum())
    used = capacity - idle
    n = len(tasks)
    arrived = np.zeros(n, dtype=np.int64)
    used_s = np.zeros(n, dtype=np.int64)
    frag_s = np.zeros(n, dtype=np.float64)
    idle_s = np.zeros(n, dtype=np.int64)
    placed = np.zeros(n, dtype=np.bool_)
    # The placed pod's node as the cluster holds it right after each placement, in order.
    rows: list[int] = []
    gpu_after: list[I64] = []
    cpu_after: list[int] = []
    cum = 0
    for i, task in enumerate(tasks):
        cum += task.gpu_milli_total
        p = placements.get(task.id)
        if p is not None:
            placed[i] = True
            cluster.place(p, task, 0.0)
            row = p.node_row
            for d in p.devices:
                used += d.milli
                idle -= d.milli
            rows.append(row)
            gpu_after.append(usage.gpu_milli[row].copy())
            cpu_after.append(int(usage.cpu[row]))
        arrived[i], used_s[i], idle_s[i] = cum, used, idle
    # Each placed pod's node fragment after its placement, in one batch: F_n of a row does not
    # depend on which rows are computed with it (core.frag.fragment), so these are the values
    # a per-pod computation gives; the running total is then summed in arrival order.
    after = np.zeros(0, dtype=np.float64)
    if rows:
        r = np.array(rows, dtype=np.intp)
        left_r = np.where(ok[r], cap[r] - np.array(gpu_after), 0)
        cpu_r = cpu_cap[r] - np.array(cpu_after, dtype=usage.cpu.dtype)
        after = frag.stats(inputs, left_r, cpu_r, use[r]).frag
    j = 0
    for i, was_placed in enumerate(placed.tolist()):
        if was_placed:
            row, new = rows[j], float(after[j])
            total_frag += new - node_frag[row]
            node_frag[row] = new
            j += 1
        frag_s[i] = total_frag
    return Run(
        workload=workload,
        policy=policy,
        seed=seed,
        capacity_milli=capacity,
        arrived_milli=arrived,
        used_milli=used_s,
        frag_milli=frag_s,
        idle_milli=idle_s,
        placed=placed,
        wall_s=time.perf_counter() - start,
        schedule_s=schedule_s,
    )
