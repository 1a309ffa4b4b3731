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
  server loading or in its grace window, the last ready replica, ``kube.autoscale.disruption``);
- past its ``min_runtime_s``;
- not a gang member (a gang moves whole or not at all; moving a running gang means a new
  topology domain for all of it, which consolidation does not attempt);
- not named in ``protected`` (what the shell knows and the core does not: a PodDisruptionBudget
  with no disruption left, a pod of a server that is still loading).

A node is worth emptying when its GPUs (the ``gain``) are at least ``gain_threshold`` and every
pod on it may move; nodes with fewer GPU-equivalents in use go first. ``budget`` caps the
evictions of one call (the shell turns evictions per minute into a budget per call).

Defragmentation (``defragment``), tried when no node is worth emptying and pending pods are
given: move a few pods off one GPU so that a pending pod no GPU can hold today fits there
(scattered shares that leave no GPU enough compute or memory, MIG instances whose positions
block the profile a pending pod asks for). Each candidate is a what-if in one Session on the
real snapshot: evict the victims through the Statement (their compute, memory and MIG instances
are free again), place the pending pod, then place every victim again. The move is kept only if
all of them are placed and no victim lands back on the devices it left (``gain_threshold`` is
for emptying nodes: a defragmentation is made only for a pending pod it lets fit, whatever its
size, within the eviction budget; its ``gain`` is the GPU-equivalents that pod gets); otherwise the Statement rolls back and the next
candidate is tried. A dynamic-MIG GPU the victims leave is reconfigured by the core's own MIG
choice (``core.mig.reconfigure``), exactly as in a session: MIG geometry is never guessed here.

Candidates, cheapest first: for every GPU holding movable allocations, each single allocation
on it, then all of them together; fewer victims and less load go first. At most
``MAX_WHAT_IFS`` what-ifs per call and ``MAX_PENDING`` pending pods, the most important first
(priority, then age); gang members are left out (a gang needs room for all its members, which
a one-GPU search cannot promise). The shell evicts the victims (``Move.evictions``); the
pending pod and the victims' new pods are placed by the next sessions, where the move planned
room for them (``Move.placements``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass

import numpy as np

from kallot.core import fit
from kallot.core.decision import Eviction, Placement
from kallot.core.framework.runner import Framework
from kallot.core.gang import is_gang
from kallot.core.scheduler import Scheduler
from kallot.core.session.session import Session
from kallot.core.snapshot import Allocation, Snapshot
from kallot.core.workload import Job, Task

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
    snapshot the move was planned on); ``gain``: GPUs the node frees.

    A defragmentation (``core.provision.defrag``) names ``for_task``, the pending pod that fits
    once GPU ``slot`` of ``node`` is freed; its placement comes first in ``placements`` and
    ``gain`` is the GPU-equivalents it gets."""

    node: str
    gain: float
    evictions: tuple[Eviction, ...]
    placements: tuple[Placement, ...]
    for_task: str = ""
    slot: int = -1

    @property
    def reason(self) -> str:
        if self.for_task:
            return (
                f"{REASON}: freeing GPU {self.slot} of node {self.node} lets pending "
                f"{self.for_task} fit ({self.gain:g} GPUs)"
            )
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
    pending: Sequence[Task] = (),
) -> tuple[Move, ...]:
    """The move worth making now, within ``budget`` evictions: at most one per call, since a
    second one planned on the same snapshot could count on capacity the first just used.
    Emptying a node comes first; when none is worth it, defragmenting a GPU for one of the
    ``pending`` pods that fit nowhere (``core.provision.defrag``)."""
    jobs = jobs or {}
    if not config.enabled or budget <= 0:
        return ()
    emptied = _empty_a_node(
        framework,
        snapshot,
        config,
        now=now,
        budget=budget,
        jobs=jobs,
        protected=protected,
        seed=seed,
    )
    if emptied or not pending:
        return emptied
    return defragment(
        framework,
        snapshot,
        pending,
        now=now,
        budget=budget,
        jobs=jobs,
        protected=protected,
        seed=seed,
    )


def _empty_a_node(
    framework: Framework,
    snapshot: Snapshot,
    config: ConsolidationConfig,
    *,
    now: float,
    budget: int,
    jobs: Mapping[str, Job],
    protected: Set[str],
    seed: int,
) -> tuple[Move, ...]:
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


MAX_WHAT_IFS = 64
MAX_PENDING = 16


def gain_of(snapshot: Snapshot, placement: Placement) -> float:
    """GPU-equivalents ``placement`` holds (a whole GPU 1, a share its part, a MIG instance its
    slices), as ``core.fit.gpu_equivalents`` counts them."""
    row = placement.node_row
    return sum(
        fit.gpu_equivalents(d, int(snapshot.gpu_mem_mib[row, d.slot])) for d in placement.devices
    )


def _candidates(
    snapshot: Snapshot, movers: Sequence[Allocation], budget: int
) -> list[tuple[Allocation, ...]]:
    """Victim sets, cheapest first (module docstring, "Candidates")."""
    by_gpu: dict[tuple[int, int], list[Allocation]] = {}
    for a in movers:
        for slot in sorted({d.slot for d in a.devices}):
            by_gpu.setdefault((a.node_row, slot), []).append(a)
    used = snapshot.gpu_used_milli
    sets: list[tuple[int, int, str, tuple[Allocation, ...]]] = []
    for (row, slot), allocs in by_gpu.items():
        allocs.sort(key=lambda a: a.task.id)
        load = int(used[row, slot])
        name = f"{snapshot.node_names[row]}/{slot}"
        sets.extend((1, load, name, (a,)) for a in allocs)
        if 1 < len(allocs) <= budget:
            sets.append((len(allocs), load, name, tuple(allocs)))
    sets.sort(key=lambda s: (s[0], s[1], s[2]))
    seen: set[frozenset[str]] = set()
    out = []
    for _, _, _, victims in sets:
        key = frozenset(a.task.id for a in victims)
        if key not in seen:
            seen.add(key)
            out.append(victims)
    return out


def _back_in_place(victim: Allocation, placement: Placement) -> bool:
    """A victim placed on exactly the devices it left: evicting it would gain nothing."""
    if placement.node_row != victim.node_row:
        return False
    return {(d.slot, d.mig) for d in placement.devices} == {(d.slot, d.mig) for d in victim.devices}


def defragment(
    framework: Framework,
    snapshot: Snapshot,
    pending: Sequence[Task],
    *,
    now: float,
    budget: int,
    jobs: Mapping[str, Job] | None = None,
    protected: Set[str] = frozenset(),
    seed: int = 0,
) -> tuple[Move, ...]:
    """The move that lets the first pending pod that fits nowhere fit, within ``budget``
    evictions; ``()`` when none does (at most one move per call, as in ``consolidate``)."""
    jobs = jobs or {}
    if budget <= 0:
        return ()
    wanted = sorted(
        (t for t in pending if t.gpu is not None and not (t.job and is_gang(jobs.get(t.job)))),
        key=lambda t: (-t.priority, t.created, t.id),
    )[:MAX_PENDING]
    if not wanted:
        return ()
    session = Session(
        framework, snapshot, now=now, rng=np.random.default_rng(seed), jobs=jobs, explain=False
    )
    statement = session.statement
    movers = [a for a in snapshot.running if movable(a, now, jobs, protected)]
    candidates = _candidates(snapshot, movers, budget)
    tried = 0
    for task in wanted:
        cp = statement.checkpoint()
        fits_now = isinstance(session.place(task), Placement)
        statement.rollback(cp)
        if fits_now:
            continue  # the next session places it; nothing to move
        for victims in candidates:
            if tried >= MAX_WHAT_IFS:
                return ()
            tried += 1
            move = _what_if(session, task, victims)
            if move is not None:
                return (move,)
    return ()


def _what_if(session: Session, task: Task, victims: tuple[Allocation, ...]) -> Move | None:
    """Evict ``victims``, place ``task`` and then the victims; the Move, or None (rolled back)."""
    s, statement = session.snapshot, session.statement
    cp = statement.checkpoint()
    try:
        node = s.node_names[victims[0].node_row]
        slot = victims[0].devices[0].slot
        for a in victims:
            statement.evict(
                a, Eviction(task_id=a.task.id, node=s.node_names[a.node_row], reason="")
            )
        first = session.place(task)
        if not isinstance(first, Placement):
            return None
        gain = gain_of(s, first)
        placements = [first]
        for a in victims:
            again = session.place(a.task)
            if not isinstance(again, Placement) or _back_in_place(a, again):
                return None
            placements.append(again)
        move = Move(node, gain, (), tuple(placements), for_task=task.id, slot=slot)
        evictions = tuple(
            Eviction(
                task_id=a.task.id,
                node=s.node_names[a.node_row],
                reason=move.reason,
                for_task=task.id,
            )
            for a in victims
        )
        return dataclasses.replace(move, evictions=evictions)
    finally:
        statement.rollback(cp)
