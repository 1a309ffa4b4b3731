"""Filter: a CPU-only task does not take the CPU that a GPU node's idle GPUs need, once the
target workload runs out of CPU before GPU (issue 23, design note 002 section 9.5).

Where it sits: in the ``kallot`` profile (``core.policies``), after the resource filters. Its
arithmetic is ``helpers.kallot_frag`` (``cpu_per_gpu``, ``cpu_scarcity``, ``idle_milli``), the
same ratio KallotScore's ``dStranded`` term uses. The nodes' idle milli-GPU is kept per session
and recomputed only for the nodes that changed (``Scratch.node_version``), so a CPU-only task
costs O(N) compares plus O(changed x G), like the other filters.

The target workload's GPU tasks need ``c`` milli-CPU per milli-GPU (``cpu_per_gpu``). When the
CPU the target asks for at the moment its GPU requests reach the cluster's GPU capacity exceeds
the cluster's CPU (``rho = cpu_scarcity >= 1``), CPU, not GPU, runs out first, and every
milli-CPU a CPU-only task takes next to an idle GPU is a milli-CPU some GPU task will miss: the
GPU it would have fed stays idle. Then a CPU-only task may go on a node only if the node keeps
``idle * c`` milli-CPU free after it (``idle``: the node's idle milli-GPU): it takes only CPU
that the node's idle GPUs cannot use. Nodes whose GPUs are all allocated (and nodes without
GPUs) reserve nothing, so CPU-only tasks still go there; a CPU-only task that fits only by
taking reserved CPU stays pending (in the openb protocol: fails), as a taint on GPU nodes
would keep it off them, but only while GPU tasks are expected to need that CPU.

Below ``rho = 1`` the filter passes every node: CPU is not what runs out, and KallotScore's
``dStranded`` term already keeps CPU-only tasks where they strand no GPU. Nor does it hold CPU
in a session with no GPU task pending: the reserve is for GPU tasks that are waiting, not for
ones a learned target merely expects (a live cluster of GPU nodes running only CPU-only pods
schedules them as before). GPU tasks are never filtered. What it costs and gains on the CPU-heavy family (GPU allocation against CPU-only pods
turned away and cluster CPU used) is in BENCHMARKS.md, "Issue 23".
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from numpy.typing import NDArray

from kallot.core import frag
from kallot.core.framework.cycle import PENDING, Cycle, StateKey
from kallot.core.framework.plugin import FilterPlugin, Rejection
from kallot.core.helpers.frag_score import target_of
from kallot.core.helpers.kallot_frag import cpu_per_gpu, cpu_scarcity, idle_milli
from kallot.core.workload import Task

BOOL = NDArray[np.bool_]
I64 = NDArray[np.int64]


class CpuReserve:
    """Args: ``target`` (TargetWorkload; learned from the running and pending tasks when
    absent, as KallotScore learns it)."""

    name: ClassVar[str] = "CpuReserve"

    def __init__(self, target: frag.TargetWorkload | None = None) -> None:
        self._target = target
        self._key: StateKey[float] = StateKey(f"{self.name}/ratio")
        self._idle_key: StateKey[tuple[I64, I64]] = StateKey(f"{self.name}/idle")

    def ratio(self, cycle: Cycle) -> float:
        """``c`` while the session's target runs out of CPU first and GPU tasks are pending in
        the session, else 0 (once per session)."""
        ratio = cycle.session.get(self._key)
        if ratio is None:
            ratio = 0.0
            if any(t.gpu is not None for t in cycle.session.get(PENDING) or ()):
                target = target_of(cycle, self._target)
                inputs = frag.FragInputs.build(target, cycle.snapshot.models)
                if cpu_scarcity(inputs, cycle.snapshot) >= 1.0:
                    ratio = cpu_per_gpu(inputs)
            cycle.session.put(self._key, ratio)
        return ratio

    def idle(self, cycle: Cycle) -> I64:
        """``[N]`` idle milli-GPU per node, refreshed for the nodes changed since last asked."""
        x = cycle.scratch
        cached = cycle.session.get(self._idle_key)
        if cached is None:
            rows = np.arange(cycle.snapshot.n_nodes, dtype=np.intp)
            cached = (idle_milli(cycle.snapshot, x, rows), x.node_version.copy())
            cycle.session.put(self._idle_key, cached)
            return cached[0]
        idle, version = cached
        stale = np.flatnonzero(version != x.node_version)
        if stale.size:
            idle[stale] = idle_milli(cycle.snapshot, x, stale)
            version[stale] = x.node_version[stale]
        return idle

    def reserved(self, cycle: Cycle, ratio: float) -> NDArray[np.float64]:
        """``[N]`` milli-CPU each node keeps for its idle GPUs at ``ratio``."""
        return np.asarray(self.idle(cycle) * ratio, dtype=np.float64)

    def filter(self, cycle: Cycle, task: Task) -> BOOL | None:
        # None: no opinion (the framework skips it), for GPU tasks and while CPU is not scarce.
        if task.gpu is not None or task.cpu_milli <= 0:
            return None
        ratio = self.ratio(cycle)
        if ratio <= 0:
            return None
        s, x = cycle.snapshot, cycle.scratch
        free = s.node_cpu_milli - x.node_cpu_used - task.cpu_milli
        return np.asarray(free >= self.reserved(cycle, ratio), dtype=np.bool_)

    def explain(self, cycle: Cycle, task: Task, rejected: BOOL) -> tuple[Rejection, ...]:
        ratio = self.ratio(cycle)
        if not rejected.any() or ratio <= 0:
            return ()
        s, x = cycle.snapshot, cycle.scratch
        spare = s.node_cpu_milli - x.node_cpu_used - self.reserved(cycle, ratio)
        best = int(max(0.0, float(spare[rejected].max())))
        return (
            Rejection(
                f"cpu kept for the node's idle GPUs (CPU runs out before GPU): need "
                f"{task.cpu_milli}m, largest unreserved is {best}m",
                rejected,
            ),
        )


_: type[FilterPlugin] = CpuReserve
