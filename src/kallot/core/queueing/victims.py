"""Victim selection for preemption and reclaim: which running work to evict so one task fits.

Eviction units are whole: one task, or every running task of a gang (``gang.running_units``);
a unit is a candidate only if every member may be disrupted (not ``do_not_disrupt``, past its
``min_runtime_s``) and the calling action accepts it (queue and priority rules live there).
``plan_on_node`` is share-aware: it frees the GPUs, the share of one GPU or the MIG instance the
preemptor's request needs on that node, then host CPU / memory / pod slots, choosing the
cheapest units first. Cost of a set: (highest priority evicted, GPU-hours of work lost, pods).
The plan is only a proposal: the action tries it as a what-if in the Statement.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from kallot.core import fit, gang
from kallot.core.queueing import model_servers
from kallot.core.resources import MILLI
from kallot.core.snapshot import Allocation, Scratch, Snapshot
from kallot.core.workload import Job, Task

SECONDS_PER_HOUR = 3600.0

Cost = tuple[int, float, int]
NO_COST: Cost = (-(1 << 62), 0.0, 0)


def gpu_milli_held(alloc: Allocation) -> int:
    return sum(min(d.milli, MILLI) for d in alloc.devices)


def wasted_gpu_hours(alloc: Allocation, now: float) -> float:
    """GPU-hours of work lost if ``alloc`` is evicted now (it restarts from the beginning)."""
    return gpu_milli_held(alloc) / MILLI * max(0.0, now - alloc.started) / SECONDS_PER_HOUR


#: No cap on how long a task's own ``min_runtime_s`` shields it, unless the caller sets one:
#: the live scheduler passes its configuration's ``actions.maxMinRuntimeSeconds`` (at most
#: ``workload.MIN_RUNTIME_MAX_S``), so a pod borrowing another queue's capacity is
#: reclaimable at the latest that long after it started.
MAX_MIN_RUNTIME_S = math.inf


def may_disrupt(
    alloc: Allocation,
    now: float,
    max_min_runtime_s: float = MAX_MIN_RUNTIME_S,
    unshielded: frozenset[str] = frozenset(),
) -> bool:
    """Never a do-not-disrupt pod (unless the caller lists it ``unshielded``: reclaim, for the
    ones beyond their queue's guarantee); never before its minimum runtime (at most the cap)."""
    task = alloc.task
    if task.do_not_disrupt and task.id not in unshielded:
        return False
    return now - alloc.started >= min(task.min_runtime_s, max_min_runtime_s)


@dataclass(frozen=True, slots=True)
class Unit:
    """Running work evicted together (one task, or a whole gang) and what that costs."""

    allocs: tuple[Allocation, ...]
    cost: Cost
    name: str

    @property
    def task_ids(self) -> tuple[str, ...]:
        return tuple(a.task.id for a in self.allocs)


def add_costs(a: Cost, b: Cost) -> Cost:
    return (max(a[0], b[0]), a[1] + b[1], a[2] + b[2])


def units(
    running: Sequence[Allocation],
    jobs: Mapping[str, Job],
    now: float,
    accept: Callable[[tuple[Allocation, ...]], bool],
    max_min_runtime_s: float = MAX_MIN_RUNTIME_S,
    *,
    keep_last_replica: bool = True,
    unshielded: frozenset[str] = frozenset(),
) -> list[Unit]:
    """Eviction units among ``running`` (already-evicted work removed by the caller).
    ``max_min_runtime_s`` bounds every protection a pod asks for itself (min-runtime, model
    loading); ``keep_last_replica``: a model's last replica is not a candidate (reclaim passes
    False: ``model_servers``); ``unshielded``: do-not-disrupt tasks that are candidates anyway.

    A gang is a unit only when every running member may be disrupted and is accepted: one
    protected member protects the whole gang, which is what "whole or nothing" means.
    """
    by_gang = gang.running_units(running, jobs)
    servers = model_servers.protected(  # loading, or a model's last replica
        running, now, last_replica=keep_last_replica, max_protect_s=max_min_runtime_s
    )
    out: list[Unit] = []
    seen: set[str] = set()
    for alloc in running:
        task = alloc.task
        if gang.in_gang(task, jobs):
            if task.job in seen:
                continue
            seen.add(task.job)
            members = by_gang[task.job]
            name = f"gang/{task.job}"
        else:
            members = (alloc,)
            name = task.id
        if not all(
            may_disrupt(m, now, max_min_runtime_s, unshielded) for m in members
        ) or not accept(members):
            continue
        if any(m.task.id in servers for m in members):
            continue
        cost: Cost = (
            max(m.task.priority for m in members),
            sum(wasted_gpu_hours(m, now) for m in members),
            len(members),
        )
        out.append(Unit(allocs=members, cost=cost, name=name))
    out.sort(key=lambda u: (u.cost, u.name))
    return out


@dataclass(frozen=True, slots=True)
class Plan:
    node: int
    units: tuple[Unit, ...]
    cost: Cost


def plan_on_node(
    snapshot: Snapshot, scratch: Scratch, task: Task, node: int, candidates: Sequence[Unit]
) -> Plan | None:
    """The cheapest set of ``candidates`` whose eviction lets ``task`` fit on ``node``, or None.

    Only units with an allocation on ``node`` free anything there; their members elsewhere
    are evicted too (and counted in the cost). Greedy per resource, cheapest first: exact
    minimality is NP-hard in general, and the what-if in the Statement is the real test.
    """
    s, x = snapshot, scratch
    if not s.node_schedulable[node]:
        return None
    local = [u for u in candidates if any(a.node_row == node for a in u.allocs)]
    if not local:
        return None
    chosen: list[int] = []
    req = task.gpu
    if req is not None and req.count > 0:
        picked = _free_devices(s, x, task, node, local)
        if picked is None:
            return None
        chosen.extend(picked)
    host = _free_host(s, x, task, node, local=local, chosen=chosen)
    if host is None:
        return None
    chosen.extend(host)
    if not chosen:
        return None
    picked_units = tuple(local[i] for i in sorted(set(chosen)))
    cost = NO_COST
    for u in picked_units:
        cost = add_costs(cost, u.cost)
    return Plan(node=node, units=picked_units, cost=cost)


def _on_node(unit: Unit, node: int) -> list[Allocation]:
    return [a for a in unit.allocs if a.node_row == node]


def _free_devices(
    s: Snapshot, x: Scratch, task: Task, node: int, local: Sequence[Unit]
) -> list[int] | None:
    req = task.gpu
    assert req is not None
    if req.mig_profile:
        return _free_mig(s, x, req.mig_profile, node, local)
    g = s.max_gpus
    static = (fit.model_ok(s, req)[node] & fit.mode_ok(s, req)[node] & s.gpu_healthy[node])[:g]
    # Per slot: which local units hold it, and what each unit would give back there.
    holders: list[list[int]] = [[] for _ in range(g)]
    back_milli = np.zeros((len(local), g), dtype=np.int64)
    back_mem = np.zeros((len(local), g), dtype=np.int64)
    back_clients = np.zeros((len(local), g), dtype=np.int64)
    for i, unit in enumerate(local):
        for alloc in _on_node(unit, node):
            for d in alloc.devices:
                if d.mig is not None:
                    continue
                if i not in holders[d.slot]:
                    holders[d.slot].append(i)
                back_milli[i, d.slot] += d.milli
                back_mem[i, d.slot] += d.mem_mib
                back_clients[i, d.slot] += 1
    if req.whole:
        return _free_whole(
            x,
            node,
            req.count,
            static=static,
            holders=holders,
            back_clients=back_clients,
            local=local,
        )
    need_mem = fit.share_memory(s.gpu_mem_mib[node], req)
    best: tuple[Cost, int, list[int]] | None = None
    for slot in np.flatnonzero(static):
        left_milli = int(s.gpu_cap_milli[node, slot] - x.gpu_used_milli[node, slot])
        left_mem = int(s.gpu_cap_mem[node, slot] - x.gpu_used_mem[node, slot])
        clients = int(x.gpu_clients[node, slot])
        taken: list[int] = []
        cost = NO_COST
        # holders are in cost order because ``local`` is sorted by cost.
        for i in [*holders[slot], None]:
            fits = (
                left_milli >= req.milli
                and left_mem >= int(need_mem[slot])
                and clients < int(s.gpu_max_clients[node, slot])
            )
            if fits or i is None:
                break
            taken.append(i)
            cost = add_costs(cost, local[i].cost)
            left_milli += int(back_milli[i, slot])
            left_mem += int(back_mem[i, slot])
            clients -= int(back_clients[i, slot])
        fits = (
            left_milli >= req.milli
            and left_mem >= int(need_mem[slot])
            and clients < int(s.gpu_max_clients[node, slot])
        )
        if fits and (best is None or (cost, int(slot)) < (best[0], best[1])):
            best = (cost, int(slot), taken)
    return None if best is None else best[2]


def _free_whole(
    x: Scratch,
    node: int,
    count: int,
    *,
    static: NDArray[np.bool_],
    holders: list[list[int]],
    back_clients: NDArray[np.int64],
    local: Sequence[Unit],
) -> list[int] | None:
    """Free ``count`` whole GPUs: idle ones cost nothing; a busy one can be freed only when
    every client on it belongs to a candidate unit; pick the cheapest marginal slot each time."""
    idle = [
        int(g)
        for g in np.flatnonzero(static)
        if x.gpu_clients[node, g] == 0 and x.gpu_used_milli[node, g] == 0
    ]
    freeable = [
        int(g)
        for g in np.flatnonzero(static)
        if int(g) not in idle
        and holders[int(g)]
        and int(back_clients[holders[int(g)], int(g)].sum()) == int(x.gpu_clients[node, g])
    ]
    have = len(idle)
    chosen: set[int] = set()
    while have < count:
        best: tuple[Cost, int] | None = None
        for slot in freeable:
            cost = NO_COST
            for i in holders[slot]:
                if i not in chosen:
                    cost = add_costs(cost, local[i].cost)
            if best is None or (cost, slot) < best:
                best = (cost, slot)
        if best is None:
            return None
        slot = best[1]
        chosen.update(holders[slot])
        freeable.remove(slot)
        have += 1
        # A unit that held several slots may have freed others with it.
        for other in list(freeable):
            if all(i in chosen for i in holders[other]):
                freeable.remove(other)
                have += 1
    return sorted(chosen, key=lambda i: (local[i].cost, local[i].name))


def _free_mig(
    s: Snapshot, x: Scratch, profile: str, node: int, local: Sequence[Unit]
) -> list[int] | None:
    """An idle instance of ``profile`` on the node costs nothing; else evict the cheapest unit
    holding one (evicting work on other instances would not help: MIG slots are not fungible)."""
    mig = s.mig
    if profile not in mig.profiles:
        return None
    code = mig.profiles.index(profile)
    rows = np.flatnonzero((mig.node == node) & (mig.profile == code))
    if any(not x.mig_used[r] for r in rows):
        return []
    best: tuple[Cost, str, int] | None = None
    for r in rows:
        slot, start = int(mig.slot[r]), int(mig.start[r])
        for i, unit in enumerate(local):
            holds = any(
                d.mig is not None
                and d.slot == slot
                and d.mig.start == start
                and d.mig.profile == profile
                for a in _on_node(unit, node)
                for d in a.devices
            )
            if holds and (best is None or (unit.cost, unit.name) < best[:2]):
                best = (unit.cost, unit.name, i)
    return None if best is None else [best[2]]


def _free_host(
    s: Snapshot, x: Scratch, task: Task, node: int, *, local: Sequence[Unit], chosen: Sequence[int]
) -> list[int] | None:
    """Add the cheapest further units until CPU, memory and a pod slot are free on the node."""
    taken = set(chosen)

    def freed(i: int) -> tuple[int, int, int]:
        on = _on_node(local[i], node)
        return (sum(a.task.cpu_milli for a in on), sum(a.task.mem_mib for a in on), len(on))

    cpu = int(s.node_cpu_milli[node] - x.node_cpu_used[node])
    mem = int(s.node_mem_mib[node] - x.node_mem_used[node])
    pods = int(s.node_max_pods[node] - x.node_pods_used[node])
    for i in taken:
        c, m, p = freed(i)
        cpu, mem, pods = cpu + c, mem + m, pods + p
    extra: list[int] = []
    for i in range(len(local)):
        if cpu >= task.cpu_milli and mem >= task.mem_mib and pods >= 1:
            return extra
        if i in taken:
            continue
        c, m, p = freed(i)
        helps = (cpu < task.cpu_milli and c > 0) or (mem < task.mem_mib and m > 0) or pods < 1
        if not helps:
            continue
        extra.append(i)
        cpu, mem, pods = cpu + c, mem + m, pods + p
    if cpu >= task.cpu_milli and mem >= task.mem_mib and pods >= 1:
        return extra
    return None
