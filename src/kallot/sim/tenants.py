"""Multi-tenant simulation: openb pods of five teams in a department -> team queue tree, with
arrivals and departures, run under kallot's queue actions and under FIFO with static quotas.

Where it sits: ``kallot sim tenants`` (cli.sim_tenants) calls ``compare``; the plot is in
``sim.tenants_plot``. The workload rule (which pod goes to which team, when it arrives, which
pods are gangs, protected or urgent) is documented on ``generate`` and in
docs/design/007-queues.md. On the simulation kernel (``sim.kernel``), sessions run at fixed
periods, after the departures and arrivals of the same instant; the kernel's cluster applies
their evictions and placements, the core's queue Ledger keeps what each queue holds, and the
holdings are measured against the queues' fair share after every period.

Long module: the team tree, the workload generator and the run with its metrics are one
experiment (docs/design/007-queues.md) and change together; the plot is already apart.
"""

from __future__ import annotations

import time
import zlib
from collections import defaultdict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from kallot.config import presets
from kallot.config.scheduler import SchedulerConfiguration
from kallot.core.actions import Action
from kallot.core.actions import queue as actions
from kallot.core.errors import ConfigError
from kallot.core.framework.runner import Framework
from kallot.core.queueing import fair_share, ledger, victims
from kallot.core.queueing.charge import Charger
from kallot.core.queueing.queue_tree import (
    GPU,
    GPU_VALUE,
    Queue,
    QueueResource,
    QueueTree,
    model_resource,
)
from kallot.core.resources import MILLI
from kallot.core.scheduler import Scheduler
from kallot.core.snapshot import Allocation, Snapshot
from kallot.core.workload import DeviceRequest, Job, Task
from kallot.sim import kernel, openb
from kallot.sim.replay import run_time, sample_nodes
from kallot.sim.trace import NodeRow, PodRow


class _Final:
    """The Journal of the simulator's books: what the cluster applied is final (a session's
    what-ifs are undone inside the session, before its Decision reaches the cluster), so
    nothing is ever rolled back and there is nothing to log."""

    def record(self, undo: Callable[[], None]) -> None:
        del undo


_FINAL = _Final()

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]

SCHEDULERS = ("fifo", "kallot")
HIGH_PRIORITY = 100
MIN_RUNTIME_S = 300.0  # every pod may be disrupted only after 5 minutes (no thrashing)
RUN_TIME_RANGE_S = (60.0, 4 * 3600.0)  # openb run times clipped (p99 is ~31 h)
GANG_SIZE = 4
# The simulation's events (kernel.Clock): (kind, task id, departure: start time / session: step).
DEPART, ARRIVE, SESSION = "depart", "arrive", "session"
_Event = tuple[str, str, float]

# Value weight of one GPU per openb model, relative to a T4 (assumptions, roughly relative
# prices; openb's G2/G3 are anonymized models and weighted like V100-class parts).
MODEL_VALUES: Mapping[str, float] = {
    "T4": 1.0,
    "P100": 1.5,
    "A10": 2.0,
    "G2": 2.0,
    "V100M16": 2.5,
    "V100M32": 3.0,
    "G3": 3.0,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Team:
    """One leaf queue of the default tree and the traffic it sends.

    ``guarantee_pct`` / ``limit_pct`` are of the cluster's GPU-equivalents; ``traffic`` is the
    team's share of the offered GPU-time, submitted between ``window`` (fractions of the
    horizon); ``gangs`` the share of its whole-GPU pods that become 4-pod gangs; ``urgent`` the
    share at high priority; ``protected`` marks every pod do-not-disrupt (LLM servers);
    ``max_gpus`` keeps only pods of at most that many GPUs (0 = any).
    """

    name: str
    department: str
    guarantee_pct: float
    limit_pct: float | None = None
    weight: float = 1.0
    traffic: float = 0.2
    window: tuple[float, float] = (0.0, 1.0)
    gangs: float = 0.0
    urgent: float = 0.1
    protected: bool = False
    max_gpus: int = 0


DEPARTMENTS: Mapping[str, float] = {"research": 45.0, "product": 45.0, "sandbox": 10.0}
TEAMS: tuple[Team, ...] = (
    # Training: floods the first half of the run, gangs, borrows all it can.
    Team(
        name="nlp",
        department="research",
        guarantee_pct=30.0,
        traffic=0.35,
        window=(0.0, 0.5),
        gangs=0.25,
    ),
    # Steady; capped on the cluster's most common GPU model (per-model hard limit, below).
    Team(name="vision", department="research", guarantee_pct=15.0, traffic=0.15),
    # Inference servers: steady, one GPU or a share each, never disrupted.
    Team(
        name="serving",
        department="product",
        guarantee_pct=25.0,
        traffic=0.15,
        urgent=0.0,
        protected=True,
        max_gpus=1,
    ),
    # Idle for 40% of the run, then comes back for its guarantee (reclaim).
    Team(name="ads", department="product", guarantee_pct=20.0, traffic=0.2, window=(0.4, 1.0)),
    # Small guarantee, hard limit at 30% of the cluster.
    Team(
        name="batch",
        department="sandbox",
        guarantee_pct=10.0,
        limit_pct=30.0,
        weight=0.5,
        traffic=0.15,
        urgent=0.0,
    ),
)
VISION_MODEL_LIMIT = 0.25  # vision may hold at most this share of the most common model


def build_tree(
    capacity_value: int,
    model_milli: Mapping[str, int],
    teams: Sequence[Team] = TEAMS,
    departments: Mapping[str, float] = DEPARTMENTS,
) -> QueueTree:
    """The department -> team tree. Guarantees and limits are on ``gpu_value`` (milli value
    units: GPU-equivalents times ``MODEL_VALUES``), in percent of the cluster's ``capacity_value``,
    so a team guaranteed 20% is owed 20% of the fleet's worth, not 20% of its GPU count; vision
    also has a per-model hard limit in GPUs."""

    def milli(pct: float) -> int:
        return int(capacity_value * pct / 100.0)

    queues = [
        Queue(name=d, resources={GPU_VALUE: QueueResource(guaranteed=milli(pct))})
        for d, pct in departments.items()
    ]
    top_model = max(model_milli, key=lambda m: (model_milli[m], m)) if model_milli else ""
    for team in teams:
        if team.department not in departments:
            raise ConfigError(
                f"teams[{team.name}].department", team.department, f"one of {sorted(departments)}"
            )
        res = {
            GPU_VALUE: QueueResource(
                guaranteed=milli(team.guarantee_pct),
                limit=None if team.limit_pct is None else milli(team.limit_pct),
                over_quota_weight=team.weight,
            )
        }
        if team.name == "vision" and top_model:
            limit = int(model_milli[top_model] * VISION_MODEL_LIMIT)
            res[model_resource(top_model)] = QueueResource(limit=limit)
        queues.append(
            Queue(name=team.name, parent=team.department, resources=res, over_quota_weight=1.0)
        )
    return QueueTree(queues=tuple(queues), model_values=MODEL_VALUES)


@dataclass(slots=True)
class Workload:
    """Generated tasks (arrival order), their gangs, arrival times and run times."""

    tasks: list[Task]
    jobs: dict[str, Job]
    arrival: dict[str, float]
    hold: dict[str, float]
    offered_load: float


def team_of(pod: PodRow, teams: Sequence[Team]) -> int:
    """The documented rule: crc32 of the pod's name, in 1000 buckets, split by traffic share."""
    total = sum(t.traffic for t in teams)
    bucket = zlib.crc32(pod.name.encode()) % 1000 / 1000.0 * total
    edge = 0.0
    for i, team in enumerate(teams):
        edge += team.traffic
        if bucket < edge:
            return i
    return len(teams) - 1


def generate(
    pods: Sequence[PodRow],
    *,
    capacity_milli: int,
    horizon_s: float,
    load: float,
    seed: int,
    teams: Sequence[Team] = TEAMS,
) -> Workload:
    """Draw each team's pods from the openb GPU pods that ``team_of`` gives it (with
    replacement, seeded) until the team has offered ``traffic x load x capacity x horizon``
    GPU-seconds, arriving uniformly inside its window (a Poisson process given the count).
    Shapes (CPU, memory, GPUs, share) and run times (deletion - start, clipped to 1 min..4 h)
    are the trace's; a ``gangs`` share of whole-GPU pods become gangs of 4 identical pods; a
    team with ``max_gpus`` drops the larger pods of its part."""
    if not 0 < load <= 10:
        raise ConfigError("load", load, "a number in (0, 10]")
    if horizon_s <= 0:
        raise ConfigError("horizon", horizon_s, "a positive number of seconds")
    gpu_pods = [p for p in pods if p.num_gpu > 0 and p.gpu_milli > 0]
    pools: dict[int, list[PodRow]] = defaultdict(list)
    for p in gpu_pods:
        k = team_of(p, teams)
        if not teams[k].max_gpus or p.num_gpu <= teams[k].max_gpus:
            pools[k].append(p)
    rng = np.random.default_rng(seed)
    total_traffic = sum(t.traffic for t in teams)
    entries: list[tuple[float, Task]] = []
    jobs: dict[str, Job] = {}
    hold: dict[str, float] = {}
    offered = 0.0
    lo, hi = RUN_TIME_RANGE_S
    for k, team in enumerate(teams):
        pool = pools.get(k) or gpu_pods
        if not pool:
            raise ConfigError("pod list", "no GPU pods", "a pod list with GPU pods")
        budget = team.traffic / total_traffic * load * capacity_milli * horizon_s
        start, end = team.window[0] * horizon_s, team.window[1] * horizon_s
        drawn: list[tuple[PodRow, int, bool, bool]] = []
        work = 0.0
        while work < budget:
            pod = pool[int(rng.integers(len(pool)))]
            size = GANG_SIZE if (pod.gpu_milli >= MILLI and rng.random() < team.gangs) else 1
            urgent = bool(rng.random() < team.urgent)
            drawn.append((pod, size, urgent, team.protected))
            work += size * pod.gpu_milli_total * float(np.clip(run_time(pod), lo, hi))
        offered += work
        times = np.sort(rng.uniform(start, end, size=len(drawn)))
        for i, ((pod, size, urgent, protected), t) in enumerate(zip(drawn, times, strict=True)):
            base = f"{team.name}-{i}"
            job = f"{base}-gang" if size > 1 else ""
            if job:
                jobs[job] = Job(id=job, min_available=size, queue=team.name)
            for m in range(size):
                task = Task(
                    id=f"{base}-{m}" if size > 1 else base,
                    cpu_milli=pod.cpu_milli,
                    mem_mib=pod.memory_mib,
                    gpu=DeviceRequest(count=pod.num_gpu, milli=pod.gpu_milli),
                    priority=HIGH_PRIORITY if urgent else 0,
                    created=float(t),
                    queue=team.name,
                    job=job,
                    do_not_disrupt=protected,
                    min_runtime_s=MIN_RUNTIME_S,
                )
                entries.append((float(t), task))
                hold[task.id] = float(np.clip(run_time(pod), lo, hi))
    entries.sort(key=lambda e: (e[0], e[1].id))
    return Workload(
        tasks=[t for _, t in entries],
        jobs=jobs,
        arrival={t.id: a for a, t in entries},
        hold=hold,
        offered_load=offered / (capacity_milli * horizon_s),
    )


@dataclass(slots=True)
class RunResult:
    """One scheduler's run: per-period samples and the disruption counts."""

    name: str
    times: F64  # [S] seconds
    usage: F64  # [S, L] GPU value held per leaf queue (milli value units)
    entitlement: F64  # [S, L] fair share of each leaf on the same axis
    jain: F64  # [S]
    used_milli: I64  # [S] GPU milli allocated
    capacity_milli: int
    delays: dict[tuple[str, int], list[float]]  # (queue, priority) -> delay of each first start
    evictions: int = 0
    preempted_gpu_hours: float = 0.0
    do_not_disrupt_evictions: int = 0
    partial_gang_evictions: int = 0
    min_runtime_evictions: int = 0
    quota_violations: int = 0  # samples with some queue above a hard limit
    guarantee_shortfall_value_hours: float = 0.0
    shortfall_by_queue: dict[str, float] = field(default_factory=dict)
    pending_at_end: int = 0
    sessions: int = 0
    wall_s: float = 0.0
    leaves: tuple[str, ...] = ()

    def mean_jain(self) -> float:
        return float(self.jain.mean()) if self.jain.size else 1.0

    def utilization_pct(self) -> float:
        if not self.used_milli.size:
            return 0.0
        return float(100.0 * self.used_milli.mean() / self.capacity_milli)

    def delay_table(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for (queue, prio), values in sorted(self.delays.items()):
            a = np.asarray(values, dtype=np.float64)
            p50, p90 = np.percentile(a, [50, 90]) if a.size else (0.0, 0.0)
            out[f"{queue}/p{prio}"] = {"n": float(a.size), "p50_s": float(p50), "p90_s": float(p90)}
        return out


def simulate(
    name: str,
    base: Snapshot,
    work: Workload,
    tree: QueueTree,
    scheduler: Scheduler,
    *,
    horizon_s: float,
    period_s: float,
    window: int,
    seed: int,
    progress: Callable[[int], None] | None = None,
) -> RunResult:
    """Run ``work`` for ``horizon_s`` with one session per ``period_s`` (``window`` pending units
    per leaf queue offered per session, oldest first); ``progress(1)`` after each period."""
    start_wall = time.perf_counter()
    rng = np.random.default_rng(seed)
    charger = Charger(tree, base)
    capacity = charger.capacity().astype(np.float64)
    # What each queue holds (a leaf's amount also in its ancestors): the core's queue Ledger,
    # kept for the whole run (its checkpoints are never used here).
    books = ledger.Ledger(tree, charger, base, journal=_FINAL)
    demand = np.zeros((tree.n_queues, len(tree.axes)), dtype=np.float64)  # pending, leaves
    leaves = [i for i in range(tree.n_queues) if tree.leaf[i]]
    value, gpu = tree.axis[GPU_VALUE], tree.axis[GPU]
    cluster = kernel.Cluster(base)
    clock: kernel.Clock[_Event] = kernel.Clock()
    waiting: dict[int, deque[tuple[Task, ...]]] = {q: deque() for q in leaves}
    by_id = {t.id: t for t in work.tasks}
    started_once: set[str] = set()
    leaf_of = {t.id: tree.leaf_of(t.queue) for t in work.tasks}
    worth = {t.id: int(charger.estimate(t)[tree.axis[GPU_VALUE]]) for t in work.tasks}
    res = RunResult(
        name=name,
        times=np.zeros(0),
        usage=np.zeros((0, len(leaves))),
        entitlement=np.zeros((0, len(leaves))),
        jain=np.zeros(0),
        used_milli=np.zeros(0, dtype=np.int64),
        capacity_milli=int(capacity[gpu]),
        delays=defaultdict(list),
        leaves=tuple(tree.names[q] for q in leaves),
    )
    times: list[float] = []
    usage_s: list[F64] = []
    ent_s: list[F64] = []
    jain_s: list[float] = []
    used_s: list[int] = []
    pending_gangs: dict[str, list[Task]] = defaultdict(list)

    def leaf_of_task(task: Task) -> int:
        leaf = leaf_of[task.id]
        assert leaf is not None
        return leaf

    def enqueue(task: Task) -> None:
        leaf = leaf_of_task(task)
        demand[leaf] += charger.estimate(task)
        if task.job:
            # Gang members join the queue together, once all of them are back.
            group = pending_gangs[task.job]
            group.append(task)
            if len(group) == work.jobs[task.job].min_available:
                waiting[leaf].append(tuple(group))
                del pending_gangs[task.job]
            return
        waiting[leaf].append((task,))

    def release(task_id: str) -> Allocation:
        alloc = cluster.release(task_id)
        books.sub(
            leaf_of_task(alloc.task), charger.placed(alloc.task, alloc.node_row, alloc.devices)
        )
        return alloc

    # Departures, then arrivals, then the period's session at the same instant.
    for task in work.tasks:
        clock.push(work.arrival[task.id], (ARRIVE, task.id, 0.0), priority=1)
    steps = int(np.ceil(horizon_s / period_s))
    for step in range(steps + 1):
        clock.push(step * period_s, (SESSION, "", float(step)), priority=2)
    while clock:
        kind, tid, at = clock.pop()
        if kind == DEPART:
            alloc = cluster.running.get(tid)
            if alloc is None or alloc.started != at:
                continue  # evicted (and perhaps restarted) since this departure was planned
            release(tid)
            continue
        if kind == ARRIVE:
            enqueue(by_id[tid])
            continue
        step, now = int(at), clock.now
        offered = [t for q in leaves for unit in list(waiting[q])[:window] for t in unit]
        if offered:
            snapshot = cluster.snapshot(step)
            decision = scheduler.run_session(snapshot, offered, now=now, rng=rng, jobs=work.jobs)
            res.sessions += 1
            evicted_by_job: dict[str, int] = defaultdict(int)
            for e in decision.evictions:
                alloc = release(e.task_id)
                task = alloc.task
                res.evictions += 1
                res.preempted_gpu_hours += victims.wasted_gpu_hours(alloc, now)
                res.do_not_disrupt_evictions += int(task.do_not_disrupt)
                res.min_runtime_evictions += int(now - alloc.started < task.min_runtime_s)
                if task.job:
                    evicted_by_job[task.job] += 1
                enqueue(task)
            for job, n in evicted_by_job.items():
                # Every member of an evicted gang must go in the same Decision.
                still = sum(1 for a in cluster.running.values() if a.task.job == job)
                res.partial_gang_evictions += int(still > 0 or n < work.jobs[job].min_available)
            placed: set[str] = set()
            for p in decision.placements:
                task = by_id[p.task_id]
                cluster.place(p, task, now)
                clock.push(now + work.hold[task.id], (DEPART, task.id, now))
                leaf = leaf_of_task(task)
                books.add(leaf, charger.placed(task, p.node_row, p.devices))
                demand[leaf] -= charger.estimate(task)
                placed.add(task.id)
                if task.id not in started_once:
                    started_once.add(task.id)
                    res.delays[(task.queue, task.priority)].append(now - work.arrival[task.id])
            if placed:
                for q in leaves:
                    waiting[q] = deque(u for u in waiting[q] if u[0].id not in placed)
        # Measure: holdings against the hierarchical fair share of the current demand.
        ent = fair_share.entitlement(tree, capacity, books.usage + demand)
        if np.any(books.usage > tree.limit):
            res.quota_violations += 1
        got, fair = books.usage[leaves, value], ent[leaves, value].astype(np.float64)
        asking = fair > 0
        jain_s.append(fair_share.jain_index(got[asking] / fair[asking]) if asking.any() else 1.0)
        # Shortfall (value units x hours, T4 = 1): a leaf below min(guarantee, demand) while a pending unit of it would fit in
        # what is left of its guarantee (a 500-milli remainder no pending task fits is not one).
        held = books.usage[leaves, value]
        want = held + demand[leaves, value]
        short = np.minimum(tree.guaranteed[leaves, value], want) - held
        for j, q in enumerate(leaves):
            if short[j] > 0:
                smallest = min((sum(worth[t.id] for t in u) for u in waiting[q]), default=np.inf)
                if held[j] + smallest > tree.guaranteed[q, value]:
                    short[j] = 0.0
        lost = np.maximum(short, 0) / MILLI * period_s / 3600.0
        res.guarantee_shortfall_value_hours += float(lost.sum())
        for name_, h in zip(res.leaves, lost, strict=True):
            res.shortfall_by_queue[name_] = res.shortfall_by_queue.get(name_, 0.0) + float(h)
        times.append(now)
        usage_s.append(got.astype(np.float64))
        ent_s.append(fair)
        used_s.append(cluster.used_milli())
        if progress is not None:
            progress(1)
        if step == steps:
            break  # what departs after the last period is not measured
    res.times = np.asarray(times, dtype=np.float64)
    res.usage = np.asarray(usage_s, dtype=np.float64)
    res.entitlement = np.asarray(ent_s, dtype=np.float64)
    res.jain = np.asarray(jain_s, dtype=np.float64)
    res.used_milli = np.asarray(used_s, dtype=np.int64)
    res.pending_at_end = sum(len(u) for q in leaves for u in waiting[q])
    res.wall_s = time.perf_counter() - start_wall
    return res


@dataclass(slots=True)
class Comparison:
    """FIFO with static quotas against kallot's queue actions on the same workload."""

    fifo: RunResult
    kallot: RunResult
    tree: QueueTree
    seed: int
    n_nodes: int
    n_gpus: int
    n_tasks: int
    n_gangs: int
    offered_load: float
    horizon_s: float
    period_s: float
    policy: str

    def summary(self) -> dict[str, object]:
        """The JSON of ``kallot sim tenants --json`` (issue 7's keys, then extras)."""
        runs = {"fifo": self.fifo, "kallot": self.kallot}
        k = self.kallot

        def both(pick: Callable[[RunResult], float]) -> dict[str, float]:
            return {n: pick(r) for n, r in runs.items()}

        return {
            "jain_index": both(RunResult.mean_jain),
            "quota_violations": k.quota_violations + self.fifo.quota_violations,
            "preempted_gpu_hours": round(k.preempted_gpu_hours, 3),
            "do_not_disrupt_evictions": k.do_not_disrupt_evictions,
            "partial_gang_evictions": k.partial_gang_evictions,
            "seed": self.seed,
            "quota_violations_by_scheduler": both(lambda r: r.quota_violations),
            "min_runtime_evictions": k.min_runtime_evictions,
            "evictions": k.evictions,
            "utilization_pct": both(RunResult.utilization_pct),
            "guarantee_shortfall_value_hours": both(lambda r: r.guarantee_shortfall_value_hours),
            "guarantee_shortfall_by_queue": {
                n: {q: round(h, 3) for q, h in r.shortfall_by_queue.items()}
                for n, r in runs.items()
            },
            "queueing_delay": {n: r.delay_table() for n, r in runs.items()},
            "pending_at_end": both(lambda r: r.pending_at_end),
            "sessions": both(lambda r: r.sessions),
            "wall_s": both(lambda r: round(r.wall_s, 2)),
            "cluster": {"nodes": self.n_nodes, "gpus": self.n_gpus},
            "workload": {
                "tasks": self.n_tasks,
                "gangs": self.n_gangs,
                "offered_load": round(self.offered_load, 3),
                "horizon_s": self.horizon_s,
                "period_s": self.period_s,
            },
            "policy": self.policy,
        }


def schedulers(tree: QueueTree, framework: Framework) -> dict[str, Scheduler]:
    """The two schedulers compared, on the same placement profile."""
    fifo: tuple[Action, ...] = (actions.StaticQuotaAllocate(tree),)
    return {
        "fifo": Scheduler(framework, fifo, explain=False),
        "kallot": Scheduler(framework, actions.queue_actions(tree, max_attempts=16), explain=False),
    }


def compare(
    nodes: Sequence[NodeRow],
    pods: Sequence[PodRow],
    *,
    n_nodes: int = 16,
    horizon_s: float = 6 * 3600.0,
    period_s: float = 60.0,
    load: float = 1.3,
    window: int = 32,
    seed: int = 0,
    policy: str = "bestfit",
    progress: Callable[[int], None] | None = None,
    config: SchedulerConfiguration | None = None,
) -> Comparison:
    """Generate one workload and run it under both schedulers (same seed for both), placing
    with ``policy`` (the shipped file of that name, or ``config``)."""
    if n_nodes < 1 or n_nodes > len(nodes):
        raise ConfigError("nodes", n_nodes, f"1..{len(nodes)} (nodes in the node list)")
    if period_s <= 0:
        raise ConfigError("period", period_s, "a positive number of seconds")
    if window < 1:
        raise ConfigError("window", window, "an integer >= 1")
    rows = sample_nodes(nodes, n_nodes / len(nodes), seed)
    base = openb.snapshot_of(rows)
    usable = base.gpu_valid & base.gpu_healthy
    capacity = MILLI * int(usable.sum())
    model_milli = {
        m: MILLI * int((base.gpu_model[usable] == code).sum()) for code, m in enumerate(base.models)
    }
    value = sum(int(v * MODEL_VALUES.get(m, 1.0)) for m, v in model_milli.items())
    tree = build_tree(value, {m: v for m, v in model_milli.items() if v > 0})
    work = generate(pods, capacity_milli=capacity, horizon_s=horizon_s, load=load, seed=seed)
    framework = presets.framework(presets.document(policy, config), name=policy)
    runs = {
        name: simulate(
            name,
            base,
            work,
            tree,
            sched,
            horizon_s=horizon_s,
            period_s=period_s,
            window=window,
            seed=seed,
            progress=progress,
        )
        for name, sched in schedulers(tree, framework).items()
    }
    return Comparison(
        fifo=runs["fifo"],
        kallot=runs["kallot"],
        tree=tree,
        seed=seed,
        n_nodes=len(rows),
        n_gpus=capacity // MILLI,
        n_tasks=len(work.tasks),
        n_gangs=len(work.jobs),
        offered_load=work.offered_load,
        horizon_s=horizon_s,
        period_s=period_s,
        policy=policy,
    )


def steps(horizon_s: float, period_s: float) -> int:
    """Progress ticks of one run (``simulate`` calls ``progress(1)`` this many times)."""
    return int(np.ceil(horizon_s / period_s)) + 1
