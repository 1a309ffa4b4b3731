"""Session actions for tenant queues: allocate in fair-share order, reclaim, preempt, report.

``queue_actions(tree)`` is the ordered list a Scheduler runs: ``QueueAllocate`` places pending
work (a gang as one unit) picking at each step the queue with the lowest dominant share, level by
level, and within a queue by priority; it lends idle capacity (a queue may go past its
entitlement up to its hard limit). ``Reclaim`` takes borrowed capacity back for a queue below
its share; ``Preempt`` evicts lower-priority work of the same queue. Both propose evictions,
try them as what-ifs in the Statement and keep them only if the preemptor then fits and every
quota rule still holds. ``RejectRemaining`` reports what is still pending. ``StaticQuotaAllocate``
is the baseline: FIFO with static quotas (Kubernetes ResourceQuota), no borrowing, no eviction.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import ClassVar

import numpy as np
from numpy.typing import NDArray

from kallot.core import gang
from kallot.core.actions import Action
from kallot.core.actions.gang_allocate import place_gang
from kallot.core.decision import Eviction, Placement
from kallot.core.errors import InvariantViolation
from kallot.core.framework.cycle import PENDING, StateKey
from kallot.core.plugins.quota import QUEUE_PLUGIN, Quota, QuotaBooks
from kallot.core.queueing import fair_share, victims
from kallot.core.queueing.charge import Charger
from kallot.core.queueing.ledger import Ledger
from kallot.core.queueing.queue_tree import QueueTree
from kallot.core.session.session import Session, fault_diagnosis
from kallot.core.snapshot import Allocation
from kallot.core.status import Diagnosis
from kallot.core.workload import Job, Task, TopologyMode

I64 = NDArray[np.int64]
Unit = tuple[Task, ...]

MAX_PLANS_TRIED = 3  # what-ifs per preemptor task: the cheapest plans, in cost order


@dataclass(slots=True)
class QueueState:
    """What the queue actions share within one session (under ``QUEUE_STATE``). The books
    (``charger``, ``ledger``) are the Quota plugin's: it charges placements, the disruptive
    actions credit evictions; both are undone by Statement rollbacks."""

    tree: QueueTree
    quota: Quota
    books: QuotaBooks
    entitlement: I64  # [Q, R], computed once at the start of the session
    jobs: Mapping[str, Job] = field(default_factory=dict)
    failed: dict[str, tuple[Unit, Diagnosis, int]] = field(default_factory=dict)

    @property
    def charger(self) -> Charger:
        return self.books.charger

    @property
    def ledger(self) -> Ledger:
        return self.books.ledger

    def leaf(self, task: Task) -> int | None:
        """Row of the leaf queue ``task`` is charged to (its own queue, else its gang's)."""
        return self.tree.leaf_of(gang.queue_of(task, self.jobs))


QUEUE_STATE: StateKey[QueueState] = StateKey("Queues/state")


def queue_state(session: Session, tree: QueueTree, quota: Quota) -> QueueState:
    """The session's QueueState, created on first use from the Snapshot and the pending list."""
    found = session.shared.get(QUEUE_STATE)
    if found is not None:
        return found
    books = quota.books(session.cycle())
    charger = books.charger
    demand = books.ledger.usage.astype(np.float64)
    for task in session.shared.get(PENDING) or ():
        leaf = tree.leaf_of(gang.queue_of(task, session.jobs))
        if leaf is not None:
            demand[leaf] += charger.estimate(task)
    ent = fair_share.entitlement(tree, charger.capacity().astype(np.float64), demand)
    state = QueueState(tree=tree, quota=quota, books=books, entitlement=ent, jobs=session.jobs)
    session.shared.put(QUEUE_STATE, state)
    return state


def queue_actions(tree: QueueTree, *, max_attempts: int = 64) -> tuple[Action, ...]:
    """The ordered actions of a queue-aware session (``max_attempts``: disruptive what-ifs per
    action and session, which bounds a session's time when much is pending). They share one
    Quota plugin for the tree."""
    quota = Quota(tree)
    return (
        QueueAllocate(tree, quota),
        Reclaim(tree, max_attempts, quota),
        Preempt(tree, max_attempts, quota),
        RejectRemaining(tree, quota),
    )


def _unit_key(unit: Unit) -> str:
    return f"gang/{unit[0].job}" if len(unit) > 1 or unit[0].job else unit[0].id


def _needed(session: Session, unit: Unit) -> int:
    if gang.in_gang(unit[0], session.jobs):
        return session.jobs[unit[0].job].min_available
    return 1


def _bad_queue(st: QueueState, task: Task) -> Diagnosis:
    tree = st.tree
    leaves = sorted(n for i, n in enumerate(tree.names) if tree.leaf[i])
    return Diagnosis.of(
        QUEUE_PLUGIN,
        f"queue {gang.queue_of(task, st.jobs)!r} is not a leaf queue; expected one of "
        f"{', '.join(leaves)}",
        unresolvable=True,
    )


def place_on(session: Session, task: Task, node: int) -> Placement | None:
    """Place ``task`` on ``node`` if every filter admits it there (a what-if's final test)."""
    fw = session.framework
    cycle = session.cycle()
    if not fw.pre_filter(cycle, task).ok:
        return None
    if node not in fw.feasible(cycle, task):
        return None
    return session.commit(cycle, task, node)


def place_with_quota(
    session: Session,
    st: QueueState,
    leaf: int,
    task: Task,
    *,
    node: int | None = None,
    capped: bool = False,
) -> Placement | Diagnosis:
    """Place ``task`` (anywhere, or on ``node``) and charge it to ``leaf``, or undo and say why.

    The Quota plugin checks the estimate and narrows the task before, and charges what the
    placement actually took after. ``capped``: also hold the queue to its static quota (the
    static-quota baseline); a do-not-disrupt task is always capped (it may not borrow).
    """
    quota, cycle = st.quota, session.cycle()
    refused = quota.limit(cycle, leaf, task)
    if refused is not None:
        return refused
    narrowed = quota.narrow(cycle, leaf, task)
    if isinstance(narrowed, Diagnosis):
        return narrowed
    cp = session.statement.checkpoint()
    if node is None:
        result: Placement | Diagnosis | None = session.place(narrowed)
    else:
        result = place_on(session, narrowed, node)
        if result is None:
            return Diagnosis.of(
                QUEUE_PLUGIN, f"does not fit on {session.snapshot.node_names[node]}"
            )
    assert result is not None
    if isinstance(result, Diagnosis):
        return result
    refused = quota.charge(cycle, leaf, [(task, result)], capped=capped or task.do_not_disrupt)
    if refused is not None:
        session.statement.rollback(cp)
        return refused
    return result


def _try_unit(
    session: Session,
    st: QueueState,
    leaf: int,
    unit: Unit,
    place: Callable[[Task], Placement | Diagnosis],
    *,
    capped: bool = False,
) -> Diagnosis | None:
    """Place ``unit`` all-or-nothing (at least its gang's min_available); None on success."""
    if gang.in_gang(unit[0], session.jobs):
        return _try_gang(session, st, leaf, unit, capped)
    cp = session.statement.checkpoint()
    placed: list[Task] = []
    first: Diagnosis | None = None
    for task in unit:
        result = place(task)
        if isinstance(result, Diagnosis):
            first = first or result
        else:
            placed.append(task)
    need = _needed(session, unit)
    if len(placed) >= need:
        done = {t.id for t in placed}
        for task in unit:
            if task.id not in done:
                session.reject(task, first or Diagnosis.of(gang.GANG, "did not fit"))
        return None
    session.statement.rollback(cp)
    if len(unit) == 1 and first is not None:
        return first
    detail = f" ({first.message()})" if first else ""
    return Diagnosis.of(
        gang.GANG, f"gang {unit[0].job}: only {len(placed)} of {need} required tasks fit{detail}"
    )


def _try_gang(
    session: Session, st: QueueState, leaf: int, unit: Unit, capped: bool
) -> Diagnosis | None:
    """Place a gang with ``place_gang`` (domains, tries, rollback live there), then charge it:
    if what it took breaks a hard limit (or, ``capped``, a quota) the whole gang is rolled
    back."""
    job = session.jobs[unit[0].job]
    cycle = session.cycle()
    tasks: list[Task] = []
    for task in unit:
        narrowed = st.quota.narrow(cycle, leaf, task)
        if isinstance(narrowed, Diagnosis):
            return narrowed
        tasks.append(narrowed)
    capped = capped or any(t.do_not_disrupt for t in unit)
    cp = session.statement.checkpoint()
    try:
        outcome = place_gang(session, job, tasks)
    except InvariantViolation:
        raise
    except Exception as exc:  # a fault costs this gang only (core.session.session)
        session.statement.rollback(cp)
        return fault_diagnosis(session.framework, exc)
    if not outcome.started:
        assert outcome.diagnosis is not None
        return outcome.diagnosis
    by_id = {t.id: t for t in unit}
    placed = [(by_id[p.task_id], p) for p in outcome.placed]
    refused = st.quota.charge(cycle, leaf, placed, capped=capped)
    if refused is not None:
        session.statement.rollback(cp)
        return refused
    for task_id, diagnosis in outcome.left_out:
        session.reject(by_id[task_id], diagnosis)
    return None


class QueueAllocate:
    """Places pending work in hierarchical dominant-resource-fair order (module docstring)."""

    name: ClassVar[str] = "queue-allocate"

    def __init__(self, tree: QueueTree, quota: Quota | None = None) -> None:
        self.tree = tree
        self.quota = quota or Quota(tree)

    def execute(self, session: Session, pending: Sequence[Task]) -> None:
        st = queue_state(session, self.tree, self.quota)
        by_leaf: dict[int, deque[Unit]] = {}
        for unit in gang.pending_units(pending, session.jobs):
            leaf = st.leaf(unit[0])
            if leaf is None:
                for task in unit:
                    session.reject(task, _bad_queue(st, task))
                continue
            by_leaf.setdefault(leaf, deque()).append(unit)
        while by_leaf:
            leaf = self._pick(st, by_leaf)
            unit = by_leaf[leaf].popleft()
            if not by_leaf[leaf]:
                del by_leaf[leaf]
            diag = _try_unit(session, st, leaf, unit, self._placer(session, st, leaf))
            if diag is not None:
                st.failed[_unit_key(unit)] = (unit, diag, leaf)

    @staticmethod
    def _placer(
        session: Session, st: QueueState, leaf: int
    ) -> Callable[[Task], Placement | Diagnosis]:
        def place(task: Task) -> Placement | Diagnosis:
            return place_with_quota(session, st, leaf, task)

        return place

    def _pick(self, st: QueueState, by_leaf: Mapping[int, deque[Unit]]) -> int:
        """Descend from the top: at each level, among children with pending work, those below
        a guarantee first, then the lowest dominant share (usage over entitlement), then the
        higher queue priority; remaining ties to the first-declared queue."""
        tree = self.tree
        active: set[int] = set()
        for leaf in by_leaf:
            active.update(tree.path[leaf])
        level: Sequence[int] = tree.top
        while True:
            options = [q for q in level if q in active]
            usage = st.ledger.usage[options]
            share = fair_share.dominant_share(tree, usage, st.entitlement[options])
            # Queues still below a guarantee go first, so work placed in this session never
            # takes what a guarantee needs (reclaim only evicts work that was already running).
            guar = tree.guaranteed[options]
            satisfied = ~np.any((guar > 0) & (usage < guar), axis=1)
            prio = np.array([-tree.queues[q].priority for q in options], dtype=np.int64)
            best = options[int(np.lexsort((prio, share, satisfied))[0])]
            if tree.leaf[best]:
                return best
            level = tree.children[best]


def _needs_domain(session: Session, unit: Unit) -> bool:
    """A gang that must sit in one topology domain: the disruptive what-ifs place members one by
    one on the nodes their victims free, which cannot promise a domain, so they leave it pending
    (it is retried by QueueAllocate next session, once its own queue's capacity is free)."""
    job = session.jobs.get(unit[0].job) if unit[0].job else None
    return job is not None and job.topology.mode is TopologyMode.REQUIRED


class _Disruptive:
    """Shared loop of Reclaim and Preempt: for each failed unit, evict-and-place what-ifs."""

    name: ClassVar[str] = "disruptive"
    reason: ClassVar[str] = ""

    def __init__(
        self, tree: QueueTree, max_attempts: int = 64, quota: Quota | None = None
    ) -> None:
        self.tree = tree
        self.max_attempts = max_attempts
        self.quota = quota or Quota(tree)

    def execute(self, session: Session, pending: Sequence[Task]) -> None:
        del pending
        st = queue_state(session, self.tree, self.quota)
        attempts = 0
        for key, (unit, _diag, leaf) in list(st.failed.items()):
            if attempts >= self.max_attempts:
                break
            if _needs_domain(session, unit) or not self.may_try(st, leaf, unit):
                continue
            attempts += 1
            if self._evict_and_place(session, st, leaf, unit):
                del st.failed[key]

    def may_try(self, st: QueueState, leaf: int, unit: Unit) -> bool:
        raise NotImplementedError

    def accept(self, st: QueueState, leaf: int, unit: Unit, members: Sequence[Allocation]) -> bool:
        raise NotImplementedError

    def fits_cap(self, st: QueueState, leaf: int, task: Task, node: int) -> bool:
        """Whether ``task`` placed on ``node`` would likely pass ``holds`` (plans that would
        are tried first: a guarantee in value units is used up faster on a dearer GPU)."""
        del st, leaf, task, node
        return True

    def holds(self, st: QueueState, before: I64, leaf: int, victim_leaves: set[int]) -> bool:
        """Quota rules that must still hold after a what-if (hard limits are always checked)."""
        del st, before, leaf, victim_leaves
        return True

    def _evict_and_place(self, session: Session, st: QueueState, leaf: int, unit: Unit) -> bool:
        statement, ledger = session.statement, st.ledger
        cp = statement.checkpoint()
        before = ledger.usage.copy()
        victim_leaves: set[int] = set()
        placed = 0
        for task in unit:
            result = place_with_quota(session, st, leaf, task)
            if isinstance(result, Placement):
                placed += 1
                continue
            if self._one(session, st, leaf, unit, task, before=before, victim_leaves=victim_leaves):
                placed += 1
        if placed >= _needed(session, unit):
            if placed < len(unit):
                done = {p.task_id for p in statement.placements()}
                for task in unit:
                    if task.id not in done:
                        session.reject(task, Diagnosis.of(gang.GANG, "did not fit"))
            return True
        statement.rollback(cp)  # the ledger follows the Statement's log
        return False

    def _one(
        self,
        session: Session,
        st: QueueState,
        leaf: int,
        unit: Unit,
        task: Task,
        *,
        before: I64,
        victim_leaves: set[int],
    ) -> bool:
        s, statement, ledger = session.snapshot, session.statement, st.ledger
        evicted = {e.task_id for e in statement.evictions()}
        running = [a for a in s.running if a.task.id not in evicted]
        candidates = victims.units(
            running, session.jobs, session.now, lambda m: self.accept(st, leaf, unit, m)
        )
        if not candidates:
            return False
        nodes = sorted({a.node_row for u in candidates for a in u.allocs})
        plans = [
            p
            for n in nodes
            if (p := victims.plan_on_node(s, session.scratch, task, n, candidates)) is not None
        ]
        plans.sort(
            key=lambda p: (
                not self.fits_cap(st, leaf, task, p.node),
                p.cost,
                int(session.tie_rank[p.node]),
            )
        )
        for plan in plans[:MAX_PLANS_TRIED]:
            cp = statement.checkpoint()
            leaves: set[int] = set()
            for vu in plan.units:
                for alloc in vu.allocs:
                    statement.evict(
                        alloc,
                        Eviction(
                            task_id=alloc.task.id,
                            node=s.node_names[alloc.node_row],
                            reason=f"{self.reason} for {task.id} ({st.tree.names[leaf]})",
                            for_task=task.id,
                        ),
                    )
                    vleaf = st.leaf(alloc.task)
                    if vleaf is not None:
                        ledger.sub(
                            vleaf, st.charger.placed(alloc.task, alloc.node_row, alloc.devices)
                        )
                        leaves.add(vleaf)
            result = place_with_quota(session, st, leaf, task, node=plan.node)
            if isinstance(result, Placement) and self.holds(
                st, before, leaf, victim_leaves | leaves
            ):
                victim_leaves |= leaves
                return True
            statement.rollback(cp)
        return False


class Reclaim(_Disruptive):
    """Takes back capacity other queues borrowed, for a queue below its share.

    A queue may reclaim while, after placing, it holds no more than max(entitlement,
    guaranteed) on the resources it asks for, at every level below where it meets the victim.
    A victim's queues (up to that meeting point) must be over their entitlement on a resource
    the victim holds, or, when the reclaimer's queues at those levels stay within their
    guarantees, over their own guarantee (a guarantee outranks another queue's over-quota
    share); and they are never pushed below a guarantee they are at or above.
    """

    name: ClassVar[str] = "reclaim"
    reason: ClassVar[str] = "reclaim"

    @staticmethod
    def _axes(st: QueueState) -> NDArray[np.bool_]:
        # Reclaim enforces what quotas guarantee: the resources some queue is guaranteed (else
        # the fairness resources). An axis nobody is guaranteed (GPU memory when quotas are in
        # GPUs, a model named only by a hard limit) is split by weight only, and holding "too
        # much" of it must not block taking a guaranteed GPU back; hard limits are checked on
        # every placement anyway.
        tree = st.tree
        guaranteed = np.asarray((tree.guaranteed > 0).any(axis=0), dtype=np.bool_)
        return guaranteed if guaranteed.any() else tree.fair_axes

    def _share_cap(self, st: QueueState, q: int) -> I64:
        cap: I64 = np.maximum(st.entitlement[q], st.tree.guaranteed[q])
        return cap

    def may_try(self, st: QueueState, leaf: int, unit: Unit) -> bool:
        need = sum((st.charger.estimate(t) for t in unit), st.charger.zeros())
        after = st.ledger.usage[leaf] + need
        axes = self._axes(st)
        return bool(np.all(~axes | (need <= 0) | (after <= self._share_cap(st, leaf))))

    def accept(self, st: QueueState, leaf: int, unit: Unit, members: Sequence[Allocation]) -> bool:
        tree, usage = st.tree, st.ledger.usage
        need = sum((st.charger.estimate(t) for t in unit), st.charger.zeros())
        per_leaf: dict[int, I64] = {}
        for alloc in members:
            w = st.leaf(alloc.task)
            if w is None or w == leaf:
                return False
            per_leaf[w] = per_leaf.get(w, st.charger.zeros()) + st.charger.placed(
                alloc.task, alloc.node_row, alloc.devices
            )
        axes = self._axes(st)
        for w, charge in per_leaf.items():
            ch = np.where(axes, charge, 0)
            lca = tree.lca(leaf, w)
            owed = all(
                np.all(~axes | (need <= 0) | (usage[r] + need <= tree.guaranteed[r]))
                for r in tree.below(leaf, lca)
            )
            for a in tree.below(w, lca):
                bar = tree.guaranteed[a] if owed else st.entitlement[a]
                borrowing = np.any((ch > 0) & (usage[a] > bar))
                g = tree.guaranteed[a]
                into_guarantee = np.any((ch > 0) & (usage[a] >= g) & (usage[a] - ch < g))
                if not borrowing or into_guarantee:
                    return False
        return True

    def fits_cap(self, st: QueueState, leaf: int, task: Task, node: int) -> bool:
        req = task.gpu
        if req is None or req.count == 0:
            return True
        s = st.charger.snapshot
        models = {s.models[int(c)] for c in s.gpu_model[node][s.gpu_valid[node]]}
        if req.models:
            models &= set(req.models)
        if not models:
            return False
        on_node = replace(task, gpu=replace(req, models=frozenset(models)))
        after = st.ledger.usage[leaf] + st.charger.estimate(on_node)
        axes = self._axes(st)
        return bool(np.all(~axes | (after <= self._share_cap(st, leaf))))

    def holds(self, st: QueueState, before: I64, leaf: int, victim_leaves: set[int]) -> bool:
        tree, usage = st.tree, st.ledger.usage
        axes = self._axes(st)
        gained = np.where(axes, usage[leaf] - before[leaf], 0)
        for w in victim_leaves:
            lca = tree.lca(leaf, w)
            for a in tree.below(leaf, lca):
                cap = self._share_cap(st, a)
                if np.any((gained > 0) & (usage[a] > cap)):
                    return False
            for a in tree.below(w, lca):
                g = tree.guaranteed[a]
                if np.any(axes & (before[a] >= g) & (usage[a] < g)):
                    return False
        return True


class Preempt(_Disruptive):
    """Within one leaf queue, evicts lower-priority work for higher-priority pending work."""

    name: ClassVar[str] = "preempt"
    reason: ClassVar[str] = "preempt"

    def may_try(self, st: QueueState, leaf: int, unit: Unit) -> bool:
        del st, leaf, unit
        return True

    def accept(self, st: QueueState, leaf: int, unit: Unit, members: Sequence[Allocation]) -> bool:
        priority = min(t.priority for t in unit)
        return all(st.leaf(m.task) == leaf and m.task.priority < priority for m in members)


class RejectRemaining:
    """Reports every unit still failed after the disruptive actions, with its first reason."""

    name: ClassVar[str] = "reject-remaining"

    def __init__(self, tree: QueueTree, quota: Quota | None = None) -> None:
        self.tree = tree
        self.quota = quota or Quota(tree)

    def execute(self, session: Session, pending: Sequence[Task]) -> None:
        del pending
        st = queue_state(session, self.tree, self.quota)
        for unit, diag, _leaf in st.failed.values():
            for task in unit:
                session.reject(task, diag)
        st.failed.clear()


class StaticQuotaAllocate:
    """Baseline: first come, first served, each queue capped at its guarantee on the resources
    it names (what a Kubernetes ResourceQuota does); no borrowing, no eviction.

    Caps are the Quota plugin's static quotas (``plugins.quota.static_quota``). Gangs are still
    placed whole (as the coscheduling plugin would), so the comparison is about quotas and
    order, not about partial gangs."""

    name: ClassVar[str] = "static-quota-allocate"

    def __init__(self, tree: QueueTree, quota: Quota | None = None) -> None:
        self.tree = tree
        self.quota = quota or Quota(tree)

    @staticmethod
    def _placer(
        session: Session, st: QueueState, leaf: int
    ) -> Callable[[Task], Placement | Diagnosis]:
        def place(task: Task) -> Placement | Diagnosis:
            return place_with_quota(session, st, leaf, task, capped=True)

        return place

    def execute(self, session: Session, pending: Sequence[Task]) -> None:
        st = queue_state(session, self.tree, self.quota)
        fifo = sorted(pending, key=lambda t: (t.created, t.id))
        for unit in gang.pending_units(fifo, session.jobs):
            leaf = st.leaf(unit[0])
            if leaf is None:
                for task in unit:
                    session.reject(task, _bad_queue(st, task))
                continue
            diag = _try_unit(
                session, st, leaf, unit, self._placer(session, st, leaf), capped=True
            )
            if diag is not None:
                for task in unit:
                    session.reject(task, diag)
