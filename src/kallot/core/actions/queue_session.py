"""What the tenant-queue actions share within one session: the ``QueueState`` (the Quota
plugin's books, the queues' entitlements, the units that failed so far) and placing a unit of
queued work through the Quota plugin (``place_with_quota``, ``try_unit``).

Where it sits: the actions layer, under ``queue`` (queue allocate, the static-quota baseline),
``reclaim`` and ``preempt``. Every write goes through the Statement; the queues' accounting
follows its log, so a rollback undoes both.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from kallot.core import gang
from kallot.core.actions.gang_allocate import place_gang
from kallot.core.decision import Placement
from kallot.core.errors import InvariantViolation
from kallot.core.framework.cycle import PENDING, StateKey
from kallot.core.plugins.quota import QUEUE_PLUGIN, Quota, QuotaBooks
from kallot.core.queueing import fair_share
from kallot.core.queueing.charge import Charger
from kallot.core.queueing.ledger import Ledger
from kallot.core.queueing.queue_tree import QueueTree
from kallot.core.session.session import Session, fault_diagnosis
from kallot.core.status import Diagnosis
from kallot.core.workload import Job, Task

I64 = NDArray[np.int64]
Unit = tuple[Task, ...]


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


def unit_key(unit: Unit) -> str:
    return f"gang/{unit[0].job}" if len(unit) > 1 or unit[0].job else unit[0].id


def needed(session: Session, unit: Unit) -> int:
    if gang.in_gang(unit[0], session.jobs):
        return session.jobs[unit[0].job].min_available
    return 1


def bad_queue(st: QueueState, task: Task) -> Diagnosis:
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


def try_unit(
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
        return try_gang(session, st, leaf, unit, capped)
    cp = session.statement.checkpoint()
    placed: list[Task] = []
    first: Diagnosis | None = None
    for task in unit:
        result = place(task)
        if isinstance(result, Diagnosis):
            first = first or result
        else:
            placed.append(task)
    need = needed(session, unit)
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


def try_gang(
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
