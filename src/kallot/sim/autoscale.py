"""The fleet grows by what pending GPU work needs and shrinks by consolidation (``kallot sim
autoscale``): kallot's scale-up planner and consolidation against an integer-counting autoscaler.

Where it sits: the sim shell. ``workload`` draws pods: arrival times are a seeded thinning of the
Azure LLM inference trace 2023 (``src/kallot/data/azure-llm-2023``, conversation service, one
hour), each arrival one pod of the openb pod list (``src/kallot/data/openb``) drawn with the
seed: its CPU, memory, GPUs and milli-GPU per GPU. ``AutoscaleSim`` replays them on a fleet
that starts empty. Every ``TICK_S`` the live scheduler's core places pending pods
(``Scheduler.run_session``); pods that fit no node and have no node on the way go to the
planner (``core.provision.plan``, the one the live scheduler uses), whose nodes are ready
``PROVISION_S`` later; a node empty for ``EMPTY_S`` is removed (Karpenter's emptiness);
with consolidation on, ``core.provision.consolidate`` empties nearly empty nodes.

Model (docs/autoscaling.md, "Simulator"):

- Durations: a pod runs for a time that keeps the order of its openb lifetime (deletion -
  creation): the lifetime's quantile ``u`` maps to ``MIN_RUN_S * (MAX_RUN_S / MIN_RUN_S) ** u``.
  An evicted pod starts again from zero (consolidation costs the work done).
- Gangs: an openb pod with 8 GPUs is a training job of ``GANG_SIZE`` such pods, placed whole in
  one rack (``kallot.io/rack``) or not at all.
- Protection: a seeded ``PROTECTED`` share of the pods are model servers that must not move
  (``do_not_disrupt``); the others have ``MIN_RUNTIME_S`` before they may move.
- Policies: ``integer`` asks, like an autoscaler that counts ``nvidia.com/gpu``, one whole GPU
  per GPU a pod names (a 0.3-GPU pod holds a GPU) and plans with the same planner, so the
  difference is the counting, not the packing; ``kallot`` plans shares packed per GPU;
  ``kallot+consolidate`` adds consolidation.
- Optimum: per scale-up, the packing LP (``core.packing.ConfigLP``) gives the fewest GPUs any
  packing of the pods planned for needs; its nodes are those GPUs over the shape's GPUs, rounded
  up. ``nodes_vs_optimum`` = nodes requested / that, summed over scale-ups.
- GPU-hours: GPUs of every node from its request to its removal (provisioning counts).
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from kallot.config import presets
from kallot.config.scheduler import SchedulerConfiguration
from kallot.core.decision import Placement
from kallot.core.packing import ConfigLP
from kallot.core.provision.consolidate import ConsolidationConfig, consolidate
from kallot.core.provision.plan import Planner
from kallot.core.provision.shapes import NodeShape
from kallot.core.resources import MILLI, SharingMode
from kallot.core.scheduler import Scheduler
from kallot.core.snapshot import Allocation, Snapshot, SnapshotBuilder
from kallot.core.workload import DeviceRequest, Job, Task, TopologyConstraint, TopologyMode
from kallot.sim import serving, trace

POLICIES = ("integer", "kallot", "kallot+consolidate")
TICK_S = 15.0
PROVISION_S = 90.0  # request to Ready for a GPU node (Karpenter + cloud boot, typical)
EMPTY_S = 120.0  # an empty node is removed after this long (Karpenter consolidateAfter)
MIN_RUN_S, MAX_RUN_S = 120.0, 2400.0
GANG_SIZE = 2
PROTECTED = 0.2
MIN_RUNTIME_S = 300.0
RACK = "kallot.io/rack"
SHAPE = NodeShape(
    name="gpu8",
    cpu_milli=128_000,
    mem_mib=1 << 20,
    gpu_model="V100M32",
    gpus=8,
    labels={RACK: "pool-a"},
    max_new=64,
)
CONSOLIDATION = ConsolidationConfig(enabled=True, evictions_per_minute=4, gain_threshold=8)


@dataclass(frozen=True, slots=True)
class Pod:
    task: Task
    arrival: float
    run_s: float
    milli: int  # per GPU, as the openb pod asked
    gpus: int


MIXES = ("openb", "shares")


def workload(seed: int, pods: int, mix: str = "openb") -> tuple[list[Pod], dict[str, Job]]:
    """About ``pods`` pods over the trace's hour (module docstring), and their gangs. ``mix``
    ``openb``: every openb GPU pod; ``shares``: only those asking for part of one GPU (the
    inference-style pods GPU sharing is for)."""
    if mix not in MIXES:
        raise ValueError(f"mix: {mix!r}, expected one of {', '.join(MIXES)}")
    t, _ctx, _gen = serving.arrivals(serving.bundled(serving.TRACES["conv"]))
    rng = np.random.default_rng(seed)
    keep = np.sort(t[rng.random(t.size) < min(1.0, pods / max(1, t.size))])
    rows = [p for p in trace.read_pods(trace.bundled("openb_pod_list_default.csv")) if p.num_gpu]
    if mix == "shares":
        rows = [p for p in rows if p.gpu_milli < MILLI]
    life = np.array(
        [(p.deletion_time or 0.0) - (p.creation_time or 0.0) for p in rows], dtype=np.float64
    )
    quantile = np.argsort(np.argsort(life, kind="stable"), kind="stable") / max(1, len(rows) - 1)
    out: list[Pod] = []
    jobs: dict[str, Job] = {}
    for i, at in enumerate(keep.tolist()):
        k = int(rng.integers(len(rows)))
        row = rows[k]
        run_s = MIN_RUN_S * (MAX_RUN_S / MIN_RUN_S) ** float(quantile[k])
        protected = bool(rng.random() < PROTECTED)
        req = DeviceRequest(count=row.num_gpu, milli=row.gpu_milli, modes=_SHARE_MODES)
        gang = row.num_gpu >= 8
        members = GANG_SIZE if gang else 1
        job = f"train-{i:05d}" if gang else ""
        if gang:
            jobs[job] = Job(
                id=job,
                min_available=GANG_SIZE,
                topology=TopologyConstraint(mode=TopologyMode.REQUIRED, level=RACK),
            )
        for m in range(members):
            task = Task(
                id=f"p{i:05d}" + (f"-{m}" if gang else ""),
                cpu_milli=row.cpu_milli,
                mem_mib=row.memory_mib,
                gpu=req,
                created=at,
                job=job,
                do_not_disrupt=protected,
                min_runtime_s=MIN_RUNTIME_S,
            )
            out.append(Pod(task, at, run_s, row.gpu_milli, row.num_gpu))
    return out, jobs


_SHARE_MODES = frozenset({SharingMode.EXCLUSIVE, SharingMode.MPS})


def as_integer(task: Task) -> Task:
    """The pod as an integer-counting autoscaler sees it: whole GPUs, one per GPU named."""
    g = task.gpu
    if g is None:
        return task
    return dataclasses.replace(task, gpu=DeviceRequest(count=g.count, modes=_SHARE_MODES))


@dataclass(slots=True)
class _Node:
    name: str
    requested: float
    ready: float
    empty_since: float
    removed: float | None = None


@dataclass(slots=True)
class _Run:
    pod: Pod
    task: Task
    node: str
    devices: tuple[Placement, ...]
    started: float


@dataclass(slots=True)
class Result:
    policy: str
    pods: int = 0
    bound: int = 0
    gpu_hours: float = 0.0
    nodes_requested: int = 0
    nodes_optimum: int = 0
    peak_nodes: int = 0
    wait_s: list[float] = field(default_factory=list)
    evictions: int = 0
    protected_evictions: int = 0
    hours: float = 0.0
    planner_sessions: int = 0
    timeline: list[tuple[float, int, int]] = field(default_factory=list)  # (t, nodes, pending)

    @property
    def nodes_vs_optimum(self) -> float:
        return self.nodes_requested / max(1, self.nodes_optimum)

    @property
    def evictions_per_hour(self) -> float:
        return self.evictions / self.hours if self.hours else 0.0

    def wait_pct(self, q: float) -> float:
        return float(np.percentile(self.wait_s, q)) if self.wait_s else 0.0


def optimum_nodes(tasks: Sequence[Task], shape: NodeShape) -> int:
    """Fewest nodes of ``shape`` any packing of ``tasks``' GPU requests needs: the packing LP's
    least GPU count (the smallest ``g`` at which the LP holds every request) over the shape's
    GPUs, rounded up (CPU and memory relaxed)."""
    demand: Counter[int] = Counter()
    for t in tasks:
        if t.gpu is not None and t.gpu.count:
            demand[min(t.gpu.milli, MILLI)] += t.gpu.count
    if not demand:
        return 0
    total = float(sum(s * n for s, n in demand.items()))
    lo, hi = max(1, math.ceil(total / MILLI)), sum(demand.values())
    lp = ConfigLP(set(demand), float(hi))
    while lo < hi:  # the smallest GPU count whose LP holds everything
        mid = (lo + hi) // 2
        lp.set_row_upper(0, float(mid))
        if lp.max_allocated(dict(demand)) >= total - 1e-6:
            hi = mid
        else:
            lo = mid + 1
    return math.ceil(lo / shape.gpus)


class AutoscaleSim:
    """One policy's run over the workload (module docstring)."""

    def __init__(
        self,
        policy: str,
        pods: Sequence[Pod],
        jobs: dict[str, Job],
        seed: int,
        *,
        config: SchedulerConfiguration | None = None,
    ) -> None:
        """``config``: the scheduler's configuration document (default: the shipped
        ``kallot``), the same under every autoscaling policy."""
        if policy not in POLICIES:
            raise ValueError(f"policy: {policy!r}, expected one of {', '.join(POLICIES)}")
        self.policy = policy
        self.pods = list(pods)
        self.jobs = jobs
        self.seed = seed
        fw = presets.framework(presets.document("kallot", config), name="kallot")
        self.framework = fw
        self.scheduler = Scheduler(fw, explain=False)
        self.planner = Planner(fw, [SHAPE], seed=seed)
        self.consolidation = CONSOLIDATION if policy == "kallot+consolidate" else None
        self.nodes: dict[str, _Node] = {}
        self.running: dict[str, _Run] = {}
        self.waiting: dict[str, Pod] = {}  # pending pod id -> pod
        self.asked: dict[str, str] = {}  # pending pod id -> node planned for it
        self.since: dict[str, float] = {}  # pending pod id -> when it became pending
        self.by_id = {p.task.id: p for p in self.pods}
        self._serial = 0
        self.result = Result(policy)

    def task(self, pod: Pod) -> Task:
        return as_integer(pod.task) if self.policy == "integer" else pod.task

    def snapshot(self, now: float) -> tuple[Snapshot, list[str]]:
        names = sorted(n for n, v in self.nodes.items() if v.removed is None and v.ready <= now)
        rows = {n: i for i, n in enumerate(names)}
        specs = {n: SHAPE.node(n) for n in names}
        allocs: list[Allocation] = []
        use: dict[str, list[int]] = {n: [0, 0, 0] for n in names}
        gpu_use: dict[tuple[str, int], list[int]] = {}
        for r in self.running.values():
            u = use[r.node]
            u[0] += r.task.cpu_milli
            u[1] += r.task.mem_mib
            u[2] += 1
            devs = r.devices[0].devices
            for d in devs:
                g = gpu_use.setdefault((r.node, d.slot), [0, 0, 0])
                g[0] += d.milli
                g[1] += d.mem_mib
                g[2] += 1
            allocs.append(
                Allocation(task=r.task, node_row=rows[r.node], devices=devs, started=r.started)
            )
        b = SnapshotBuilder()
        for n in names:
            s = specs[n]
            gpus = [
                dataclasses.replace(
                    gs,
                    used_milli=gpu_use.get((n, j), [0, 0, 0])[0],
                    used_mem=gpu_use.get((n, j), [0, 0, 0])[1],
                    clients=gpu_use.get((n, j), [0, 0, 0])[2],
                )
                for j, gs in enumerate(s.gpus)
            ]
            cpu, mem, count = use[n]
            b.add(dataclasses.replace(s, gpus=gpus, cpu_used=cpu, mem_used=mem, pods_used=count))
        return b.running(allocs).build(), names

    def bind(self, p: Placement, pod: Pod, task: Task, now: float, *, moved: bool = False) -> None:
        self.running[task.id] = _Run(pod, task, p.node, (p,), now)
        if not moved:
            self.result.wait_s.append(now - self.since.pop(task.id))
        self.waiting.pop(task.id, None)
        self.asked.pop(task.id, None)
        self.nodes[p.node].empty_since = math.inf

    def step(self, now: float) -> None:
        res = self.result
        for tid in [t for t, r in self.running.items() if r.started + r.pod.run_s <= now]:
            node = self.running.pop(tid).node
            if not any(r.node == node for r in self.running.values()):
                self.nodes[node].empty_since = now
        snap, _ = self.snapshot(now)
        pending = [self.task(p) for p in self.waiting.values()]
        if pending:
            d = self.scheduler.run_session(
                snap, pending, now=now, rng=np.random.default_rng(self.seed), jobs=self.jobs
            )
            by_id = {t.id: t for t in pending}
            for p in d.placements:
                self.bind(p, self.waiting[p.task_id], by_id[p.task_id], now)
        # Pods whose node arrived and still wait: their capacity went elsewhere, ask again.
        for tid, node in list(self.asked.items()):
            if self.nodes[node].ready <= now or self.nodes[node].removed is not None:
                del self.asked[tid]
        need = [self.task(p) for tid, p in self.waiting.items() if tid not in self.asked]
        if need:
            plan = self.planner.plan(need, self.jobs)
            res.planner_sessions += plan.sessions
            planned = []
            for pn in plan.nodes:
                self._serial += 1
                name = f"{SHAPE.name}-{self._serial:04d}"
                self.nodes[name] = _Node(name, now, now + PROVISION_S, now + PROVISION_S)
                for tid in pn.tasks:
                    self.asked[tid] = name
                    planned.append(tid)
            if plan.nodes:
                res.nodes_requested += len(plan.nodes)
                # the optimum of the work itself (shares as asked), whatever the policy counts
                res.nodes_optimum += optimum_nodes([self.by_id[t].task for t in planned], SHAPE)
        if self.consolidation is not None and now % self.consolidation.interval_s < TICK_S:
            self.consolidate(now)
        for n in self.nodes.values():
            awaited = n.name in self.asked.values()
            if n.removed is None and not awaited and now - n.empty_since >= EMPTY_S:
                n.removed = now
        live = sum(1 for n in self.nodes.values() if n.removed is None)
        res.peak_nodes = max(res.peak_nodes, live)
        res.timeline.append((now, live, len(self.waiting)))

    def consolidate(self, now: float) -> None:
        cfg = self.consolidation
        assert cfg is not None
        snap, _ = self.snapshot(now)
        budget = math.floor(cfg.evictions_per_minute * cfg.interval_s / 60.0)
        pending = [self.task(p) for p in self.waiting.values()]
        moves = consolidate(
            self.framework,
            snap,
            cfg,
            now=now,
            budget=budget,
            jobs=self.jobs,
            seed=self.seed,
            pending=pending,
        )
        for m in moves:
            for e in m.evictions:
                r = self.running.pop(e.task_id)
                self.result.evictions += 1
                if r.task.do_not_disrupt or now - r.started < r.task.min_runtime_s:
                    self.result.protected_evictions += 1
            for p in m.placements:  # evicted and placed again (the work restarts), or pending
                pod = self.by_id[p.task_id]
                self.bind(p, pod, self.task(pod), now, moved=p.task_id != m.for_task)
            if not m.for_task:  # a defragmentation leaves its node in use
                self.nodes[m.node].empty_since = now

    def run(self, progress: Callable[[float], None] | None = None) -> Result:
        res = self.result
        res.pods = len(self.pods)
        arrivals = sorted(self.pods, key=lambda p: p.arrival)
        i, now = 0, 0.0
        while i < len(arrivals) or self.waiting or self.running:
            while i < len(arrivals) and arrivals[i].arrival <= now:
                pod = arrivals[i]
                self.waiting[pod.task.id] = pod
                self.since[pod.task.id] = now
                i += 1
            self.step(now)
            if progress is not None:
                progress(now)
            now += TICK_S
        for n in self.nodes.values():
            end = n.removed if n.removed is not None else now
            res.gpu_hours += SHAPE.gpus * (end - n.requested) / 3600.0
        res.hours = now / 3600.0
        res.bound = len(res.wait_s)
        return res


def compare(
    seed: int,
    pods: int,
    mix: str = "openb",
    *,
    progress: Callable[[str], None] | None = None,
    config: SchedulerConfiguration | None = None,
) -> dict[str, Result]:
    """Every policy on one workload (the scheduler as ``config`` says, default the shipped
    ``kallot``); ``progress(policy)`` after each."""
    work, jobs = workload(seed, pods, mix)
    out = {}
    for name in POLICIES:
        out[name] = AutoscaleSim(name, work, jobs, seed, config=config).run()
        if progress is not None:
            progress(name)
    return out


def summary(results: dict[str, Result], *, seed: int, mix: str) -> dict[str, object]:
    """The numbers of a comparison, for --json and BENCHMARKS.md."""
    base = results["integer"].gpu_hours
    return {
        "seed": seed,
        "mix": mix,
        "gpu_hours_vs_integer": round(results["kallot+consolidate"].gpu_hours / base, 4)
        if base
        else 0.0,
        "by_policy": {
            k: {
                "pods": r.pods,
                "bound": r.bound,
                "nodes_requested": r.nodes_requested,
                "nodes_optimum": r.nodes_optimum,
                "nodes_vs_optimum": round(r.nodes_vs_optimum, 4),
                "peak_nodes": r.peak_nodes,
                "gpu_hours": round(r.gpu_hours, 2),
                "wait_p50_s": r.wait_pct(50),
                "wait_p95_s": r.wait_pct(95),
                "wait_max_s": max(r.wait_s, default=0.0),
                "evictions": r.evictions,
                "evictions_per_hour": round(r.evictions_per_hour, 2),
                "protected_evictions": r.protected_evictions,
                "planner_sessions": r.planner_sessions,
            }
            for k, r in results.items()
        },
    }
