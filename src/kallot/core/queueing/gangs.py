"""Gang membership as the queue actions need it: pending gangs as one unit of work, running gangs
as one unit of eviction (whole or nothing).

A gang is a ``Job`` with ``min_available > 1`` that its tasks name in ``Task.job`` (the core's
existing concept). Kept here, apart from the placement of gangs (core.gang in the topology
work), so the two can be reconciled behind these two functions.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

from kallot.core.snapshot import Allocation
from kallot.core.workload import Job, Task


def is_gang(task: Task, jobs: Mapping[str, Job]) -> bool:
    job = jobs.get(task.job) if task.job else None
    return job is not None and job.min_available > 1


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
