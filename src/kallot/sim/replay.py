"""Replay mode: openb pods arrive at their creation times and leave after their run time.

Where it sits: the second simulator mode next to ``sim.openb`` (which places every pod once, in
the paper's shuffled order, and never releases anything). Here the cluster state moves with
time: a pending queue (FIFO by arrival) is offered to one core session after every batch of
arrivals and departures, placed pods hold their devices for ``deletion - scheduled`` seconds,
and the run reports GPU allocation over time and queueing-delay percentiles.

The openb pod lists are not a busy period: creation times span ~150 days (most in the last
30), median run time is ~9 minutes, and at most ~65 GPUs are in use at once, so at real speed
the 6,212-GPU cluster would sit idle. The replay therefore runs on a seeded ``node_fraction`` of
the nodes (default 1%, about the trace's real peak) and can compress arrival times by
``speedup`` (run times unchanged) to raise the load further.
Arrivals and departures are events of the simulation kernel (``sim.kernel``: departures before
arrivals at the same instant); its cluster applies each Decision and yields the next Snapshot.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from kallot.config import presets
from kallot.config.scheduler import SchedulerConfiguration
from kallot.core.errors import ConfigError
from kallot.core.scheduler import Scheduler
from kallot.core.workload import Task
from kallot.sim import kernel, openb
from kallot.sim.trace import NodeRow, PodRow

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]

DEFAULT_SPEEDUP = 1.0  # real time
DEFAULT_NODE_FRACTION = 0.01  # ~12 nodes / ~60 GPUs: the trace's real concurrency (module doc)
DEFAULT_WINDOW = 512  # pending tasks offered per session, oldest first
MIN_RUN_S = 1.0  # pods with no or negative run time still hold their devices for a second
ARRIVE, DEPART = "arrive", "depart"  # the replay's events (kernel.Clock)


@dataclass(slots=True)
class ReplayResult:
    """One replay: allocation sampled after every session, one delay per placed pod."""

    workload: str
    policy: str
    seed: int
    speedup: float
    node_fraction: float
    capacity_milli: int
    arrival_end: float  # compressed time of the last arrival
    times: F64  # simulated seconds (compressed clock) of each sample
    used_milli: I64  # allocated milli-GPU after the session at ``times[i]``
    pending: I64  # pods waiting after that session
    delays: F64  # queueing delay (s, compressed clock) of each placed pod, arrival order
    unplaced: int  # pods still pending when the trace ran out
    sessions: int
    attempts: int
    wall_s: float

    def alloc_pct(self) -> F64:
        return np.asarray(100.0 * self.used_milli / self.capacity_milli, dtype=np.float64)

    def mean_alloc_pct(self) -> float:
        """Time-weighted mean GPU allocation over the arrival window (the drain after the last
        arrival is not steady state), the allocation being a step function between samples."""
        inside = self.times <= self.arrival_end
        times, alloc = self.times[inside], self.alloc_pct()[inside]
        if times.size < 2 or times[-1] <= times[0]:
            return float(alloc.mean()) if alloc.size else 0.0
        dt = np.diff(times)
        return float((alloc[:-1] * dt).sum() / (times[-1] - times[0]))

    def delay_percentiles(self) -> dict[str, float]:
        if self.delays.size == 0:
            return {"p50": 0.0, "p90": 0.0, "p99": 0.0, "max": 0.0}
        p50, p90, p99 = np.percentile(self.delays, [50, 90, 99])
        return {
            "p50": float(p50),
            "p90": float(p90),
            "p99": float(p99),
            "max": float(self.delays.max()),
        }


def run_time(pod: PodRow) -> float:
    """How long the pod holds its devices: deletion minus start (scheduled, else creation)."""
    start = pod.scheduled_time if pod.scheduled_time is not None else pod.creation_time
    if start is None or pod.deletion_time is None:
        return MIN_RUN_S
    return max(MIN_RUN_S, pod.deletion_time - start)


def offered_load(pods: Sequence[PodRow], capacity_milli: int, speedup: float) -> float:
    """Mean GPU demand over the (compressed) arrival window as a fraction of capacity: each pod
    counts for the part of its run time that falls inside the window."""
    created = [p.creation_time for p in pods if p.creation_time is not None]
    span = (max(created) - min(created)) / speedup if created else 0.0
    if span <= 0:
        return 0.0
    t0 = min(created)
    work = 0.0
    for p in pods:
        if p.creation_time is None:
            continue
        arrive = (p.creation_time - t0) / speedup
        work += p.gpu_milli_total * min(run_time(p), span - arrive)
    return work / (capacity_milli * span)


def sample_nodes(nodes: Sequence[NodeRow], fraction: float, seed: int) -> list[NodeRow]:
    """A seeded random ``fraction`` of the nodes (at least one), in their original order."""
    if not 0 < fraction <= 1:
        raise ConfigError("replay node fraction", fraction, "a fraction in (0, 1]")
    if fraction == 1:
        return list(nodes)
    k = max(1, round(fraction * len(nodes)))
    keep = np.sort(np.random.default_rng(seed).choice(len(nodes), size=k, replace=False))
    return [nodes[int(i)] for i in keep]


def _check_times(pods: Sequence[PodRow]) -> None:
    missing = [p.name for p in pods if p.creation_time is None]
    if missing:
        raise ConfigError(
            "pod list creation_time",
            f"empty for {len(missing)} pods (first: {missing[0]})",
            "the 11-column openb format with creation/deletion times",
        )


def replay(
    nodes: Sequence[NodeRow],
    pods: Sequence[PodRow],
    *,
    policy: str,
    seed: int,
    workload: str = "",
    speedup: float = DEFAULT_SPEEDUP,
    node_fraction: float = DEFAULT_NODE_FRACTION,
    window: int = DEFAULT_WINDOW,
    progress: Callable[[int, int], None] | None = None,
    config: SchedulerConfiguration | None = None,
) -> ReplayResult:
    """Replay ``pods`` on ``nodes`` with ``policy`` (the shipped file of that name, or
    ``config``); ``progress(done, total)`` after sessions."""
    start_wall = time.perf_counter()
    _check_times(pods)
    if window < 1:
        raise ConfigError("replay window", window, "an integer >= 1")
    if not speedup >= 1:
        raise ConfigError("replay speedup", speedup, "a number >= 1 (arrival-time compression)")
    nodes = sample_nodes(nodes, node_fraction, seed)
    base = openb.snapshot_of(nodes)
    capacity = int(base.gpu_cap_milli[base.gpu_valid].sum())
    target = openb.target_workload(pods)
    framework = presets.framework(presets.document(policy, config), name=policy, target=target)
    scheduler = Scheduler(framework, explain=False)
    rng = np.random.default_rng(seed)

    t0 = min(p.creation_time or 0.0 for p in pods)
    order = sorted(range(len(pods)), key=lambda i: (pods[i].creation_time or 0.0, i))
    tasks = {i: openb.task_of(pods[i], i) for i in order}
    arrival = {tasks[i].id: ((pods[i].creation_time or 0.0) - t0) / speedup for i in order}
    hold = {tasks[i].id: run_time(pods[i]) for i in order}
    by_id = {t.id: t for t in tasks.values()}

    cluster = kernel.Cluster(base)
    clock: kernel.Clock[tuple[str, Task]] = kernel.Clock()
    for i in order:  # arrivals after the departures of the same instant
        clock.push(arrival[tasks[i].id], (ARRIVE, tasks[i]), priority=1)
    pending: list[Task] = []
    times: list[float] = []
    used: list[int] = []
    waiting: list[int] = []
    delays: list[float] = []
    sessions = attempts = arrived = 0
    n = len(order)

    while clock:
        for kind, task in clock.batch():
            if kind == DEPART:
                cluster.release(task.id)
            else:
                pending.append(task)
                arrived += 1
        now = clock.now
        if pending:
            offered = pending[:window]
            snapshot = cluster.snapshot(sessions)
            decision = scheduler.run_session(snapshot, offered, now=now, rng=rng)
            sessions += 1
            attempts += len(offered)
            for alloc in cluster.apply(decision, by_id, now).placed:
                task = alloc.task
                clock.push(now + hold[task.id], (DEPART, task))
                delays.append(now - arrival[task.id])
            placed = {p.task_id for p in decision.placements}
            pending = [t for t in pending if t.id not in placed]
            if progress is not None:
                progress(arrived, n)
        times.append(now)
        used.append(cluster.used_milli())
        waiting.append(len(pending))

    return ReplayResult(
        workload=workload,
        policy=policy,
        seed=seed,
        speedup=speedup,
        node_fraction=node_fraction,
        capacity_milli=capacity,
        arrival_end=max(arrival.values(), default=0.0),
        times=np.asarray(times, dtype=np.float64),
        used_milli=np.asarray(used, dtype=np.int64),
        pending=np.asarray(waiting, dtype=np.int64),
        delays=np.asarray(delays, dtype=np.float64),
        unplaced=len(pending),
        sessions=sessions,
        attempts=attempts,
        wall_s=time.perf_counter() - start_wall,
    )
