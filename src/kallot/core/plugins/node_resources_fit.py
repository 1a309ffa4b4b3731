"""Filter: enough CPU, memory and pod slots on the node, and the node is schedulable.

Mirrors kube-scheduler's NodeResourcesFit (plus NodeUnschedulable), which is all the FGD
simulator checks for host resources.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from numpy.typing import NDArray

from kallot.core.framework.cycle import Cycle, StateKey
from kallot.core.framework.plugin import FilterPlugin, Rejection
from kallot.core.workload import Task


@dataclass(slots=True)
class _Free:
    """Per node: schedulable with a free pod slot, free CPU, free memory; current for every
    node as of ``mark`` (``Scratch.mark``)."""

    slot: NDArray[np.bool_]
    cpu: NDArray[np.int64]
    mem: NDArray[np.int64]
    mark: int


_FREE: StateKey[_Free] = StateKey("NodeResourcesFit/free")


@dataclass(slots=True)
class _Fits:
    """Per node: the filter's answer for one (cpu, memory) request, current as of ``mark``."""

    ok: NDArray[np.bool_]
    mark: int


_FITS: StateKey[dict[tuple[int, int], _Fits]] = StateKey("NodeResourcesFit/fits")


def _free(cycle: Cycle) -> _Free:
    """The session's free resources per node, refreshed only on the nodes touched since they
    were last read (``Scratch.changed_since``): a placement changes one node, so a filter
    call is three compares over N instead of the subtractions too."""
    s, x = cycle.snapshot, cycle.scratch
    free = cycle.session.get(_FREE)
    if free is None:
        free = _Free(
            s.node_schedulable & (x.node_pods_used < s.node_max_pods),
            s.node_cpu_milli - x.node_cpu_used,
            s.node_mem_mib - x.node_mem_used,
            x.mark,
        )
        cycle.session.put(_FREE, free)
    elif free.mark != x.mark:
        rows = x.changed_since(free.mark)
        free.slot[rows] = s.node_schedulable[rows] & (
            x.node_pods_used[rows] < s.node_max_pods[rows]
        )
        free.cpu[rows] = s.node_cpu_milli[rows] - x.node_cpu_used[rows]
        free.mem[rows] = s.node_mem_mib[rows] - x.node_mem_used[rows]
        free.mark = x.mark
    return free


# Below this many nodes a full compare costs less than refreshing the touched rows.
INCREMENTAL_NODES = 4096


def _fits(
    free: _Free, rows: slice | NDArray[np.intp], key: tuple[int, int]
) -> NDArray[np.bool_]:
    """The filter's answer for a (cpu, memory) request on ``rows`` of ``free`` (current)."""
    cpu, mem = key
    if not (cpu or mem):
        return free.slot[rows].copy()  # never a view of ``free``: the cache writes its rows
    ok = free.slot[rows]
    if cpu:
        ok = ok & (free.cpu[rows] >= cpu)
    if mem:
        ok = ok & (free.mem[rows] >= mem)
    return ok


class NodeResourcesFit:
    name: ClassVar[str] = "NodeResourcesFit"

    def filter(self, cycle: Cycle, task: Task) -> NDArray[np.bool_]:
        s, x = cycle.snapshot, cycle.scratch
        if s.n_nodes < INCREMENTAL_NODES:
            ok = s.node_schedulable & (x.node_pods_used < s.node_max_pods)
            if task.cpu_milli:
                ok &= s.node_cpu_milli - x.node_cpu_used >= task.cpu_milli
            if task.mem_mib:
                ok &= s.node_mem_mib - x.node_mem_used >= task.mem_mib
            return ok
        # The answer per (cpu, memory) request, kept for the session and refreshed only on
        # the nodes touched since it was current: a placement costs O(touched rows) instead of
        # up to three compares and two ANDs over N (openb's default trace has 87 request
        # signatures, so the cache stays small).
        cache = cycle.session.get(_FITS)
        if cache is None:
            cache = {}
            cycle.session.put(_FITS, cache)
        key = (task.cpu_milli, task.mem_mib)
        entry = cache.get(key)
        if entry is None:
            free = _free(cycle)
            entry = cache[key] = _Fits(_fits(free, slice(None), key), x.mark)
        elif entry.mark != x.mark:
            free = _free(cycle)
            rows = x.changed_since(entry.mark)
            entry.ok[rows] = _fits(free, rows, key)
            entry.mark = x.mark
        ok = entry.ok.view()
        ok.setflags(write=False)
        return ok

    def explain(
        self, cycle: Cycle, task: Task, rejected: NDArray[np.bool_]
    ) -> tuple[Rejection, ...]:
        s, x = cycle.snapshot, cycle.scratch
        out = []
        unsched = rejected & ~s.node_schedulable
        if unsched.any():
            out.append(Rejection("node is unschedulable (cordoned or not ready)", unsched))
        cpu_left = s.node_cpu_milli - x.node_cpu_used
        short_cpu = rejected & s.node_schedulable & (cpu_left < task.cpu_milli)
        if short_cpu.any():
            best = int(cpu_left[short_cpu].max())
            out.append(
                Rejection(
                    f"insufficient cpu: need {task.cpu_milli}m, largest free is {max(best, 0)}m",
                    short_cpu,
                    unresolvable=bool((s.node_cpu_milli[short_cpu] < task.cpu_milli).all()),
                )
            )
        mem_left = s.node_mem_mib - x.node_mem_used
        short_mem = rejected & s.node_schedulable & (mem_left < task.mem_mib)
        if short_mem.any():
            best = int(mem_left[short_mem].max())
            out.append(
                Rejection(
                    f"insufficient memory: need {task.mem_mib} MiB, largest free is "
                    f"{max(best, 0)} MiB",
                    short_mem,
                )
            )
        full = rejected & (x.node_pods_used >= s.node_max_pods)
        if full.any():
            out.append(Rejection("too many pods", full))
        return tuple(out)


_: type[FilterPlugin] = NodeResourcesFit
