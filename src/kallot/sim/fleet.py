"""LLM-serving fleet on H100/H200 nodes, placed six ways by the core (``kallot sim fleet``).

Where it sits: the sim shell. ``generate`` draws a seeded fleet of inference services;
``run_strategy`` turns each service into a Task for one sharing strategy, builds a cluster big
enough for the whole fleet in that strategy's GPU modes, places everything in one
``Scheduler.run_session`` (the same core as the live scheduler: no packer of its own) and
measures the result. ``compare`` runs all six. docs/design/005-sharing.md states the model.

Service memory = weights (parameters x bytes per parameter of the stated precision) + KV cache +
runtime overhead (CUDA context, activations, allocator slack); compute (milli-GPU) = request rate
x GPU-seconds per request at a whole GPU x 1000, rounded up, at least 10 and at most 1000.

"GPUs needed" = GPUs holding at least one service after the whole fleet is placed on a cluster
with enough nodes of each model for every strategy (one GPU per service would fit).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from kallot.config import presets
from kallot.config.scheduler import SchedulerConfiguration
from kallot.core import fit, mig, sharing_frag
from kallot.core.resources import GPU_MODELS, MILLI, Isolation, SharingMode
from kallot.core.scheduler import Scheduler
from kallot.core.snapshot import GpuSpec, NodeSpec, Snapshot, SnapshotBuilder
from kallot.core.workload import DeviceRequest, Task
from kallot.sim import kernel

GIB = 1024
H100, H200 = "H100-80GB", "H200-141GB"
GPUS_PER_NODE = 8
STRATEGIES = ("integer", "time-slicing", "mps", "mig-static", "mig-dynamic", "kallot")
TIMESLICE_REPLICAS = 4  # nvidia.com/gpu replicas per GPU in the time-slicing strategy
# kallot strategy: the sharing modes every service accepts (its isolation narrows them).
KALLOT_MODES = frozenset({SharingMode.MPS, SharingMode.MIG})


@dataclass(frozen=True, slots=True)
class ServiceClass:
    """A kind of inference service. Memory in MiB, per replica; ``gpu_s`` GPU-seconds per
    request on a whole GPU; ``rate`` (requests/s) drawn log-uniform in ``rate_range``."""

    name: str
    params_b: float  # parameters, billions
    bytes_per_param: float  # 2 = fp16/bf16, 1 = fp8
    kv_gib: float  # KV cache reserved (serving engine's budget)
    overhead_gib: float  # CUDA context, activations, allocator
    gpu_s: float
    rate_range: tuple[float, float]
    weight: float  # share of the fleet's services

    @property
    def mem_mib(self) -> int:
        weights = self.params_b * 1e9 * self.bytes_per_param / 2**20
        return math.ceil(weights + (self.kv_gib + self.overhead_gib) * GIB)


# Documented classes (sizes are the public model sizes; KV budgets are what a vLLM-style server
# would reserve for its batch). 7B fp16: 13.0 GiB weights + 8 + 2 = 23.0 GiB; 13B fp16: 24.2 +
# 12 + 2 = 38.2 GiB; 70B fp8: 65.2 + 24 + 3 = 92.2 GiB (does not fit an 80 GB H100: H200 only).
CLASSES: tuple[ServiceClass, ...] = (
    ServiceClass("embedding-335m", 0.335, 2, 0.5, 1.5, 0.004, (0.5, 20.0), 0.30),
    ServiceClass("reranker-560m", 0.56, 2, 0.5, 1.5, 0.008, (0.2, 10.0), 0.20),
    ServiceClass("llm-7b-fp16", 7.0, 2, 8.0, 2.0, 0.05, (0.05, 3.0), 0.30),
    ServiceClass("llm-13b-fp16", 13.0, 2, 12.0, 2.0, 0.09, (0.05, 2.0), 0.15),
    ServiceClass("llm-70b-fp8", 70.0, 1, 24.0, 3.0, 0.30, (0.05, 1.5), 0.05),
)

# Isolation needs: 'untrusted' = third-party tenants' models (hardware isolation), 'memory' =
# production services (a neighbour must not take their memory), 'none' = internal dev/batch.
ISOLATION_MIX: tuple[tuple[Isolation, float], ...] = (
    (Isolation.UNTRUSTED, 0.2),
    (Isolation.MEMORY, 0.5),
    (Isolation.NONE, 0.3),
)


@dataclass(frozen=True, slots=True)
class Service:
    id: str
    kind: str
    mem_mib: int
    milli: int
    isolation: Isolation
    model: str  # the GPU model it runs on: H100 when it fits 80 GB, else H200


def generate(n: int, seed: int) -> list[Service]:
    """``n`` services drawn from CLASSES and ISOLATION_MIX with ``seed``."""
    rng = np.random.default_rng(seed)
    weights = np.array([c.weight for c in CLASSES])
    kinds = rng.choice(len(CLASSES), size=n, p=weights / weights.sum())
    iso_p = np.array([p for _, p in ISOLATION_MIX])
    isos = rng.choice(len(ISOLATION_MIX), size=n, p=iso_p / iso_p.sum())
    out = []
    for i in range(n):
        c = CLASSES[int(kinds[i])]
        lo, hi = c.rate_range
        rate = float(np.exp(rng.uniform(np.log(lo), np.log(hi))))
        milli = int(min(MILLI, max(10, math.ceil(rate * c.gpu_s * MILLI))))
        mem = c.mem_mib
        model = H100 if mem <= GPU_MODELS[H100].memory_mib else H200
        out.append(
            Service(f"s{i:04d}-{c.name}", c.name, mem, milli, ISOLATION_MIX[int(isos[i])][0], model)
        )
    return out


def mig_profile_for(model: str, mem_mib: int, milli: int) -> mig.MigProfile | None:
    """The smallest profile (memory slices, then compute) of ``model`` with at least the
    memory and compute asked; '+me' profiles are never chosen (the core's rule,
    ``mig.profile_for_share``)."""
    return mig.profile_for_share(model, mem_mib, milli)


# Per strategy: how a service becomes a request, and which GPU mode serves it.
@dataclass(frozen=True, slots=True)
class Ask:
    req: DeviceRequest
    mode: SharingMode  # the pool (GPU mode) this request goes to
    dynamic: bool = False  # MIG pool: layouts change on demand
    also_mig: bool = False  # the cluster also has a dynamic MIG pool for this request


def ask(strategy: str, s: Service) -> Ask:
    models = frozenset({s.model})
    if strategy == "integer":
        return Ask(DeviceRequest(count=1, models=models), SharingMode.EXCLUSIVE)
    if strategy == "time-slicing":
        # the device plugin's replicas: one replica per pod, memory unknown to the scheduler
        return Ask(
            DeviceRequest(milli=MILLI // TIMESLICE_REPLICAS, models=models), SharingMode.TIMESLICE
        )
    if strategy == "mps":
        return Ask(DeviceRequest(milli=s.milli, mem_mib=s.mem_mib, models=models), SharingMode.MPS)
    if strategy in ("mig-static", "mig-dynamic"):
        p = mig_profile_for(s.model, s.mem_mib, s.milli)
        if strategy == "mig-static" and (p is None or p.mem_slices > 4):
            # larger than the static layout's biggest instance: the whole-GPU pool
            return Ask(DeviceRequest(count=1, models=models), SharingMode.EXCLUSIVE)
        assert p is not None
        return Ask(
            DeviceRequest(mig_profile=p.name, models=models),
            SharingMode.MIG,
            dynamic=strategy == "mig-dynamic",
        )
    # kallot: the service's share (compute + memory), its isolation and the modes it accepts;
    # the core chooses per service between an MPS share and a dynamic MIG instance
    # (core.plugins.mig_fit, fit.option_key). The cluster has both pools.
    return Ask(
        DeviceRequest(
            milli=s.milli,
            mem_mib=s.mem_mib,
            models=models,
            modes=KALLOT_MODES,
            isolation=s.isolation,
        ),
        SharingMode.MPS,
        also_mig=True,
    )


# The static MIG layout: mig-parted's 'all-balanced' (2 x 1g, 1 x 2g, 1 x 3g) on every MIG GPU.
STATIC_LAYOUT = {
    H100: (("1g.10gb", 0), ("1g.10gb", 1), ("2g.20gb", 2), ("3g.40gb", 4)),
    H200: (("1g.18gb", 0), ("1g.18gb", 1), ("2g.35gb", 2), ("3g.71gb", 4)),
}


@dataclass(slots=True)
class Result:
    strategy: str
    gpus_needed: int = 0
    gpus_by_model: dict[str, int] = field(default_factory=dict)
    placed: int = 0
    unplaced: int = 0
    memory_overcommit_events: int = 0  # GPUs whose tenants' real memory exceeds the GPU
    isolation_violations: int = 0  # services on a mechanism their isolation rules out
    memory_util: float = 0.0  # real memory of tenants / memory of GPUs in use
    compute_util: float = 0.0  # compute demand of tenants / compute of GPUs in use
    gpu_equivalents: float = 0.0  # sum of core.fit.gpu_equivalents over the placements
    reconfigurations: int = 0
    stranded: float = 0.0  # GPU-equivalents free on GPUs in use but unusable (core.sharing_frag)
    modes: dict[str, int] = field(default_factory=dict)  # services per mechanism


def _cluster(asks: list[Ask], services: list[Service]) -> SnapshotBuilder:
    b = SnapshotBuilder()
    pools: dict[tuple[str, SharingMode, bool], int] = {}
    for a, s in zip(asks, services, strict=True):
        key = (s.model, a.mode, a.dynamic)
        pools[key] = pools.get(key, 0) + 1
        if a.also_mig:
            key = (s.model, SharingMode.MIG, True)
            pools[key] = pools.get(key, 0) + 1
    for (model, mode, dynamic), count in sorted(
        pools.items(), key=lambda kv: (kv[0][0], int(kv[0][1]), kv[0][2])
    ):
        mem = GPU_MODELS[model].memory_mib
        nodes = -(-count // GPUS_PER_NODE) + 1  # one GPU per service always fits, plus a node
        for i in range(nodes):
            name = f"{model}-{mode.label}{'-dyn' if dynamic else ''}-{i}"
            gpus = []
            for j in range(GPUS_PER_NODE):
                layout = (
                    tuple((p, st, False) for p, st in STATIC_LAYOUT[model])
                    if mode is SharingMode.MIG and not dynamic
                    else ()
                )
                gpus.append(
                    GpuSpec(
                        model=model,
                        mem_mib=mem,
                        uuid=f"GPU-{name}-{j}",
                        mode=mode,
                        replicas=TIMESLICE_REPLICAS,
                        mig=layout,
                        mig_dynamic=dynamic,
                    )
                )
            b.add(
                NodeSpec(
                    name=name,
                    cpu_milli=192_000,
                    mem_mib=2 << 20,
                    gpus=gpus,
                    labels={"kallot.io/pool": f"{mode.label}"},
                )
            )
    return b


def run_strategy(
    strategy: str,
    services: list[Service],
    seed: int,
    policy: str = "kallot",
    *,
    config: SchedulerConfiguration | None = None,
) -> Result:
    """Place the fleet with one strategy and measure it (placed by ``policy``: the shipped
    file of that name, or ``config``)."""
    asks = [ask(strategy, s) for s in services]
    snap = _cluster(asks, services).build()
    tasks = [
        Task(id=s.id, cpu_milli=2000, mem_mib=8 * GIB, gpu=a.req, created=float(i))
        for i, (s, a) in enumerate(zip(services, asks, strict=True))
    ]
    fw = presets.framework(presets.document(policy, config), name=policy)
    d = Scheduler(fw, explain=False).run_session(
        snap, tasks, now=0.0, rng=np.random.default_rng(seed)
    )
    by_id = {s.id: s for s in services}
    res = Result(strategy=strategy, placed=len(d.placements), unplaced=len(d.unschedulable))
    res.reconfigurations = len(d.reconfigurations)
    mem_on: dict[tuple[int, int], int] = {}
    milli_on: dict[tuple[int, int], int] = {}
    for p in d.placements:
        s = by_id[p.task_id]
        for dev in p.devices:
            key = (p.node_row, dev.slot)
            mem_on[key] = mem_on.get(key, 0) + s.mem_mib
            milli_on[key] = milli_on.get(key, 0) + s.milli
            res.gpu_equivalents += fit.gpu_equivalents(dev, int(snap.gpu_mem_mib[key]))
            res.modes[dev.mode.label] = res.modes.get(dev.mode.label, 0) + 1
            if not s.isolation.allows(dev.mode):
                res.isolation_violations += 1
    res.gpus_needed = len(mem_on)
    total_mem = total_milli = used_mem = 0
    for (n, g), mem in mem_on.items():
        model = snap.models[int(snap.gpu_model[n, g])]
        res.gpus_by_model[model] = res.gpus_by_model.get(model, 0) + 1
        cap = int(snap.gpu_mem_mib[n, g])
        if mem > cap:
            res.memory_overcommit_events += 1
        total_mem += cap
        used_mem += min(mem, cap)
        total_milli += MILLI
    cluster = kernel.Cluster(snap)  # the fleet after the Decision, MIG layouts included
    cluster.apply(d, {t.id: t for t in tasks}, now=0.0)
    res.stranded = _stranded(cluster.snapshot(), set(mem_on))
    res.memory_util = used_mem / total_mem if total_mem else 0.0
    res.compute_util = (
        min(sum(milli_on.values()), total_milli) / total_milli if total_milli else 0.0
    )
    return res


def _stranded(after: Snapshot, in_use: set[tuple[int, int]]) -> float:
    """Sum of core.sharing_frag's fragment over the GPUs in use ``after`` the Decision (the
    kernel's cluster with it applied): share GPUs by the compute and memory the scheduler
    charged, MIG GPUs by their final layout. Exclusive GPUs strand nothing the scheduler could
    use (the rest of a whole GPU is the tenant's)."""
    layouts: dict[tuple[int, int], list[tuple[str, int]]] = {}
    m = after.mig
    for r in range(m.node.size):
        key = (int(m.node[r]), int(m.slot[r]))
        layouts.setdefault(key, []).append((m.profiles[int(m.profile[r])], int(m.start[r])))
    total = 0.0
    for n, g in sorted(in_use):
        mode = SharingMode(int(after.gpu_mode[n, g]))
        if mode is SharingMode.MIG:
            model = after.models[int(after.gpu_model[n, g])]
            total += sharing_frag.mig_fragment(model, layouts.get((n, g), []))
        elif mode in (SharingMode.MPS, SharingMode.TIMESLICE):
            left_c = 1 - int(after.gpu_used_milli[n, g]) / int(after.gpu_cap_milli[n, g])
            left_m = 1 - int(after.gpu_used_mem[n, g]) / int(after.gpu_cap_mem[n, g])
            total += float(sharing_frag.share_fragment(np.array(left_c), np.array(left_m)))
    return total


@dataclass(slots=True)
class Comparison:
    seed: int
    services: list[Service]
    results: dict[str, Result]

    def summary(self) -> dict[str, object]:
        r = self.results
        return {
            "seed": self.seed,
            "services": len(self.services),
            "gpus_needed": {k: v.gpus_needed for k, v in r.items()},
            "memory_overcommit_events": r["kallot"].memory_overcommit_events,
            "isolation_violations": r["kallot"].isolation_violations,
            "kallot_vs_integer": r["kallot"].gpus_needed / max(1, r["integer"].gpus_needed),
            "by_strategy": {
                k: {
                    "gpus_needed": v.gpus_needed,
                    "gpus_by_model": v.gpus_by_model,
                    "placed": v.placed,
                    "unplaced": v.unplaced,
                    "memory_overcommit_events": v.memory_overcommit_events,
                    "isolation_violations": v.isolation_violations,
                    "memory_util": round(v.memory_util, 4),
                    "compute_util": round(v.compute_util, 4),
                    "gpu_equivalents": round(v.gpu_equivalents, 2),
                    "mig_reconfigurations": v.reconfigurations,
                    "stranded_gpu_equivalents": round(v.stranded, 2),
                    "services_by_mechanism": v.modes,
                }
                for k, v in r.items()
            },
            "fleet": {c.name: sum(1 for s in self.services if s.kind == c.name) for c in CLASSES},
        }


def compare(
    n_services: int,
    seed: int,
    *,
    policy: str = "kallot",
    progress: Callable[[str], None] | None = None,
    config: SchedulerConfiguration | None = None,
) -> Comparison:
    services = generate(n_services, seed)
    results = {}
    for strategy in STRATEGIES:
        results[strategy] = run_strategy(strategy, services, seed, policy, config=config)
        if progress is not None:
            progress(strategy)
    return Comparison(seed=seed, services=services, results=results)
