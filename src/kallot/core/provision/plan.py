"""The scale-up planner: the cheapest set of new nodes on which the core places the pending work.

Where it sits: the top of the core (above ``scheduler``; pure, no I/O). The live scheduler
(``kube.autoscale.provision``) and ``kallot sim autoscale`` (``sim.autoscale``) hand it the tasks that fit
no node, their gangs and the configured ``NodeShape``s; it answers with a ``Plan``: which new
nodes, and which task each is for. Every candidate set of nodes is checked by running the same
``Scheduler.run_session`` the live scheduler runs (shares packed per GPU, MIG layouts valid,
gangs whole and inside one topology domain), so a plan never promises what the core would not
then do. A candidate "places the work" when every task that can be placed at all is placed.

Search, cheapest first by ``NodeShape.price`` (then by node count):

1. Pools: one session per shape on ``max_new`` empty nodes of that shape, and one on all shapes
   together. A task that no pool places fits no shape (``Plan.unplaceable``). The nodes the
   mixed pool used are the first candidate.
2. Exact: when few node-count vectors are cheaper than the best so far and pass the counting
   bounds (GPUs, whole GPUs, CPU and memory), try each in cost order; the first one the core
   places the work on is the cheapest the core can do.
3. Otherwise prune: drop a node, or swap it for a cheaper shape, while the work still places.

Each feasibility check runs three sessions at most: the tasks in queue order, largest first
(first-fit decreasing), smallest first; the core places in queue order, and a plan is only a
what-if, so any order the core places the work in will do.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from kallot.core.decision import Decision
from kallot.core.framework.runner import Framework
from kallot.core.provision.shapes import NodeShape
from kallot.core.resources import MILLI
from kallot.core.scheduler import Scheduler
from kallot.core.snapshot import NodeSpec, SnapshotBuilder
from kallot.core.workload import Job, Task

NEW_NODE_PREFIX = "new-"
EXACT_BUDGET = 48  # node-count vectors the exact step may try
MAX_POOL = 256  # nodes of one shape in a pool session


@dataclass(frozen=True, slots=True)
class PlannedNode:
    """A node to ask for: its shape, the name the plan gave it and the tasks placed on it."""

    shape: str
    name: str
    tasks: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Plan:
    """What to ask the autoscaler for. ``exact``: no cheaper set of nodes places the work
    (step 2 ran to the end); ``sessions``: core sessions the search ran."""

    nodes: tuple[PlannedNode, ...] = ()
    unplaceable: tuple[str, ...] = ()
    cost: float = 0.0
    exact: bool = True
    sessions: int = 0

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for n in self.nodes:
            out[n.shape] = out.get(n.shape, 0) + 1
        return out


EMPTY_PLAN = Plan()


class Planner:
    """Plans scale-ups with one Framework (the scheduler's profile) over fixed node shapes."""

    def __init__(self, framework: Framework, shapes: Sequence[NodeShape], *, seed: int = 0) -> None:
        names = [s.name for s in shapes]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"shapes: names {dup} appear twice, expected unique names")
        self.shapes = tuple(shapes)
        self.scheduler = Scheduler(framework, explain=False)
        self.seed = seed
        self._sessions = 0

    # -- the core as the feasibility oracle -----------------------------------------------------

    def _session(
        self,
        counts: Sequence[int],
        tasks: Sequence[Task],
        jobs: Mapping[str, Job],
        base: Sequence[NodeSpec],
    ) -> Decision:
        b = SnapshotBuilder().extend(base)
        for shape, k in zip(self.shapes, counts, strict=True):
            for i in range(k):
                b.add(shape.node(f"{NEW_NODE_PREFIX}{shape.name}-{i}"))
        self._sessions += 1
        return self.scheduler.run_session(
            b.build(), tasks, now=0.0, rng=np.random.default_rng(self.seed), jobs=jobs
        )

    def _places(
        self,
        counts: Sequence[int],
        tasks: Sequence[Task],
        jobs: Mapping[str, Job],
        base: Sequence[NodeSpec],
    ) -> Decision | None:
        """The Decision that places every task on ``counts`` new nodes (and ``base``), or None."""
        want = {t.id for t in tasks}
        for order in (tasks, _largest_first(tasks), _largest_first(tasks, reverse=False)):
            d = self._session(counts, order, jobs, base)
            if want <= {p.task_id for p in d.placements}:
                return d
        return None

    # -- the search -----------------------------------------------------------------------------

    def plan(
        self,
        tasks: Sequence[Task],
        jobs: Mapping[str, Job] | None = None,
        *,
        base: Sequence[NodeSpec] = (),
    ) -> Plan:
        """The cheapest set of new nodes that places ``tasks`` (with ``jobs`` their gangs;
        ``base`` existing nodes with what they have free, usually none: the tasks fit none)."""
        jobs = jobs or {}
        self._sessions = 0
        if not tasks or not self.shapes:
            return Plan(unplaceable=tuple(t.id for t in tasks), sessions=0)
        pool = [min(s.max_new, len(tasks), MAX_POOL) for s in self.shapes]
        placed: set[str] = set()
        for i, k in enumerate(pool):
            if k:
                one = [0] * len(pool)
                one[i] = k
                placed |= {p.task_id for p in self._session(one, tasks, jobs, base).placements}
        mixed = self._session(pool, tasks, jobs, base)
        placed |= {p.task_id for p in mixed.placements}
        # A gang is placed whole or not at all, whatever a pool placed of it.
        by_job: dict[str, list[Task]] = {}
        for t in tasks:
            if t.job:
                by_job.setdefault(t.job, []).append(t)
        for members in by_job.values():
            if not all(m.id in placed for m in members):
                placed -= {m.id for m in members}
        # A pool's session is one greedy pass: with max_new limits it may leave out a unit
        # (a task, or a gang whole) that fits with the rest in another order. Try each again.
        tried: set[str] = set()
        for t in tasks:
            if t.id in placed or t.id in tried:
                continue
            unit = by_job[t.job] if t.job else [t]
            tried |= {u.id for u in unit}
            again = [u for u in tasks if u.id in placed] + unit
            if self._places(pool, again, jobs, base) is not None:
                placed |= {u.id for u in unit}
        work = [t for t in tasks if t.id in placed]
        unplaceable = tuple(t.id for t in tasks if t.id not in placed)
        if not work:
            return Plan(unplaceable=unplaceable, sessions=self._sessions)
        best = self._used(mixed, work)
        best_d = self._places(best, work, jobs, base)
        if best_d is None:  # the mixed pool placed them in another order: keep the whole pool
            best, best_d = list(pool), self._places(pool, work, jobs, base)
        if best_d is None:
            return Plan(unplaceable=tuple(t.id for t in tasks), sessions=self._sessions)
        best, best_d = self._shrink(best, best_d, work, jobs, base)
        exact, cheaper = self._exact(best, work, jobs, base)
        if cheaper is not None:
            best, best_d = cheaper
        return self._result(best, best_d, unplaceable, exact)

    def _used(self, d: Decision, work: Sequence[Task]) -> list[int]:
        ids = {t.id for t in work}
        used = {p.node for p in d.placements if p.task_id in ids}
        return [sum(1 for n in used if _of_shape(n, s)) for s in self.shapes]

    def cost(self, counts: Sequence[int]) -> tuple[float, int]:
        return (
            sum(k * s.price for s, k in zip(self.shapes, counts, strict=True)),
            sum(counts),
        )

    def _shrink(
        self,
        best: list[int],
        best_d: Decision,
        work: Sequence[Task],
        jobs: Mapping[str, Job],
        base: Sequence[NodeSpec],
    ) -> tuple[list[int], Decision]:
        """Drop nodes, or swap one for a cheaper shape, while the core still places the work."""
        improved = True
        while improved:
            improved = False
            again = self._used(best_d, work)
            if self.cost(again) < self.cost(best):  # the last session used fewer nodes
                d_again = self._places(again, work, jobs, base)
                if d_again is not None:
                    best, best_d = again, d_again
            for i in sorted(range(len(best)), key=lambda j: -self.shapes[j].price):
                if best[i] == 0:
                    continue
                moves = [None, *(j for j in range(len(best)) if j != i)]
                for j in moves:
                    cand = list(best)
                    cand[i] -= 1
                    if j is not None:
                        if cand[j] >= self.shapes[j].max_new:
                            continue
                        cand[j] += 1
                    if self.cost(cand) >= self.cost(best):
                        continue
                    d = self._places(cand, work, jobs, base)
                    if d is not None:
                        best, best_d, improved = cand, d, True
                        break
                if improved:
                    break
        return best, best_d

    def _exact(
        self,
        best: Sequence[int],
        work: Sequence[Task],
        jobs: Mapping[str, Job],
        base: Sequence[NodeSpec],
    ) -> tuple[bool, tuple[list[int], Decision] | None]:
        """Try every count vector cheaper than ``best`` that passes the counting bounds, in cost
        order, when there are at most ``EXACT_BUDGET`` of them (else: not exact, nothing)."""
        limit = self.cost(best)
        if base:  # the counting bounds below ignore what base nodes have free
            return False, None
        need = _Need.of(work)
        ranges = [range(min(s.max_new, math.floor(limit[0] / s.price)) + 1) for s in self.shapes]
        if math.prod(len(r) for r in ranges) > EXACT_BUDGET * 1000:
            return False, None
        cands: list[list[int]] = []
        for vec in itertools.product(*ranges):
            c = list(vec)
            if self.cost(c) < limit and need.admits(self.shapes, c):
                cands.append(c)
                if len(cands) > EXACT_BUDGET:
                    return False, None
        for c in sorted(cands, key=self.cost):
            d = self._places(c, work, jobs, base)
            if d is not None:
                return True, (c, d)
        return True, None

    def _result(
        self, counts: Sequence[int], d: Decision, unplaceable: tuple[str, ...], exact: bool
    ) -> Plan:
        on: dict[str, list[str]] = {}
        for p in d.placements:
            if p.node.startswith(NEW_NODE_PREFIX):
                on.setdefault(p.node, []).append(p.task_id)
        del counts  # the Decision says which of the candidate nodes hold tasks
        nodes = []
        for s in self.shapes:
            for name in sorted(on, key=lambda n: (len(n), n)):
                if _of_shape(name, s):
                    nodes.append(PlannedNode(s.name, name, tuple(on[name])))
        used = [sum(1 for n in nodes if n.shape == s.name) for s in self.shapes]
        return Plan(
            nodes=tuple(nodes),
            unplaceable=unplaceable,
            cost=self.cost(used)[0],
            exact=exact,
            sessions=self._sessions,
        )


def _of_shape(node: str, shape: NodeShape) -> bool:
    """Whether ``node`` is one of the planner's candidate nodes of ``shape``."""
    prefix = f"{NEW_NODE_PREFIX}{shape.name}-"
    return node.startswith(prefix) and node[len(prefix) :].isdigit()


def _size(t: Task) -> tuple[int, int, int]:
    g = t.gpu
    if g is None:
        return (0, 0, t.cpu_milli)
    if g.mig_profile:  # '3g.40gb': 3 of a GPU's 7 compute slices
        head = g.mig_profile.split("g", 1)[0]
        slices = int(head) if head.isdigit() else 7
        return (slices * MILLI // 7, 0, t.cpu_milli)
    return (g.count * g.milli, g.mem_mib, t.cpu_milli)


def _largest_first(tasks: Sequence[Task], *, reverse: bool = True) -> list[Task]:
    """The tasks largest first (a gang at its largest member), as equal-priority tasks the
    queue sorts by ``created``: first-fit decreasing through the core's own queue order.
    ``reverse=False``: smallest first (MIG instances packed from slot 0 leave the tail of the
    GPU to the big profile that would otherwise block it)."""
    key = {t.id: _size(t) for t in tasks}
    job_key: dict[str, tuple[int, int, int]] = {}
    for t in tasks:
        if t.job:
            job_key[t.job] = max(job_key.get(t.job, (0, 0, 0)), key[t.id])
    ordered = sorted(tasks, key=lambda t: job_key.get(t.job, key[t.id]) if t.job else key[t.id])
    if reverse:
        ordered.reverse()
    return [replace(t, created=float(i)) for i, t in enumerate(ordered)]


@dataclass(frozen=True, slots=True)
class _Need:
    """Counting bounds of the work: GPUs (compute), whole GPUs, CPU, memory, by GPU model."""

    gpu_milli: int
    whole: int
    cpu: int
    mem: int
    models: frozenset[str]

    @staticmethod
    def of(work: Sequence[Task]) -> _Need:
        milli = whole = 0
        models: set[str] = set()
        for t in work:
            g = t.gpu
            if g is None or g.count == 0:
                continue
            milli += g.count * (MILLI if g.whole or g.mig_profile else g.milli)
            whole += g.count if g.whole else 0
            if len(g.models) == 1:
                models |= g.models
        return _Need(
            milli,
            whole,
            sum(t.cpu_milli for t in work),
            sum(t.mem_mib for t in work),
            frozenset(models),
        )

    def admits(self, shapes: Sequence[NodeShape], counts: Sequence[int]) -> bool:
        gpus = sum(s.gpus * k for s, k in zip(shapes, counts, strict=True))
        cpu = sum(s.cpu_milli * k for s, k in zip(shapes, counts, strict=True))
        mem = sum(s.mem_mib * k for s, k in zip(shapes, counts, strict=True))
        have = {s.gpu_model for s, k in zip(shapes, counts, strict=True) if k and s.gpus}
        return (
            gpus * MILLI >= self.gpu_milli
            and gpus >= self.whole
            and cpu >= self.cpu
            and mem >= self.mem
            and self.models <= have
        )
