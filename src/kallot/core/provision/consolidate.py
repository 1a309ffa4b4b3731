"""Consolidation: empty a nearly empty node by moving only what may move, so the autoscaler can
remove it (off by default; ``autoscale.consolidation`` in the scheduler configuration).

Where it sits: the top of the core, next to the scale-up planner (``core.provision.plan``), and
like it a what-if over whole sessions: for a candidate node, the session runs on the same
snapshot with that node unschedulable and its pods pending again; the move is kept only if the
core then places every one of them elsewhere. Shells (``sim.autoscale``; the live scheduler)
evict the pods of a kept move, emit one Event per eviction with ``Move.reason``, and leave the
empty node to the autoscaler (Karpenter's emptiness, cluster-autoscaler's scale-down).

What may move (``movable``), every rule a hard one:

- not ``do_not_disrupt`` (the user's or kallot's own ``karpenter.sh/do-not-disrupt``: a model
  server loading or in its grace window, the last ready replica, ``kube.disruption``);
- past its ``min_runtime_s``;
- not a gang member (a gang moves whole or not at all; moving a running gang means a new
  topology domain for all of it, which consolidation does not attempt);
- not named in ``protected`` (what the shell knows and the core does not: a PodDisruptionBudget
  with no disruption left, a pod of a server that is still loading).

A node is worth emptying when its GPUs (the ``gain``) are at least ``gain_threshold`` and every
pod on it may move; nodes with fewer GPU-equivalents in use go first. ``budget`` caps the
evictions of one call (the shell turns evictions per minute into a budget per call).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Set
from dataclasses import dataclass

import numpy as np

from kallot.core.decision import Eviction, Placement
from kallot.core.framework.runner import Framework
from kallot.core.gang import is_gang
from kallot.core.scheduler import Scheduler
from kallot.core.snapshot import Allocation, Snapshot
from kallot.core.workload import Job

REASON = "Consolidation"


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsolidationConfig:
    """``enabled`` (off by default); ``evictions_per_minute``: the eviction budget;
    ``gain_threshold``: the least GPUs a move must free; ``interval_s``: how often to try."""

    enabled: bool = False
    evictions_per_minute: int = 2
    gain_threshold: float = 1.0
    interval_s: float = 60.0

    def __post_init__(self) -> None:
        if self.evictions_per_minute < 0:
            raise ValueError(
                f"evictionsPerMinute: {self.evictions_per_minute}, expected an integer >= 0"
            )
        if self.gain_threshold < 0:
            raise ValueError(f"gainThreshold: {self.gain_threshold}, expected >= 0")
        if self.interval_s <= 0:
            raise ValueError(f"intervalSeconds: {self.interval_s}, expected > 0")


@dataclass(frozen=True, slots=True)
class Move:
    """Empty ``node``: evict ``evictions`` and place them as ``placements`` (rows of the
    snapshot the move was planned on); ``gain``: GPUs the node frees."""

    node: str
    gain: float
    evictions: tuple[Eviction, ...]
    placements: tuple[Placement, ...]

    @property
    def reason(self) -> str:
        return f"{REASON}: emptying node {self.node} frees {self.gain:g} GPUs"


def movable(
    a: Allocation, now: float, jobs: Mapping[str, Job], protected: Set[str] = frozenset()
) -> bool:
    """Whether consolidation may evict ``a`` (module docstring, "What may move")."""
    t = a.task
    if t.do_not_disrupt or t.id in protected:
        return False
    if now - a.started < t.min_runtime_s:
        return False
    return not (t.job and is_gang(jobs.get(t.job)))


def consolidate(
    framework: Framework,
    snapshot: Snapshot,
    config: ConsolidationConfig,
    *,
    now: float,
    budget: int,
    jobs: Mapping[str, Job] | None = None,
    protected: Set[str] = frozenset(),
    seed: int = 0,
) -> tuple[Move, ...]:
    """The move worth making now, within ``budget`` evictions: at most one per call, since a
    second one planned on the same snapshot could count on capacity the first just used."""
    jobs = jobs or {}
    if not config.enabled or budget <= 0:
        return ()
    on: dict[int, list[Allocation]] = {}
    for a in snapshot.running:
        on.setdefault(a.node_row, []).append(a)
    gpus = snapshot.gpu_count()
    used = (snapshot.gpu_used_milli.sum(axis=1) / 1000.0).astype(np.float64)
    order = sorted(
        (n for n in on if gpus[n] >= max(config.gain_threshold, 1e-9)),
        key=lambda n: (float(used[n]) / max(1, int(gpus[n])), snapshot.node_names[n]),
    )
    sched = Scheduler(framework, explain=False)
    schedulable = np.array(snapshot.node_schedulable, dtype=np.bool_)
    moves: list[Move] = []
    for n in order:
        members = on[n]
        if len(members) > budget or not schedulable[n]:
            continue
        if not all(movable(a, now, jobs, protected) for a in members):
            continue
        trial = schedulable.copy()
        trial[n] = False
        trial.flags.writeable = False
        what_if = dataclasses.replace(
            snapshot,
            node_schedulable=trial,
            running=tuple(a for a in snapshot.running if a.node_row != n),
        )
        tasks = [a.task for a in members]
        d = sched.run_session(what_if, tasks, now=now, rng=np.random.default_rng(seed), jobs=jobs)
        if {p.task_id for p in d.placements} != {t.id for t in tasks}:
            continue
        name = snapshot.node_names[n]
        gain = float(gpus[n])
        move = Move(name, gain, (), d.placements)
        evictions = tuple(Eviction(task_id=t.id, node=name, reason=move.reason) for t in tasks)
        moves.append(dataclasses.replace(move, evictions=evictions))
        break
    return tuple(moves)
