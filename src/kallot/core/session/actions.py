"""Actions run in order inside a session: Allocate first (places pending tasks and gangs), then
the disruptive ones (preempt, reclaim) that later issues add. Each writes only via the Statement.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import ClassVar, Protocol

from kallot.core.session.session import Session
from kallot.core.status import Diagnosis, Reason
from kallot.core.workload import Task


class Action(Protocol):
    name: ClassVar[str]

    def execute(self, session: Session, pending: Sequence[Task]) -> None: ...


class Allocate:
    """Places pending tasks in queue order; a gang (Job with min_available > 1) all-or-nothing.

    A gang is tried as a unit at the position of its first task: its tasks are placed in order
    under one checkpoint, and if fewer than ``min_available`` fit, everything is rolled back
    and every task of the gang is reported unschedulable with the reason.
    """

    name: ClassVar[str] = "allocate"

    def execute(self, session: Session, pending: Sequence[Task]) -> None:
        gangs: dict[str, list[Task]] = defaultdict(list)
        for task in pending:
            job = session.jobs.get(task.job) if task.job else None
            if job is not None and job.min_available > 1:
                gangs[task.job].append(task)
        done: set[str] = set()
        for task in pending:
            if task.job in gangs:
                if task.job not in done:
                    done.add(task.job)
                    self._place_gang(session, task.job, gangs[task.job])
                continue
            result = session.place(task)
            if isinstance(result, Diagnosis):
                session.reject(task, result)

    @staticmethod
    def _place_gang(session: Session, job_id: str, tasks: list[Task]) -> None:
        job = session.jobs[job_id]
        cp = session.statement.checkpoint()
        placed = 0
        first_failure: Diagnosis | None = None
        for task in tasks:
            result = session.place(task)
            if isinstance(result, Diagnosis):
                first_failure = first_failure or result
            else:
                placed += 1
        if placed >= job.min_available:
            placed_ids = {p.task_id for p in session.statement.placements()}
            for task in tasks:
                if task.id not in placed_ids:
                    session.reject(task, first_failure or Diagnosis.of("Gang", "did not fit"))
            return
        session.statement.rollback(cp)
        detail = first_failure.message() if first_failure else ""
        message = f"gang {job_id}: only {placed} of {job.min_available} required tasks fit" + (
            f" ({detail})" if detail else ""
        )
        diag = Diagnosis(reasons=(Reason("Gang", message, 0),), summary=message)
        for task in tasks:
            session.reject(task, diag)
