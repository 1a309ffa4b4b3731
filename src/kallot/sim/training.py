"""Distributed-training simulation: gangs of multi-GPU pods on a multi-rack cluster, with an
all-reduce cost model, run under a topology-aware and a topology-blind policy.

Where it sits: ``kallot sim training`` (cli.sim_training) and ``bench/training.py`` call
``compare``. The generator, cluster and cost model are documented in
docs/design/006-topology.md; every number below that is not a measurement says so. On the
simulation kernel (``sim.kernel``): job arrivals and completions are events; after each event
time one core session places what it can (gangs all-or-nothing) on the kernel's cluster, and a
placed job runs for its compute time plus the all-reduce time its placement implies.

Long module: generator, cost model and run are one experiment whose numbers
(docs/design/006-topology.md) move together; sections below keep them apart.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from kallot.config import presets
from kallot.config.scheduler import SchedulerConfiguration
from kallot.core import topology
from kallot.core.decision import Placement
from kallot.core.errors import ConfigError, KallotError
from kallot.core.framework.profile import Profile
from kallot.core.resources import GPU_MODELS
from kallot.core.scheduler import Scheduler
from kallot.core.snapshot import GpuSpec, NodeSpec, Snapshot, SnapshotBuilder
from kallot.core.workload import DeviceRequest, Job, Task, TopologyConstraint, TopologyMode
from kallot.sim import kernel

F64 = NDArray[np.float64]

BLOCK_LABEL = "kallot.io/block"
RACK_LABEL = "kallot.io/rack"
HOST_LABEL = topology.HOSTNAME_LABEL
MODEL = "H100-80GB"

# -- workload distribution (docs/design/006-topology.md, "Workload") -----------------------------
PODS = ((1, 0.40), (2, 0.18), (4, 0.16), (8, 0.12), (16, 0.08), (32, 0.04), (64, 0.02))
GPUS_PER_POD = ((1, 0.20), (2, 0.15), (4, 0.20), (8, 0.45))
MAX_JOB_GPUS = 64  # one rack of eight 8-GPU nodes; larger draws are redrawn
# Gradient bytes per step (bf16, 2 bytes per parameter) for 350M / 1.3B / 7B-parameter models.
GRADIENT_GB = ((0.7, 0.4), (2.6, 0.4), (14.0, 0.2))
STEP_COMPUTE_S = 1.0  # compute per step; all-reduce is added without overlap (an upper bound)
RUNTIME_MEDIAN_S = 3600.0  # compute time per job: lognormal, median one hour
RUNTIME_SIGMA = 1.0
RUNTIME_RANGE_S = (600.0, 8 * 3600.0)
ARRIVE, FINISH = "arrive", "finish"  # the simulation's events (kernel.Clock), per job


@dataclass(frozen=True, slots=True, kw_only=True)
class Fabric:
    """Per-GPU, per-direction bandwidth between nodes (GB/s), by the widest level spanned.

    Same rack: the GPU's share of its node's NICs through a non-blocking leaf switch (DGX H100:
    one 400 Gb/s ConnectX-7 per GPU = 50 GB/s). Across racks: the same divided by the spine's
    oversubscription, across blocks by the core's (both assumptions: 2:1 and 4:1 are common
    Clos designs, not measurements).
    """

    rack_oversubscription: float = 2.0
    block_oversubscription: float = 4.0
    # Share of a step's compute the all-reduce can hide behind (0: none, the default and an upper
    # bound on communication's cost; 1: all of it, as bucketed data-parallel backward passes at
    # best). Not a fabric property, but the other knob of the same cost model.
    overlap: float = 0.0

    def __post_init__(self) -> None:
        for name in ("rack_oversubscription", "block_oversubscription"):
            if getattr(self, name) < 1.0:
                raise ConfigError(f"fabric.{name}", getattr(self, name), "a ratio >= 1")
        if not 0.0 <= self.overlap <= 1.0:
            raise ConfigError("fabric.overlap", self.overlap, "a share in [0, 1]")

    def factor(self, racks: int, blocks: int) -> float:
        if blocks > 1:
            return 1.0 / self.block_oversubscription
        if racks > 1:
            return 1.0 / self.rack_oversubscription
        return 1.0


# -- cluster ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClusterNode:
    name: str
    block: str
    rack: str
    topo: topology.NodeTopology
    islands: tuple[int, ...] = ()  # NVLink island per GPU (from topo when left empty)

    def __post_init__(self) -> None:
        if not self.islands:
            object.__setattr__(self, "islands", tuple(int(i) for i in self.topo.islands()))


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterSpec:
    """``racks`` racks of ``nodes_per_rack`` nodes in blocks of ``racks_per_block``. Rack kinds
    cycle through ``kinds`` (preset names), so the default mixes HGX racks with a PCIe and a
    NVLink-pair rack."""

    racks: int = 6
    nodes_per_rack: int = 8
    racks_per_block: int = 3
    kinds: tuple[str, ...] = (
        "hgx-8-nvswitch",
        "hgx-8-nvswitch",
        "pcie-8-2numa",
        "hgx-8-nvswitch",
        "hgx-8-nvswitch",
        "nvlink-pairs-4",
    )

    def __post_init__(self) -> None:
        for name in ("racks", "nodes_per_rack", "racks_per_block"):
            value = getattr(self, name)
            if value < 1:
                raise ConfigError(f"cluster.{name}", value, "an integer >= 1")
        for kind in self.kinds:
            if kind not in topology.PRESETS:
                raise ConfigError("cluster.kinds", kind, f"one of {sorted(topology.PRESETS)}")
        if not self.kinds:
            raise ConfigError("cluster.kinds", self.kinds, "at least one preset name")

    def nodes(self) -> list[ClusterNode]:
        out = []
        for r in range(self.racks):
            kind = self.kinds[r % len(self.kinds)]
            block = f"b{r // self.racks_per_block}"
            for i in range(self.nodes_per_rack):
                out.append(ClusterNode(f"r{r}-n{i}", block, f"r{r}", topology.preset(kind)))
        return out


def node_spec(node: ClusterNode) -> NodeSpec:
    """The node with every GPU free (the kernel's cluster charges what runs on it)."""
    mem = GPU_MODELS[MODEL].memory_mib
    islands = node.islands
    gpus = [
        GpuSpec(
            model=MODEL,
            mem_mib=mem,
            uuid=f"GPU-{node.name}-{g}",
            numa=node.topo.numa[g],
            island=islands[g],
        )
        for g in range(node.topo.gpus)
    ]
    return NodeSpec(
        name=node.name,
        cpu_milli=256_000,
        mem_mib=2 * 1024 * 1024,
        gpus=gpus,
        labels={BLOCK_LABEL: node.block, RACK_LABEL: node.rack, HOST_LABEL: node.name},
        link=node.topo.link.tolist(),
    )


# -- workload --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TrainingJob:
    """One generated job: ``pods`` pods of ``gpus`` whole GPUs, arriving at ``arrival``."""

    id: str
    pods: int
    gpus: int
    arrival: float
    compute_s: float
    gradient_gb: float

    @property
    def total_gpus(self) -> int:
        return self.pods * self.gpus

    def tasks(self) -> list[Task]:
        req = DeviceRequest(
            count=self.gpus,
            topology=TopologyConstraint(mode=TopologyMode.PREFERRED, level="nvlink"),
        )
        return [
            Task(
                id=f"{self.id}-{i}",
                cpu_milli=4000 * self.gpus,
                mem_mib=32 * 1024 * self.gpus,
                gpu=req,
                created=self.arrival,
                job=self.id,
            )
            for i in range(self.pods)
        ]

    def job(self, mode: TopologyMode = TopologyMode.PREFERRED) -> Job:
        # By default training operators ask for one rack when they can get it, anywhere when
        # they cannot (``preferred``); ``required`` makes the gang wait for a rack.
        return Job(
            id=self.id,
            min_available=self.pods,
            topology=TopologyConstraint(mode=mode, level="rack"),
        )


def _draw(rng: np.random.Generator, table: Sequence[tuple[float, float]]) -> float:
    values = [v for v, _ in table]
    probs = np.array([p for _, p in table])
    return float(values[int(rng.choice(len(values), p=probs / probs.sum()))])


def generate(
    n_jobs: int,
    capacity_gpus: int,
    *,
    seed: int,
    load: float = 0.9,
    max_job_gpus: int = MAX_JOB_GPUS,
) -> list[TrainingJob]:
    """``n_jobs`` jobs, Poisson arrivals at a rate that offers ``load`` times the cluster's
    GPU-seconds (at ideal placement, comm excluded). Draws larger than ``max_job_gpus`` or the
    cluster are redrawn."""
    if n_jobs < 1:
        raise ConfigError("jobs", n_jobs, "an integer >= 1")
    if not 0.0 < load <= 10.0:
        raise ConfigError("load", load, "a number in (0, 10]")
    rng = np.random.default_rng(seed)
    largest = min(max_job_gpus, capacity_gpus)
    shapes: list[tuple[int, int, float, float]] = []
    while len(shapes) < n_jobs:
        pods, gpus = int(_draw(rng, PODS)), int(_draw(rng, GPUS_PER_POD))
        if pods * gpus > largest:
            continue
        runtime = float(
            np.clip(
                rng.lognormal(math.log(RUNTIME_MEDIAN_S), RUNTIME_SIGMA),
                *RUNTIME_RANGE_S,
            )
        )
        shapes.append((pods, gpus, runtime, _draw(rng, GRADIENT_GB)))
    mean_gpu_s = float(np.mean([p * g * r for p, g, r, _ in shapes]))
    rate = load * capacity_gpus / mean_gpu_s  # jobs per second
    gaps = rng.exponential(1.0 / rate, size=n_jobs)
    arrivals = np.cumsum(gaps) - gaps[0]
    return [
        TrainingJob(f"job{i:04d}", p, g, float(arrivals[i]), r, s)
        for i, (p, g, r, s) in enumerate(shapes)
    ]


# -- cost model ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PlacementCost:
    """Where a job's GPUs ended up and what its all-reduce costs per step."""

    nodes: int
    racks: int
    blocks: int
    one_island: bool
    bottleneck_gbps: float
    allreduce_s: float


def allreduce_cost(
    job: TrainingJob,
    placements: Sequence[Placement],
    cluster: Sequence[ClusterNode],
    *,
    bandwidths: topology.Bandwidths = topology.DEFAULT_BANDWIDTHS,
    fabric: Fabric = Fabric(),
) -> PlacementCost:
    """Ring all-reduce time per step: ``2 (k-1)/k * S / B`` for ``k`` GPUs and ``S`` gradient
    bytes (nccl-tests' bus-bandwidth relation), where ``B`` is the slowest link of the ring: the
    slowest pair inside any node (link matrix), and between nodes the smallest per-GPU NIC share
    scaled by the fabric factor of the widest level spanned."""
    k = job.total_gpus
    by_node: dict[int, list[int]] = {}
    for p in placements:
        by_node.setdefault(p.node_row, []).extend(d.slot for d in p.devices)
    nodes = sorted(by_node)
    racks = len({cluster[n].rack for n in nodes})
    blocks = len({cluster[n].block for n in nodes})
    bottleneck = math.inf
    one_island = len(nodes) == 1
    for n in nodes:
        topo, slots, islands = cluster[n].topo, by_node[n], cluster[n].islands
        one_island = one_island and len({int(islands[s]) for s in slots}) == 1
        for a, b in itertools.combinations(slots, 2):
            bottleneck = min(bottleneck, bandwidths.of(int(topo.link[a, b])))
        if len(nodes) > 1:
            share = topo.nic_share_gbps()
            bottleneck = min(
                bottleneck, min(float(share[s]) for s in slots) * fabric.factor(racks, blocks)
            )
    if k < 2 or not math.isfinite(bottleneck):
        return PlacementCost(len(nodes), racks, blocks, True, math.inf, 0.0)
    seconds = 2.0 * (k - 1) / k * job.gradient_gb / bottleneck
    return PlacementCost(len(nodes), racks, blocks, one_island, bottleneck, seconds)


def job_runtime(job: TrainingJob, cost: PlacementCost, overlap: float = 0.0) -> float:
    """Compute time plus, per step of ``STEP_COMPUTE_S``, the part of one all-reduce that does
    not hide behind ``overlap`` of the step's compute: ``max(0, t_allreduce - overlap * step)``."""
    steps = job.compute_s / STEP_COMPUTE_S
    exposed = max(0.0, cost.allreduce_s - overlap * STEP_COMPUTE_S)
    return job.compute_s + steps * exposed


# -- simulation ------------------------------------------------------------------------------------


@dataclass(slots=True)
class JobResult:
    job: TrainingJob
    start: float
    end: float
    cost: PlacementCost


@dataclass(slots=True)
class PolicyRun:
    """One policy over the whole workload."""

    policy: str
    results: dict[str, JobResult] = field(default_factory=dict)
    sessions: int = 0
    partial_gangs: int = 0  # gangs left with 0 < placed < min_available after a session
    stranded_gpu_s: float = 0.0  # idle GPU-seconds while some job waited
    busy_gpu_s: float = 0.0
    makespan: float = 0.0
    schedule_s: float = 0.0  # wall time inside run_session


ProgressFn = Callable[[int], None]


def simulate(
    policy: str,
    jobs: Sequence[TrainingJob],
    cluster: Sequence[ClusterNode],
    *,
    seed: int,
    progress: ProgressFn | None = None,
    fabric: Fabric = Fabric(),
    locality: float | None = None,
    gang_mode: TopologyMode = TopologyMode.PREFERRED,
    config: SchedulerConfiguration | None = None,
) -> PolicyRun:
    """Run every job to completion under ``policy`` (the shipped file of that name, or
    ``config``); ``progress(1)`` after each finished job. ``locality`` overrides the Topology
    plugin's weight of topology against fragmentation; ``gang_mode`` is how hard each gang's
    one-rack constraint is."""

    def with_locality(profile: Profile) -> Profile:
        if locality is None or "Topology" not in profile.plugin_names():
            return profile
        args = {
            **profile.args,
            "Topology": {**profile.args.get("Topology", {}), "locality": locality},
        }
        return dataclasses.replace(profile, args=args)

    framework = presets.framework(
        presets.document(policy, config), name=policy, adjust=with_locality
    )
    scheduler = Scheduler(framework, explain=False)
    rng = np.random.default_rng(seed)
    sim = kernel.Cluster(_base(cluster), show_running=False)
    capacity = sum(c.topo.gpus for c in cluster)
    by_id = {j.id: j for j in jobs}
    clock: kernel.Clock[tuple[str, str]] = kernel.Clock()
    for j in jobs:
        clock.push(j.arrival, (ARRIVE, j.id))
    pending: dict[str, TrainingJob] = {}
    running: dict[str, list[Placement]] = {}
    out = PolicyRun(policy)
    now = 0.0
    while clock:
        t = clock.next_time()
        if pending:
            idle = capacity - int((sim.usage.gpu_clients > 0).sum())
            out.stranded_gpu_s += idle * (t - now)
        now = t
        for kind, job_id in clock.batch():
            if kind == ARRIVE:
                pending[job_id] = by_id[job_id]
            else:
                for p in running.pop(job_id):
                    sim.release(p.task_id)
                if progress is not None:
                    progress(1)
        if not pending:
            continue
        tasks = {task.id: task for j in pending.values() for task in j.tasks()}
        t0 = time.perf_counter()
        decision = scheduler.run_session(
            sim.snapshot(),
            list(tasks.values()),
            now=now,
            rng=rng,
            jobs={j.id: j.job(gang_mode) for j in pending.values()},
        )
        out.schedule_s += time.perf_counter() - t0
        out.sessions += 1
        placed: dict[str, list[Placement]] = {}
        for p in decision.placements:
            placed.setdefault(p.task_id.rsplit("-", 1)[0], []).append(p)
        for job_id, ps in placed.items():
            job = pending[job_id]
            if len(ps) != job.pods:
                out.partial_gangs += 1
                continue  # never expected; counted, and the job is left pending
            del pending[job_id]
            cost = allreduce_cost(job, ps, cluster, fabric=fabric)
            end = now + job_runtime(job, cost, fabric.overlap)
            out.results[job_id] = JobResult(job, now, end, cost)
            out.busy_gpu_s += job.total_gpus * (end - now)
            running[job_id] = ps
            for p in ps:
                for d in p.devices:
                    if sim.usage.gpu_clients[p.node_row, d.slot]:
                        raise AssertionError(f"GPU {p.node}/{d.slot} given twice")
                sim.place(p, tasks[p.task_id], now)
            clock.push(end, (FINISH, job_id))
    out.makespan = now
    if pending:
        raise KallotError(
            f"{len(pending)} jobs never fit the cluster under {policy}: {sorted(pending)[:5]}"
        )
    return out


def _base(cluster: Sequence[ClusterNode]) -> Snapshot:
    return SnapshotBuilder().extend(node_spec(c) for c in cluster).build()


# -- comparison ------------------------------------------------------------------------------------

BLIND_POLICY = "kallot"  # FGD-style packing, all-or-nothing gangs, no topology
AWARE_POLICY = "topology"


@dataclass(slots=True)
class Comparison:
    seed: int
    jobs: list[TrainingJob]
    cluster: list[ClusterNode]
    blind: PolicyRun
    aware: PolicyRun
    wall_s: float

    def _pct(self, run: PolicyRun, pick: Callable[[JobResult], bool | None]) -> float:
        flags = [f for r in run.results.values() if (f := pick(r)) is not None]
        return 100.0 * sum(flags) / len(flags) if flags else float("nan")

    def island_pct(self, run: PolicyRun) -> float:
        """Jobs of 2..8 GPUs (what one NVLink island can hold) that got one island."""
        return self._pct(run, lambda r: r.cost.one_island if 2 <= r.job.total_gpus <= 8 else None)

    def rack_pct(self, run: PolicyRun) -> float:
        """Multi-node-capable jobs (more than one pod) that got one rack."""
        return self._pct(run, lambda r: r.cost.racks == 1 if r.job.pods > 1 else None)

    def mean_runtime(self, run: PolicyRun) -> float:
        return float(np.mean([r.end - r.start for r in run.results.values()]))

    def mean_jct(self, run: PolicyRun) -> float:
        return float(np.mean([r.end - r.job.arrival for r in run.results.values()]))

    def stranded_pct(self, run: PolicyRun) -> float:
        capacity = sum(c.topo.gpus for c in self.cluster)
        return 100.0 * run.stranded_gpu_s / (capacity * run.makespan) if run.makespan else 0.0

    def summary(self) -> dict[str, object]:
        b, a = self.blind, self.aware
        gangs = sum(1 for j in self.jobs if j.pods > 1)
        return {
            "gangs": gangs,
            "jobs": len(self.jobs),
            "gpus": sum(c.topo.gpus for c in self.cluster),
            "nodes": len(self.cluster),
            "in_one_island_pct": {"blind": self.island_pct(b), "kallot": self.island_pct(a)},
            "in_one_rack_pct": {"blind": self.rack_pct(b), "kallot": self.rack_pct(a)},
            "est_job_time_ratio": self.mean_runtime(a) / self.mean_runtime(b),
            "mean_job_time_s": {"blind": self.mean_runtime(b), "kallot": self.mean_runtime(a)},
            "mean_completion_s": {"blind": self.mean_jct(b), "kallot": self.mean_jct(a)},
            "makespan_ratio": a.makespan / b.makespan,
            "gpu_hours": {"blind": b.busy_gpu_s / 3600, "kallot": a.busy_gpu_s / 3600},
            "stranded_gpu_pct": {"blind": self.stranded_pct(b), "kallot": self.stranded_pct(a)},
            "partial_gangs_after_session": a.partial_gangs + b.partial_gangs,
            "sessions": {"blind": b.sessions, "kallot": a.sessions},
            "schedule_s": {"blind": b.schedule_s, "kallot": a.schedule_s},
            "policies": {"blind": b.policy, "kallot": a.policy},
            "seed": self.seed,
        }


def compare(
    *,
    n_jobs: int = 300,
    seed: int = 0,
    spec: ClusterSpec = ClusterSpec(),
    load: float = 0.9,
    locality: float | None = None,
    fabric: Fabric = Fabric(),
    gang_mode: TopologyMode = TopologyMode.PREFERRED,
    progress: ProgressFn | None = None,
    config: SchedulerConfiguration | None = None,
) -> Comparison:
    """The topology-blind and the topology-aware policy on the same generated workload.

    ``gang_mode`` applies to kallot; the blind policy ignores topology (its jobs carry the
    ``preferred`` constraint, which a topology-blind profile does not read). ``config``: the
    topology-aware side's configuration document instead of the shipped ``topology`` file."""
    start = time.perf_counter()
    cluster = spec.nodes()
    capacity = sum(c.topo.gpus for c in cluster)
    largest = MAX_JOB_GPUS
    if gang_mode is TopologyMode.REQUIRED:  # a gang that needs one rack must fit in one
        racks: dict[str, int] = {}
        for c in cluster:
            racks[c.rack] = racks.get(c.rack, 0) + c.topo.gpus
        largest = min(largest, max(racks.values()))
    jobs = generate(n_jobs, capacity, seed=seed, load=load, max_job_gpus=largest)
    blind = simulate(BLIND_POLICY, jobs, cluster, seed=seed, progress=progress, fabric=fabric)
    aware = simulate(
        AWARE_POLICY,
        jobs,
        cluster,
        seed=seed,
        progress=progress,
        locality=locality,
        fabric=fabric,
        gang_mode=gang_mode,
        config=config,
    )
    return Comparison(seed, jobs, cluster, blind, aware, time.perf_counter() - start)
