"""LLM serving with scale-to-zero: real request arrivals, autoscaled replicas placed by the core,
cold starts from a stated load-time model (``kallot sim serving``).

Where it sits: the sim shell. ``arrivals`` reads the bundled Azure LLM inference trace 2023
(``src/kallot/data/azure-llm-2023``); ``workload`` builds the services of one seed from it;
``ServingSim`` replays them on the simulation kernel (``sim.kernel``: its clock orders the
requests, completions, autoscaler ticks and pre-warm copies; its cluster holds the replicas'
GPUs): every replica the autoscaler adds is placed by ``Scheduler.run_session`` (the live
scheduler's core) on a snapshot of the cluster that carries each node's model cache;
``compare`` runs the three policies:

- ``blind``: the kallot profile without the ModelCache plugin (placement ignores caches);
- ``cache_aware``: the kallot profile (ModelCache scores seconds saved, core.plugins.model_cache);
- ``prewarm``: cache_aware, plus a pre-warm policy that keeps each recently active service's
  weights in host memory on as many nodes as its recent peak of replicas, chosen among the nodes
  with room for a replica; and keep-warm: a service's last replica is not scaled to zero while
  its predicted arrival rate (past arrivals only) x cold-start seconds pays for its GPUs, within
  a budget of KEEP_WARM_BUDGET x the GPU-seconds the autoscaler asked for so far.

Model (docs/serving.md states it in full):

- Services: each is a seeded thinning (``share``) of one of the two traces, circularly shifted by
  a seeded offset; model sizes are the public sizes of the named model class in bf16.
- Requests: a replica serves ``slots`` requests at once; a request takes ``prefill`` seconds
  (context tokens) then ``tpot`` per generated token. Time to first token (TTFT) = wait for a
  slot (a ready replica; from zero replicas, the wait includes the load) + prefill.
- Autoscaler (Knative-like): from zero, the first request starts a replica; every ``TICK_S``,
  when requests queue, replicas are added up to ``ceil(concurrency / (TARGET_UTIL * slots))``
  (concurrency = requests in flight or queued, averaged over ``STABLE_WINDOW_S``; at most
  ``MAX_REPLICAS``); a replica idle for ``IDLE_S`` is removed, the last one too (scale to
  zero). Requests go to the busiest ready replica with a free slot, so spare replicas drain.
- Start: the cluster was serving before the hour: every service starts with the replicas its
  concurrency over the first ``WARM_START_S`` asks for, placed by the policy and ready at time 0
  (not counted as starts).
- Load time: ``core.models.LoadModel`` (start-up + size / bandwidth of the fastest tier holding
  the weights on the node: host memory, the node's disk at its own read bandwidth, or remote).
  A load leaves the weights on the node's disk and in its host memory, both LRU caches of fixed
  size. Nodes start with a seeded random set of models on disk (the same for every policy).
- Pre-warm copies run in the background at the remote (or disk) bandwidth and use no GPU.
- GPU-hours: GPUs held by serving replicas, from placement (loading included) to removal.

Long module: the autoscaler, the model caches, pre-warm and keep-warm act on one event stream
and one replica state (``ServingSim``); split apart they would hand that state back and forth.
"""

from __future__ import annotations

import csv
import dataclasses
import math
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from importlib import resources
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from kallot.config import presets
from kallot.config.scheduler import SchedulerConfiguration
from kallot.core import frag
from kallot.core.errors import ConfigError
from kallot.core.framework.profile import Profile
from kallot.core.models import DEFAULT_LOAD_MODEL, GB, LoadModel, ModelCache, ModelRef, Tier
from kallot.core.scheduler import Scheduler
from kallot.core.snapshot import GpuSpec, NodeSpec, Snapshot, SnapshotBuilder
from kallot.core.workload import DeviceRequest, Task
from kallot.sim import kernel

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]

POLICIES = ("blind", "cache_aware", "prewarm")
TRACES = {"code": "AzureLLMInferenceTrace_code.csv", "conv": "AzureLLMInferenceTrace_conv.csv"}

# Cluster: nodes of 8 H100s; a seeded background of other GPU work holds some GPUs for the
# whole run (training and batch pods), so placement has to choose among partly used nodes.
NODES = 8
GPUS_PER_NODE = 8
GPU_MODEL, GPU_MEM_MIB = "H100-80GB", 81920
NODE_CPU_MILLI, NODE_MEM_MIB = 192_000, 2_000_000
BACKGROUND_GPUS = (0, 4)  # per node, drawn uniformly in this range (inclusive)
DISK_CACHE_BYTES = 400 * GB  # model cache on each node's local NVMe
MEMORY_CACHE_BYTES = 200 * GB  # host memory (page cache or pinned copies) kept for weights
NODE_READ_BYTES_PER_S = (1.0 * GB, 1.5 * GB, 2.0 * GB, 3.0 * GB)  # measured disk bandwidths
DISK_PRELOAD = 0.3  # chance a node starts with a given model on disk (history before the run)

TICK_S = 2.0
IDLE_S = 120.0  # scale-down (and to zero) after this long without a request in flight
TARGET_UTIL = 0.7
STABLE_WINDOW_S = 60.0  # the autoscaler averages concurrency (in flight + queued) over this
MAX_REPLICAS = 4  # per service
WARM_START_S = 300.0  # initial replicas: as many as the first 5 minutes' concurrency asks for
PREWARM_EVERY_S = 60.0
PREWARM_WINDOW_S = 900.0  # arrival history the pre-warm policy looks at
# Keep-warm (prewarm only): the last replica of a service is not scaled to zero while its
# predicted arrival rate (past PREWARM_WINDOW_S) x its cold-start seconds >= KEEP_WARM_THRESHOLD
# x its GPUs (request-seconds of waiting avoided per GPU-second kept), and while the GPU-seconds
# kept so far stay <= KEEP_WARM_BUDGET x the GPU-seconds the autoscaler itself asked for so far.
KEEP_WARM_THRESHOLD = 1.0
KEEP_WARM_BUDGET = 0.10
CPU_PER_GPU, MEM_MIB_PER_GPU = 8000, 65536


@dataclass(frozen=True, slots=True)
class ServiceClass:
    """A model class: weights (bytes), tensor-parallel GPUs, batch slots, prefill seconds per
    1,000 context tokens and seconds per generated token (at that batch size)."""

    name: str
    size_bytes: int
    gpus: int
    slots: int
    prefill_s_per_k: float
    tpot_s: float


CLASSES = {
    "7b": ServiceClass("7b", int(14.5 * GB), 1, 64, 0.05, 0.020),
    "13b": ServiceClass("13b", 26 * GB, 1, 48, 0.09, 0.025),
    "34b": ServiceClass("34b", 68 * GB, 2, 32, 0.15, 0.035),
    "70b": ServiceClass("70b", 140 * GB, 4, 24, 0.25, 0.045),
}

# (service, trace, class, share of the trace's requests): a Zipf-like spread of popularity, so
# some services stay busy and the tail idles and scales to zero between bursts.
SERVICES: tuple[tuple[str, str, str, float], ...] = (
    ("chat-70b", "conv", "70b", 0.20),
    ("chat-13b", "conv", "13b", 0.10),
    ("chat-7b", "conv", "7b", 0.04),
    ("assist-34b", "conv", "34b", 0.015),
    ("tutor-13b", "conv", "13b", 0.006),
    ("legal-70b", "conv", "70b", 0.003),
    ("code-34b", "code", "34b", 0.25),
    ("code-7b", "code", "7b", 0.08),
    ("sql-13b", "code", "13b", 0.02),
    ("review-34b", "code", "34b", 0.006),
)


@dataclass(frozen=True, slots=True)
class Service:
    name: str
    cls: ServiceClass
    model: ModelRef
    t: F64  # arrival times, seconds from the start of the hour, sorted
    ctx: I64
    gen: I64


def bundled(name: str) -> Path:
    """Path of a bundled trace file (src/kallot/data/azure-llm-2023)."""
    return Path(str(resources.files("kallot").joinpath("data", "azure-llm-2023", name)))


def arrivals(path: Path) -> tuple[F64, I64, I64]:
    """(seconds from the first request, context tokens, generated tokens) of one trace file."""
    times: list[float] = []
    ctx: list[int] = []
    gen: list[int] = []
    with path.open(newline="") as f:
        for i, row in enumerate(csv.DictReader(f), start=2):
            try:
                stamp = row["TIMESTAMP"]
                # seven fractional digits: datetime takes six
                times.append(datetime.fromisoformat(stamp[:26]).timestamp())
                ctx.append(int(row["ContextTokens"]))
                gen.append(int(row["GeneratedTokens"]))
            except (KeyError, ValueError) as exc:
                raise ConfigError(
                    f"{path.name} line {i}", dict(row), f"a trace row ({exc})"
                ) from None
    t = np.asarray(times, dtype=np.float64)
    order = np.argsort(t, kind="stable")
    t = t[order] - t[order][0] if t.size else t
    return t, np.asarray(ctx, np.int64)[order], np.asarray(gen, np.int64)[order]


def workload(seed: int, traces: dict[str, tuple[F64, I64, I64]] | None = None) -> list[Service]:
    """The services of one seed: a thinning of their trace, shifted by a seeded offset."""
    if traces is None:
        traces = {k: arrivals(bundled(v)) for k, v in TRACES.items()}
    rng = np.random.default_rng(seed)
    out = []
    for name, trace, cls_name, share in SERVICES:
        t, ctx, gen = traces[trace]
        span = float(t[-1]) + 1.0
        keep = rng.random(t.size) < share
        shifted = (t[keep] + rng.uniform(0, span)) % span
        order = np.argsort(shifted, kind="stable")
        cls = CLASSES[cls_name]
        model = ModelRef(f"kallot-sim/{name}", "r1", cls.size_bytes)
        out.append(Service(name, cls, model, shifted[order], ctx[keep][order], gen[keep][order]))
    return out


class _Lru:
    """Model keys -> bytes, least recently used first, with a byte budget; pinned keys stay."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.items: OrderedDict[str, int] = OrderedDict()
        self.pinned: set[str] = set()

    def __contains__(self, key: str) -> bool:
        return key in self.items

    def touch(self, key: str, size: int) -> bool:
        """Hold ``key`` (most recent), evicting unpinned LRU entries; False if it cannot fit."""
        if key in self.items:
            self.items.move_to_end(key)
            return True
        if size > self.capacity:
            return False
        used = sum(self.items.values())
        for old in list(self.items):
            if used + size <= self.capacity:
                break
            if old not in self.pinned:
                used -= self.items.pop(old)
        if used + size > self.capacity:
            return False
        self.items[key] = size
        return True


@dataclass(slots=True)
class _Node:
    name: str
    background: int  # GPUs held by other work for the whole run (the first ones)
    read_bps: float
    disk: _Lru
    memory: _Lru

    memo: tuple[tuple[str, ...], tuple[str, ...], ModelCache] | None = None

    def cache(self) -> ModelCache:
        disk, memory = tuple(self.disk.items), tuple(self.memory.items)
        if self.memo is None or self.memo[:2] != (disk, memory):
            self.memo = (disk, memory, ModelCache.of(disk, memory, self.read_bps))
        return self.memo[2]

    def tier(self, model: ModelRef) -> Tier:
        if model.key in self.memory:
            return Tier.MEMORY
        return Tier.DISK if model.key in self.disk else Tier.REMOTE


@dataclass(slots=True)
class _Replica:
    id: str
    service: int
    node: int
    gpus: tuple[int, ...]
    placed: float
    ready: float
    in_flight: int = 0
    idle_since: float = 0.0


@dataclass(slots=True)
class _ServiceState:
    queue: deque[int] = field(default_factory=deque)
    replicas: list[_Replica] = field(default_factory=list)
    pending: int = 0  # replicas asked for but not placed yet
    peaks: deque[tuple[float, int]] = field(default_factory=deque)  # (time, replicas)
    load: deque[tuple[float, int]] = field(default_factory=deque)  # (time, in flight + queued)
    last_arrival: float = -math.inf
    next_id: int = 0
    recent: deque[float] = field(default_factory=deque)  # arrival times, past PREWARM_WINDOW_S


@dataclass(slots=True)
class PolicyResult:
    """What one policy did over the run."""

    policy: str
    ttft: F64  # per request, seconds
    arrival: F64  # per request, seconds
    starts: dict[str, int]  # replica starts by tier the weights came from
    gpu_seconds: float
    unplaced_tries: int
    timeline_t: F64  # bin starts, seconds
    timeline_gpus: F64  # GPUs held by serving replicas, mean per bin
    prewarm_copies: int = 0
    start_log: list[tuple[float, str]] = field(default_factory=list)  # (time, tier) per start
    kept_gpu_seconds: float = 0.0  # GPU-seconds of replicas kept warm instead of scaled down
    keep_log: list[tuple[float, int]] = field(default_factory=list)  # (time, service) per keep

    @property
    def cold_starts(self) -> int:
        """Replica starts that found the weights nowhere on the node (pulled from remote)."""
        return self.starts.get("remote", 0)

    @property
    def gpu_hours(self) -> float:
        return self.gpu_seconds / 3600.0

    def ttft_p(self, q: float) -> float:
        return float(np.percentile(self.ttft, q)) if self.ttft.size else 0.0


def _without_model_cache(profile: Profile) -> Profile:
    """The ``blind`` policy: the same profile without the ModelCache score."""
    return dataclasses.replace(
        profile, score=tuple(s for s in profile.score if s[0] != "ModelCache")
    )


class ServingSim:
    """One policy's run over one seed's services (module docstring)."""

    def __init__(
        self,
        services: list[Service],
        policy: str,
        seed: int,
        *,
        load: LoadModel = DEFAULT_LOAD_MODEL,
        nodes: int = NODES,
        memory_cache_bytes: int = MEMORY_CACHE_BYTES,
        disk_preload: float = DISK_PRELOAD,
        keep_threshold: float = KEEP_WARM_THRESHOLD,
        keep_budget: float = KEEP_WARM_BUDGET,
        config: SchedulerConfiguration | None = None,
    ) -> None:
        """``config``: the scheduler's configuration document (default: the shipped
        ``kallot``); every policy places with it, ``blind`` without its ModelCache score."""
        if policy not in POLICIES:
            raise ConfigError("policy", policy, f"one of {', '.join(POLICIES)}")
        self.services = services
        self.policy = policy
        self.load = load
        if not keep_threshold >= 0:
            raise ConfigError("keep_threshold", keep_threshold, "a number >= 0")
        if not keep_budget >= 0:
            raise ConfigError("keep_budget", keep_budget, "a number >= 0")
        self.keep_threshold = keep_threshold
        self.keep_budget = keep_budget
        self.kept_seconds = 0.0
        self.keep_log: list[tuple[float, int]] = []
        rng = np.random.default_rng(seed + 1_000_003)  # cluster draws: the same for every policy
        self.nodes: list[_Node] = []
        for i in range(nodes):
            node = _Node(
                f"node-{i:02d}",
                int(rng.integers(BACKGROUND_GPUS[0], BACKGROUND_GPUS[1] + 1)),
                float(rng.choice(NODE_READ_BYTES_PER_S)),
                _Lru(DISK_CACHE_BYTES),
                _Lru(memory_cache_bytes),
            )
            for s in services:
                if rng.random() < disk_preload:
                    node.disk.touch(s.model.key, s.model.size_bytes)
            self.nodes.append(node)
        shapes = [(frag.Shape(CPU_PER_GPU * s.cls.gpus, 1000, s.cls.gpus), 1.0) for s in services]
        framework = presets.framework(
            presets.document("kallot", config),
            name="kallot",
            target=frag.TargetWorkload.of(shapes),
            adjust=_without_model_cache if policy == "blind" else None,
        )
        self.scheduler = Scheduler(framework, explain=False)
        self.rng = np.random.default_rng(seed)
        self.state = [_ServiceState() for _ in services]
        # The kernel's cluster: the background as the base's usage, replicas charged on it.
        # Sessions see usage, not the running replicas (their warm weights are the caches).
        self.cluster = kernel.Cluster(self._base(), show_running=False)
        self.clock: kernel.Clock[tuple[str, int, int]] = kernel.Clock()
        n_req = sum(s.t.size for s in services)
        self.ttft = np.full(n_req, np.nan)
        self.arrival = np.concatenate([s.t for s in services]) if services else np.zeros(0)
        self.offset = np.cumsum([0] + [s.t.size for s in services])
        self.starts = {"memory": 0, "disk": 0, "remote": 0}
        self.start_log: list[tuple[float, str]] = []
        self.gpu_seconds = 0.0
        self.unplaced = 0
        self.prewarm_copies = 0
        self.replicas: dict[str, _Replica] = {}
        self.held: list[tuple[float, int]] = []  # (time, +/- GPUs) for the timeline
        self.warming: set[tuple[int, str]] = set()

    # -- events --------------------------------------------------------------------------------

    def _push(self, t: float, kind: str, a: int = 0, b: int = 0) -> None:
        self.clock.push(t, (kind, a, b))

    def run(self, progress: Callable[[float], None] | None = None) -> PolicyResult:
        end = max((float(s.t[-1]) for s in self.services if s.t.size), default=0.0)
        for i, s in enumerate(self.services):
            for j in range(s.t.size):
                self._push(float(s.t[j]), "arrive", i, j)
        t = 0.0
        while t <= end:
            self._push(t, "tick")
            t += TICK_S
        if self.policy == "prewarm":
            t = PREWARM_EVERY_S
            while t <= end:
                self._push(t, "prewarm")
                t += PREWARM_EVERY_S
        for i, s in enumerate(self.services):
            first = s.t < WARM_START_S
            busy = float(
                (s.ctx[first] / 1000 * s.cls.prefill_s_per_k + s.gen[first] * s.cls.tpot_s).sum()
            )
            initial = math.ceil(busy / WARM_START_S / (TARGET_UTIL * s.cls.slots))
            if initial:
                self._scale_up(0.0, i, min(MAX_REPLICAS, initial), warm=True)
        last_report = 0.0
        now = 0.0
        while self.clock:
            kind, a, b = self.clock.pop()
            now = self.clock.now
            if kind == "arrive":
                self._arrive(now, a, b)
            elif kind == "done":
                self._done(now, a, b)
            elif kind == "ready":
                self._dispatch(now, a)
            elif kind == "tick":
                self._tick(now)
            elif kind == "prewarm":
                self._prewarm(now)
            elif kind == "warm":
                self._warmed(a, b)
            if progress is not None and min(now, end) - last_report >= 60.0:
                progress(min(now, end) - last_report)
                last_report = min(now, end)
        stop = max(now, end)
        for r in list(self.replicas.values()):
            self._remove(stop, r)
        if progress is not None:
            progress(max(0.0, end - last_report))
        return self._result(stop)

    def _arrive(self, now: float, i: int, j: int) -> None:
        st = self.state[i]
        st.queue.append(j)
        st.last_arrival = now
        st.recent.append(now)
        if not st.replicas and st.pending == 0:
            self._scale_up(now, i, 1)  # from zero: the first request starts a replica
        self._dispatch(now, i)

    def _dispatch(self, now: float, i: int) -> None:
        st, svc = self.state[i], self.services[i]
        while st.queue:
            ready = [r for r in st.replicas if r.ready <= now and r.in_flight < svc.cls.slots]
            if not ready:
                return
            r = max(ready, key=lambda x: (x.in_flight, -x.placed))
            j = st.queue.popleft()
            prefill = svc.ctx[j] / 1000.0 * svc.cls.prefill_s_per_k
            self.ttft[self.offset[i] + j] = now - svc.t[j] + prefill
            r.in_flight += 1
            self._push(now + prefill + svc.gen[j] * svc.cls.tpot_s, "done", i, self._rid(r))

    def _rid(self, r: _Replica) -> int:
        return int(r.id.rsplit("-r", 1)[1])

    def _done(self, now: float, i: int, rid: int) -> None:
        r = self.replicas.get(f"{self.services[i].name}-r{rid}")
        if r is not None:
            r.in_flight -= 1
            if r.in_flight == 0:
                r.idle_since = now
        self._dispatch(now, i)

    def _tick(self, now: float) -> None:
        for i, svc in enumerate(self.services):
            st = self.state[i]
            # scale down (and to zero): replicas idle for IDLE_S
            for r in list(st.replicas):
                if r.ready <= now and r.in_flight == 0 and now - r.idle_since >= IDLE_S:
                    if len(st.replicas) == 1 and not st.pending and self._keep_warm(now, i):
                        continue
                    self._remove(now, r)
            active = len(st.replicas) + st.pending
            in_flight = sum(r.in_flight for r in st.replicas)
            st.load.append((now, in_flight + len(st.queue)))
            while st.load[0][0] < now - STABLE_WINDOW_S:
                st.load.popleft()
            demand = sum(c for _, c in st.load) / len(st.load)
            want = min(MAX_REPLICAS, math.ceil(demand / (TARGET_UTIL * svc.cls.slots)))
            if st.queue and want > active:
                self._scale_up(now, i, want - active)
            elif st.pending:
                self._scale_up(now, i, 0)  # retry replicas that did not fit
            st.peaks.append((now, len(st.replicas)))
            while st.peaks and st.peaks[0][0] < now - PREWARM_WINDOW_S:
                st.peaks.popleft()

    # -- placement by the core -----------------------------------------------------------------

    def _base(self) -> Snapshot:
        return (
            SnapshotBuilder()
            .extend(
                NodeSpec(
                    name=n.name,
                    cpu_milli=NODE_CPU_MILLI,
                    mem_mib=NODE_MEM_MIB,
                    gpus=[
                        GpuSpec(
                            model=GPU_MODEL,
                            mem_mib=GPU_MEM_MIB,
                            used_milli=1000 if g < n.background else 0,
                            used_mem=GPU_MEM_MIB if g < n.background else 0,
                            clients=int(g < n.background),
                        )
                        for g in range(GPUS_PER_NODE)
                    ],
                    cpu_used=CPU_PER_GPU * n.background,
                    mem_used=MEM_MIB_PER_GPU * n.background,
                    model_cache=n.cache(),
                )
                for n in self.nodes
            )
            .build()
        )

    def free_gpus(self) -> list[int]:
        """Idle GPUs per node now."""
        return [int(x) for x in (self.cluster.usage.gpu_clients == 0).sum(axis=1)]

    def _scale_up(self, now: float, i: int, more: int, *, warm: bool = False) -> None:
        """Ask for ``more`` replicas (plus those still pending) and place them; ``warm``: the
        run's initial replicas, loaded before time 0."""
        st, svc = self.state[i], self.services[i]
        st.pending += more
        if st.pending == 0:
            return
        tasks = []
        for _ in range(st.pending):
            st.next_id += 1  # ids are never reused (a try that does not fit wastes one)
            tasks.append(
                Task(
                    id=f"{svc.name}-r{st.next_id}",
                    cpu_milli=CPU_PER_GPU * svc.cls.gpus,
                    mem_mib=MEM_MIB_PER_GPU * svc.cls.gpus,
                    gpu=DeviceRequest(count=svc.cls.gpus),
                    created=now,
                    model=svc.model,
                )
            )
        snapshot = dataclasses.replace(
            self.cluster.snapshot(), node_models=tuple(n.cache() for n in self.nodes)
        )
        decision = self.scheduler.run_session(snapshot, tasks, now=now, rng=self.rng)
        by_id = {t.id: t for t in tasks}
        for p in decision.placements:
            node = self.nodes[p.node_row]
            gpus = tuple(d.slot for d in p.devices)
            self.cluster.place(p, by_id[p.task_id], now)
            tier = node.tier(svc.model)
            ready = now
            if not warm:
                self.starts[tier.name.lower()] += 1
                self.start_log.append((now, tier.name.lower()))
                ready = now + self.load.load_s(svc.model.size_bytes, tier, node.read_bps)
            node.disk.touch(svc.model.key, svc.model.size_bytes)
            node.memory.touch(svc.model.key, svc.model.size_bytes)
            r = _Replica(p.task_id, i, p.node_row, gpus, now, ready, idle_since=ready)
            st.replicas.append(r)
            self.replicas[r.id] = r
            self.held.append((now, len(gpus)))
            self._push(ready, "ready", i)
        st.pending -= len(decision.placements)
        self.unplaced += st.pending

    def _remove(self, now: float, r: _Replica) -> None:
        st = self.state[r.service]
        st.replicas.remove(r)
        del self.replicas[r.id]
        self.cluster.release(r.id)
        self.gpu_seconds += (now - r.placed) * len(r.gpus)
        self.held.append((now, -len(r.gpus)))

    # -- keep warm (prewarm) --------------------------------------------------------------------

    def predicted_rate(self, now: float, i: int) -> float:
        """Requests per second of service ``i`` predicted from its arrivals in the past
        PREWARM_WINDOW_S (only arrivals at or before ``now``: no look-ahead)."""
        recent = self.state[i].recent
        while recent and recent[0] < now - PREWARM_WINDOW_S:
            recent.popleft()
        seen = min(PREWARM_WINDOW_S, now)
        return len(recent) / seen if seen > 0 else 0.0

    def cold_cost_s(self, i: int) -> float:
        """Seconds a request waits on a start from zero with the weights in host memory (the
        best case pre-warm arranges): start-up + size / host-memory bandwidth."""
        return self.load.load_s(self.services[i].model.size_bytes, Tier.MEMORY)

    def demand_gpu_seconds(self, now: float) -> float:
        """GPU-seconds held so far by replicas, less those kept warm by this policy."""
        live = sum((now - r.placed) * len(r.gpus) for r in self.replicas.values())
        return self.gpu_seconds + live - self.kept_seconds

    def _keep_warm(self, now: float, i: int) -> bool:
        """Whether the last replica of ``i``, idle past IDLE_S, stays for one more tick: it
        pays (predicted rate x cold-start seconds >= threshold x GPUs) and fits the budget
        (GPU-seconds kept <= KEEP_WARM_BUDGET x the autoscaler's own GPU-seconds so far)."""
        if self.policy != "prewarm":
            return False
        gpus = self.services[i].cls.gpus
        if self.predicted_rate(now, i) * self.cold_cost_s(i) < self.keep_threshold * gpus:
            return False
        cost = gpus * TICK_S
        if self.kept_seconds + cost > self.keep_budget * self.demand_gpu_seconds(now):
            return False
        self.kept_seconds += cost
        self.keep_log.append((now, i))
        return True

    # -- pre-warm ------------------------------------------------------------------------------

    def _prewarm(self, now: float) -> None:
        """Keep each recently active service's weights in host memory on as many nodes as its
        recent peak of replicas (at least one), preferring nodes with room for a replica."""
        wanted: dict[int, set[str]] = {k: set() for k in range(len(self.nodes))}
        for i, svc in enumerate(self.services):
            st = self.state[i]
            if now - st.last_arrival > PREWARM_WINDOW_S:
                continue
            need = max([1, *(n for _, n in st.peaks)])
            key = svc.model.key
            free = self.free_gpus()
            holders = [k for k, n in enumerate(self.nodes) if key in n.memory]
            roomy = [k for k in holders if free[k] >= svc.cls.gpus]
            others = sorted(
                (k for k in range(len(self.nodes)) if k not in roomy and free[k] >= svc.cls.gpus),
                key=lambda k: (key not in self.nodes[k].disk, -free[k], k),
            )
            for k in (roomy + others)[:need]:
                wanted[k].add(key)
        for k, node in enumerate(self.nodes):
            node.memory.pinned = wanted[k]
            for key in wanted[k]:
                if key in node.memory or (k, key) in self.warming:
                    continue
                svc = next(s for s in self.services if s.model.key == key)
                src = Tier.DISK if key in node.disk else Tier.REMOTE
                took = svc.model.size_bytes / self.load.bandwidth(src, node.read_bps)
                self.warming.add((k, key))
                self.prewarm_copies += 1
                self._push(now + took, "warm", k, self.services.index(svc))

    def _warmed(self, k: int, i: int) -> None:
        node, model = self.nodes[k], self.services[i].model
        self.warming.discard((k, model.key))
        if model.key in node.memory.pinned:
            node.disk.touch(model.key, model.size_bytes)
            node.memory.touch(model.key, model.size_bytes)

    # -- results -------------------------------------------------------------------------------

    def _result(self, stop: float) -> PolicyResult:
        bins: F64 = np.arange(0.0, stop + 60.0, 60.0, dtype=np.float64)
        gpus = np.zeros(bins.size, dtype=np.float64)
        events = sorted(self.held)
        level, e = 0, 0
        for b in range(bins.size):
            while e < len(events) and events[e][0] <= bins[b]:
                level += events[e][1]
                e += 1
            gpus[b] = level
        done = ~np.isnan(self.ttft)
        return PolicyResult(
            policy=self.policy,
            ttft=self.ttft[done],
            arrival=self.arrival[done],
            starts=dict(self.starts),
            gpu_seconds=self.gpu_seconds,
            unplaced_tries=self.unplaced,
            timeline_t=bins,
            timeline_gpus=gpus,
            prewarm_copies=self.prewarm_copies,
            start_log=list(self.start_log),
            kept_gpu_seconds=self.kept_seconds,
            keep_log=list(self.keep_log),
        )


@dataclass(frozen=True, slots=True)
class Comparison:
    seed: int
    services: list[Service]
    results: dict[str, PolicyResult]
    load: LoadModel = DEFAULT_LOAD_MODEL
    keep_threshold: float = KEEP_WARM_THRESHOLD
    keep_budget: float = KEEP_WARM_BUDGET

    def summary(self) -> dict[str, object]:
        r = self.results
        blind = r["blind"]
        pre = r["prewarm"]
        return {
            "seed": self.seed,
            "requests": int(sum(s.t.size for s in self.services)),
            "cold_starts": {p: r[p].cold_starts for p in POLICIES},
            "replica_starts": {p: r[p].starts for p in POLICIES},
            "ttft_p50_s": {p: round(float(r[p].ttft_p(50)), 3) for p in POLICIES},
            "ttft_p99_s": {p: round(float(r[p].ttft_p(99)), 3) for p in POLICIES},
            "gpu_hours": {p: round(float(r[p].gpu_hours), 3) for p in POLICIES},
            "prewarm_copies": pre.prewarm_copies,
            "prewarm_kept_gpu_hours": round(pre.kept_gpu_seconds / 3600.0, 3),
            "prewarm_budget": {
                "keep_threshold": self.keep_threshold,
                "keep_budget": self.keep_budget,
            },
            "prewarm_vs_blind": {
                "ttft_p99": _ratio(pre.ttft_p(99), blind.ttft_p(99)),
                "gpu_hours": _ratio(pre.gpu_hours, blind.gpu_hours),
            },
            "load_model": dataclasses.asdict(self.load),
        }


def _ratio(a: float, b: float) -> float:
    return round(float(a) / float(b), 4) if b else 0.0


def compare(
    seed: int,
    *,
    policies_run: Iterable[str] = POLICIES,
    load: LoadModel = DEFAULT_LOAD_MODEL,
    memory_cache_bytes: int = MEMORY_CACHE_BYTES,
    disk_preload: float = DISK_PRELOAD,
    keep_threshold: float = KEEP_WARM_THRESHOLD,
    keep_budget: float = KEEP_WARM_BUDGET,
    progress: Callable[[str, float], None] | None = None,
    config: SchedulerConfiguration | None = None,
) -> Comparison:
    """Run every policy on the services of ``seed`` (placed as ``config`` says, default the
    shipped ``kallot``)."""
    services = workload(seed)
    results = {}
    for policy in policies_run:

        def step(dt: float, name: str = policy) -> None:
            if progress is not None:
                progress(name, dt)

        sim = ServingSim(
            services,
            policy,
            seed,
            load=load,
            memory_cache_bytes=memory_cache_bytes,
            disk_preload=disk_preload,
            keep_threshold=keep_threshold,
            keep_budget=keep_budget,
            config=config,
        )
        results[policy] = sim.run(step)
    return Comparison(seed, services, results, load, keep_threshold, keep_budget)
