"""Gang membership as the queue actions need it: pending gangs as one unit of work, running gangs
as one unit of eviction (whole or nothing).

What a gang is (``core.gang.is_gang``: a Job with ``min_available > 1`` or a topology domain) and
how one is placed (``core.gang.place_gang``) belong to core.gang; this module only groups tasks
by that definition and says which queue a task is charged to.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

from kallot.core import gang
from kallot.core.snapshot import Allocation
from kallot.core.workload import Job, Task


def is_gang(task: Task, jobs: Mapping[str, Job]) -> bool:
    """``task`` belongs to a gang (its Job is one by ``core.gang.is_gang``)."""
    return bool(task.job) and gang.is_gang(jobs.get(task.job))


def queue_of(task: Task, jobs: Mapping[str, Job]) -> str:
    """The queue a task is charged to: its own, else its gang's (a PodGroup names the queue)."""
    if task.queue or not task.job:
        return task.queue
    job = jobs.get(task.job)
    return job.queue if job is not None else ""


def pending_units(pending: Sequence[Task], jobs: Mapping[str, Job]) -> list[tuple[Task, ...]]:
    """Pending work as units in first-seen order: a gang's tasks together, others alone."""
    units: list[tuple[Task, ...]] = []
    gangs: dict[str, list[Task]] = defaultdict(list)
    order: list[str | Task] = []
    for task in pending:
        if is_gang(task, jobs):
            if task.job not in gangs:
                order.append(task.job)
            gangs[task.job].append(task)
        else:
            order.append(task)
    for item in order:
        units.append(tuple(gangs[item]) if isinstance(item, str) else (item,))
    return units


def running_units(
    running: Sequence[Allocation], jobs: Mapping[str, Job]
) -> dict[str, tuple[Allocation, ...]]:
    """Running gangs: job id -> every running allocation of that gang (the eviction unit)."""
    out: dict[str, list[Allocation]] = defaultdict(list)
    for alloc in running:
        if is_gang(alloc.task, jobs):
            out[alloc.task.job].append(alloc)
    return {job: tuple(allocs) for job, allocs in out.items()}
