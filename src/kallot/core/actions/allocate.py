"""``Allocate``: the default action, places pending tasks in queue order and gangs as units.

Where it sits: the actions layer; ``Scheduler`` runs it when no other actions are given (the
tenant-queue actions are in ``core.actions.queue``). Writes only via the Statement.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import ClassVar

from kallot.core import gang
from kallot.core.actions import Action
from kallot.core.actions.gang_allocate import place_gang
from kallot.core.session.session import Session
from kallot.core.status import Diagnosis
from kallot.core.workload import Task


class Allocate:
    """Places pending tasks in queue order; a gang (Job with min_available > 1) all-or-nothing.

    A gang is tried as a unit at the position of its first task by ``place_gang``
    (one checkpoint per try, inside a topology domain when the Job asks): if fewer than
    ``min_available`` fit, everything is rolled back and every task of the gang is reported
    unschedulable with the reason.
    """

    name: ClassVar[str] = "allocate"

    def execute(self, session: Session, pending: Sequence[Task]) -> None:
        gangs: dict[str, list[Task]] = defaultdict(list)
        for task in pending:
            job = session.jobs.get(task.job) if task.job else None
            if gang.is_gang(job):
                gangs[task.job].append(task)
        done: set[str] = set()
        for task in pending:
            if task.job in gangs:
                if task.job not in done:
                    done.add(task.job)
                    with session.isolated(gangs[task.job]):
                        self._place_gang(session, task.job, gangs[task.job])
                continue
            result = session.place(task)
            if isinstance(result, Diagnosis):
                session.reject(task, result)

    @staticmethod
    def _place_gang(session: Session, job_id: str, tasks: list[Task]) -> None:
        # The gang logic (domains, tries, rollback) lives in gang_allocate; this only reports.
        outcome = place_gang(session, session.jobs[job_id], tasks)
        if outcome.started:
            for task_id, diagnosis in outcome.left_out:
                session.reject(_by_id(tasks, task_id), diagnosis)
            return
        assert outcome.diagnosis is not None
        for task in tasks:
            session.reject(task, outcome.diagnosis)


def _by_id(tasks: list[Task], task_id: str) -> Task:
    return next(t for t in tasks if t.id == task_id)


_: type[Action] = Allocate
