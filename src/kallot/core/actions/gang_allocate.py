"""Gang allocate: a Job's tasks start together (at least ``min_available`` of them) or none do,
optionally inside one topology domain (one host, rack or block). What a gang is lives in
``core.gang``; this is how one is placed.

Where it sits: the actions layer. ``Allocate`` (``core.actions.allocate``) and ``QueueAllocate``
(``core.actions.queue``) hand each gang to ``place_gang``. Every try runs the normal per-task
framework through ``Session.place`` under one Statement checkpoint; a try that falls short is
rolled back, so no partial allocation survives the session. The plugins that keep a gang in its
domain (Topology, RequiredTopology) read the ``GangContext`` put here under
``framework.cycle.GANG_CONTEXT``; how gangs use topology is the profile's declared
``GangTopology`` (``Framework.gang_topology``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from kallot.core import topology
from kallot.core.decision import Placement
from kallot.core.framework.cycle import GANG_CONTEXT, StateKey
from kallot.core.gang import GANG, GANG_QUORUM, GangTopology, whole_gpus
from kallot.core.session.session import Session
from kallot.core.status import Diagnosis, Reason
from kallot.core.workload import Job, Task, TopologyMode

MAX_DOMAIN_TRIES = 8  # per level: domains tried in best-fit order before giving up on a level


@dataclass(frozen=True, slots=True)
class GangOutcome:
    """What happened to one gang in a session.

    ``placed``: the placements that stand (empty when the gang did not start); ``domain``: the
    domain it was placed in ("" when unconstrained or not placed); ``diagnosis``: why it did not
    start (None when it did); ``tries``: how many placement attempts were made (and rolled back
    but the last); ``left_out``: tasks of a started gang that did not fit, with their reasons.
    """

    job: str
    placed: tuple[Placement, ...]
    left_out: tuple[tuple[str, Diagnosis], ...] = ()
    domain: str = ""
    diagnosis: Diagnosis | None = None
    tries: int = 0

    @property
    def started(self) -> bool:
        return self.diagnosis is None


def place_gang(
    session: Session, job: Job, tasks: Sequence[Task], settings: GangTopology | None = None
) -> GangOutcome:
    """Place ``tasks`` of ``job`` all-or-nothing; on failure nothing of the gang stays allocated.

    Members already running (``Snapshot.running``) count towards ``min_available``. Tries, in
    order: for a domain constraint, one domain at a time at each level from the narrowest
    configured one up to the named one (the host level only when it is the one named), domains
    whose well-linked nodes hold the gang first, then in best-fit order (fewest free GPUs that
    still hold the gang, so large domains stay whole for large gangs); then, for ``preferred``
    (or no constraint), the whole cluster. Tasks that do not fit are rejected by the caller with
    ``outcome.diagnosis`` (or, when the gang started with some tasks left out, with the per-task
    reasons).
    """
    if settings is None:
        settings = session.framework.gang_topology
    running = int(_running_peers(session, job.id).sum())
    quorum = max(job.min_available - running, 0)
    if len(tasks) < quorum:
        return _fail(
            job,
            f"gang {job.id}: {len(tasks) + running} of {job.min_available} required tasks are "
            "pending or running (waiting for the rest)",
            tries=0,
            plugin=GANG_QUORUM,
        )
    c = job.topology
    honour = c.mode is TopologyMode.REQUIRED or (
        c.mode is TopologyMode.PREFERRED and settings.aware
    )
    failures: list[str] = []
    tries = 0
    if honour:
        if c.mode is TopologyMode.REQUIRED and not (settings.aware or settings.enforces_required):
            return _fail(
                job,
                f"gang {job.id}: requires one {c.level!r} domain but profile "
                f"{session.framework.profile.name!r} has no Topology or RequiredTopology plugin "
                "to honour it",
                tries=0,
                unresolvable=True,
            )
        level = settings.cluster.resolve(c.level)
        if level is None:
            names = ", ".join(lv.name for lv in settings.cluster.levels)
            return _fail(
                job,
                f"gang {job.id}: topology level {c.level!r} is not configured, expected one of "
                f"{names} or a node label key",
                tries=0,
                unresolvable=True,
            )
        blocked = _exclusive_blocked(session, job, settings.cluster, level)
        for lv in _levels_to_try(settings.cluster, level):
            outcome, n, why = _try_domains(
                session,
                job,
                tasks,
                quorum=quorum,
                cluster=settings.cluster,
                level=lv,
                blocked=blocked,
            )
            tries += n
            if outcome is not None:
                (placed, left), name = outcome
                if job.exclusive:
                    _take_exclusive(session, settings.cluster, level, placed)
                return GangOutcome(job.id, placed, left, domain=name, tries=tries)
            failures.append(why)
        if c.mode is TopologyMode.REQUIRED:
            return _fail(job, f"gang {job.id}: " + "; ".join(failures), tries=tries)
    attempt, why = _try(session, job, tasks, quorum=quorum, allowed=None, name="")
    tries += 1
    if attempt is not None:
        return GangOutcome(job.id, attempt[0], attempt[1], tries=tries)
    return _fail(job, f"gang {job.id}: " + "; ".join([*failures, why]), tries=tries)


def _fail(
    job: Job, message: str, *, tries: int, unresolvable: bool = False, plugin: str = GANG
) -> GangOutcome:
    diag = Diagnosis(reasons=(Reason(plugin, message, 0, unresolvable),), summary=message)
    return GangOutcome(job.id, (), diagnosis=diag, tries=tries)


def _try_domains(
    session: Session,
    job: Job,
    tasks: Sequence[Task],
    *,
    quorum: int,
    cluster: topology.ClusterTopology,
    level: topology.ClusterLevel,
    blocked: NDArray[np.bool_] | None = None,
) -> tuple[tuple[Attempt, str] | None, int, str]:
    """Try the domains of ``level`` that can hold the gang, best fit first (none of the
    ``blocked`` nodes: domains of other exclusive gangs)."""
    snap = session.snapshot
    domains = cluster.domains(snap.labels, level)
    if blocked is not None:
        domains = np.where(blocked, -1, domains)
    if (domains < 0).all():
        if blocked is not None and blocked.any():
            return None, 0, f"every {level.name} domain is held by another exclusive gang"
        return None, 0, f"no node carries the {level.label} label"
    need = sum(sorted(whole_gpus(t) for t in tasks)[:quorum])
    free = free_whole_gpus(session) * snap.node_schedulable
    inside = domains >= 0
    n_dom = int(domains.max()) + 1
    cap = np.bincount(domains[inside], weights=free[inside], minlength=n_dom)
    fits = np.flatnonzero(cap >= need)
    if fits.size == 0:
        best = int(cap.max()) if cap.size else 0
        return None, 0, f"no {level.name} has {need} free GPUs (most free in one: {best})"
    # Domains whose well-linked nodes alone hold the gang come first: nodes with one free NVLink
    # island as large as the gang (or as a whole node, for gangs larger than a node). Within each class best fit: the
    # fewest free GPUs that hold the gang, so large domains stay whole for large gangs. Ties go
    # to the domain whose first node has the lowest seeded rank (deterministic, not always the
    # first domain).
    group = min(sum(whole_gpus(t) for t in tasks), snap.max_gpus)
    linked = free * _well_linked(session, group)
    good = np.bincount(domains[inside], weights=linked[inside], minlength=n_dom) >= need
    first_rank = np.full(n_dom, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first_rank, domains[inside], session.tie_rank[inside])
    order = fits[np.lexsort((first_rank[fits], cap[fits], ~good[fits]))]
    tries = 0
    last = ""
    for d in order[:MAX_DOMAIN_TRIES]:
        mask = np.asarray(domains == d, dtype=np.bool_)
        name = cluster.domain_name(snap.labels, level, int(np.flatnonzero(mask)[0]))
        attempt, why = _try(session, job, tasks, quorum=quorum, allowed=mask, name=name)
        tries += 1
        if attempt is not None:
            return (attempt, name), tries, ""
        last = why
    return (
        None,
        tries,
        f"{tries} {level.name} domain{'s' if tries != 1 else ''} with {need} free GPUs tried, "
        f"none fits ({last})",
    )


Attempt = tuple[tuple[Placement, ...], tuple[tuple[str, Diagnosis], ...]]


def _try(
    session: Session,
    job: Job,
    tasks: Sequence[Task],
    *,
    quorum: int,
    allowed: NDArray[np.bool_] | None,
    name: str,
) -> tuple[Attempt | None, str]:
    """Place the tasks in queue order; when that falls short of the quorum and the gang has
    more members than it needs, of different sizes, once more smallest first (two large
    members first can leave no room for a third where three small ones fit)."""
    attempt, why = _try_once(session, job, tasks, quorum=quorum, allowed=allowed, name=name)
    if attempt is not None or quorum >= len(tasks):
        return attempt, why
    smallest = sorted(tasks, key=whole_gpus)
    if [whole_gpus(t) for t in smallest] == [whole_gpus(t) for t in tasks]:
        return attempt, why
    again, _ = _try_once(session, job, smallest, quorum=quorum, allowed=allowed, name=name)
    return (again, "") if again is not None else (attempt, why)


def _try_once(
    session: Session,
    job: Job,
    tasks: Sequence[Task],
    *,
    quorum: int,
    allowed: NDArray[np.bool_] | None,
    name: str,
) -> tuple[Attempt | None, str]:
    """One attempt under one checkpoint: place every task; keep it only if enough fit."""
    statement = session.statement
    cp = statement.checkpoint()
    ctx = topology.GangContext(
        job=job.id,
        peers=_running_peers(session, job.id),
        remaining_gpus=sum(whole_gpus(t) for t in tasks),
        allowed=allowed,
        domain=name,
    )
    session.shared.put(GANG_CONTEXT, ctx)
    placed: list[Placement] = []
    left: list[tuple[str, Diagnosis]] = []
    first: Diagnosis | None = None
    try:
        for i, task in enumerate(tasks):
            result = session.place(task)
            ctx.remaining_gpus -= whole_gpus(task)
            if isinstance(result, Diagnosis):
                first = first or result
                left.append((task.id, result))
                if len(tasks) - (i + 1) + len(placed) < quorum:
                    break  # cannot reach the quorum any more
                continue
            placed.append(result)
            ctx.peers[result.node_row] += 1
            ctx.slots.setdefault(result.node_row, []).extend(d.slot for d in result.devices)
    finally:
        session.shared.put(GANG_CONTEXT, None)
    if len(placed) >= quorum:
        return (tuple(placed), tuple(left)), ""
    statement.rollback(cp)
    where = f" in {name}" if name else ""
    detail = f": {first.message()}" if first is not None else ""
    return None, f"only {len(placed)} of {quorum} required tasks fit{where}{detail}"


def _levels_to_try(
    cluster: topology.ClusterTopology, level: topology.ClusterLevel
) -> tuple[topology.ClusterLevel, ...]:
    """Narrowest first up to ``level``, without the host level unless it is the one asked for:
    inside a wider domain the Topology score already packs a gang onto one host when one has
    room (and it weighs link quality, which per-host tries in best-fit order would not)."""
    levels = cluster.narrower_first(level)
    if len(levels) > 1 and levels[0].label == topology.HOSTNAME_LABEL:
        return levels[1:]
    return levels


_GROUPS: StateKey[topology.NodeGroups] = StateKey("Gang/groups")
# Nodes in domains this session gave to exclusive gangs (Job.exclusive).
_EXCLUSIVE: StateKey[NDArray[np.bool_]] = StateKey("Gang/exclusive")


def _exclusive_blocked(
    session: Session, job: Job, cluster: topology.ClusterTopology, level: topology.ClusterLevel
) -> NDArray[np.bool_] | None:
    """[N] nodes an exclusive gang may not use: whole ``level`` domains holding a node of
    ``job.avoid_nodes`` or given to another exclusive gang in this session; None if none."""
    if not job.exclusive:
        return None
    snap = session.snapshot
    held = np.fromiter(
        (n in job.avoid_nodes for n in snap.node_names), dtype=np.bool_, count=snap.n_nodes
    )
    taken = session.shared.get(_EXCLUSIVE)
    if taken is not None:
        held |= taken
    domains = cluster.domains(snap.labels, level)
    return np.asarray(np.isin(domains, domains[held & (domains >= 0)]), dtype=np.bool_)


def _take_exclusive(
    session: Session,
    cluster: topology.ClusterTopology,
    level: topology.ClusterLevel,
    placed: Sequence[Placement],
) -> None:
    snap = session.snapshot
    domains = cluster.domains(snap.labels, level)
    mine = {int(domains[p.node_row]) for p in placed if domains[p.node_row] >= 0}
    taken = session.shared.get(_EXCLUSIVE)
    if taken is None:
        taken = np.zeros(snap.n_nodes, dtype=np.bool_)
    session.shared.put(_EXCLUSIVE, taken | np.isin(domains, list(mine)))


def _well_linked(session: Session, per_pod: int) -> NDArray[np.bool_]:
    """[N] nodes whose free GPUs hold ``per_pod`` GPUs in one NVLink island."""
    if per_pod < 2:
        return np.ones(session.snapshot.n_nodes, dtype=np.bool_)
    groups = session.shared.get(_GROUPS)
    if groups is None:
        groups = topology.NodeGroups.of(session.snapshot)
        session.shared.put(_GROUPS, groups)
    s, x = session.snapshot, session.scratch
    idle = s.gpu_valid & s.gpu_healthy & (x.gpu_clients == 0) & (x.gpu_used_milli == 0)
    return np.asarray(topology.largest_group(idle, groups.island) >= per_pod, dtype=np.bool_)


def _running_peers(session: Session, job_id: str) -> NDArray[np.int32]:
    peers = np.zeros(session.snapshot.n_nodes, dtype=np.int32)
    for a in session.snapshot.running:
        if a.task.job == job_id:
            peers[a.node_row] += 1
    return peers


def free_whole_gpus(session: Session) -> NDArray[np.int64]:
    """[N] idle, healthy GPUs per node in the session's current state."""
    s, x = session.snapshot, session.scratch
    idle = s.gpu_valid & s.gpu_healthy & (x.gpu_clients == 0) & (x.gpu_used_milli == 0)
    return np.asarray(idle.sum(axis=1), dtype=np.int64)
