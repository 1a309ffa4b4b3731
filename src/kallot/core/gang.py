"""What a gang is: a Job whose tasks start together (at least ``min_available`` of them) or none
do, optionally inside one topology domain (one host, rack or block).

Where it sits: the model layer of the core. The gang-allocate action
(``core.actions.gang_allocate``) places gangs; queue accounting, victim selection and the queue
actions group tasks by the definitions here (a pending gang is one unit of work, a running gang
one unit of eviction). ``GangTopology`` is what a profile declares about gangs and topology
(``Profile.gang_topology`` names the plugin that carries it).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kallot.core import topology
from kallot.core.snapshot import Allocation
from kallot.core.workload import Job, Task, TopologyMode

GANG = "Gang"
# A gang still waiting for members: a different blockage from one that does not fit, so the
# live scheduler writes the real reason at once when the last member arrives.
GANG_QUORUM = "GangQuorum"


@dataclass(frozen=True, slots=True)
class GangTopology:
    """How a session's gangs use topology: the cluster levels, and whether ``preferred``
    constraints and locality count (a topology-blind profile ignores them; ``required`` ones are
    always honoured or the gang stays pending)."""

    cluster: topology.ClusterTopology = topology.DEFAULT_CLUSTER_TOPOLOGY
    aware: bool = False
    # A plugin of the profile keeps a gang's tasks inside the domain being tried (it filters on
    # ``GangContext.allowed``): ``required`` domains can be honoured without being aware.
    enforces_required: bool = False


BLIND = GangTopology()


def is_gang(job: Job | None) -> bool:
    """Tasks of this job are placed as a unit (min_available > 1, or a domain constraint)."""
    return job is not None and (job.min_available > 1 or job.topology.mode is not TopologyMode.NONE)


def in_gang(task: Task, jobs: Mapping[str, Job]) -> bool:
    """``task`` belongs to a gang (its Job is one by ``is_gang``)."""
    return bool(task.job) and is_gang(jobs.get(task.job))


def whole_gpus(task: Task) -> int:
    """GPUs a task takes wholly (shares count as one GPU's worth of room for capacity checks)."""
    req = task.gpu
    if req is None:
        return 0
    return req.count if req.whole else min(req.count, 1)


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
        if in_gang(task, jobs):
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
        if in_gang(alloc.task, jobs):
            out[alloc.task.job].append(alloc)
    return {job: tuple(allocs) for job, allocs in out.items()}
