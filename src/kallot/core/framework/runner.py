"""``Framework``: runs one Profile's plugins over a task.

pre-filter -> filter (AND of masks over all nodes) -> score (weighted sum over candidates) ->
select (highest total; ties to the lowest seeded node rank) -> device choice on that node.
Reasons are gathered only when a task fits nowhere, so the hot path does no string work.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from kallot.core import fit, gang
from kallot.core.decision import ClaimDecision
from kallot.core.errors import ConfigError
from kallot.core.framework.cycle import SLOT_FIT, Cycle
from kallot.core.framework.plugin import (
    DeviceScorePlugin,
    FilterPlugin,
    GangTopologyPlugin,
    MigChooserPlugin,
    PreFilterPlugin,
    QueueSortPlugin,
    ReservePlugin,
    ScorePlugin,
)
from kallot.core.framework.profile import Profile
from kallot.core.framework.registry import Registry
from kallot.core.status import SUCCESS, Diagnosis, Reason, Status
from kallot.core.workload import Task


class Framework:
    """One Profile's plugin instances, ready to run. Stateless across sessions."""

    def __init__(self, profile: Profile, registry: Registry) -> None:
        self.profile = profile
        instances: dict[str, Any] = {
            name: registry.create(name, profile.args.get(name)) for name in profile.plugin_names()
        }
        self.plugins = instances
        self.queue_sort: QueueSortPlugin = instances[profile.queue_sort]
        self.pre_filters: tuple[PreFilterPlugin, ...] = tuple(
            instances[n] for n in profile.pre_filter
        )
        self.filters: tuple[FilterPlugin, ...] = tuple(instances[n] for n in profile.filter)
        self.scores: tuple[tuple[ScorePlugin, float], ...] = tuple(
            (instances[n], float(w)) for n, w in profile.score
        )
        self.device_scores: tuple[DeviceScorePlugin, ...] = tuple(
            instances[n] for n in profile.device_score
        )
        # Reserve: the declared plugins the profile has (DraAllocation: claim allocations).
        self.reserves: tuple[ReservePlugin, ...] = tuple(
            instances[n] for n in profile.reserve if n in instances
        )
        # The filter that serves MIG requests (MigFit), as the profile declares it.
        if profile.mig and profile.mig not in profile.filter:
            raise ConfigError("profile.mig", profile.mig, "a plugin listed in profile.filter")
        self.mig: MigChooserPlugin | None = instances[profile.mig] if profile.mig else None
        # How gangs use topology, from the plugin the profile declares (else topology-blind).
        self.gang_topology: gang.GangTopology = gang.BLIND
        if profile.gang_topology:
            carrier: GangTopologyPlugin = instances[profile.gang_topology]
            try:
                self.gang_topology = carrier.gang_topology
            except AttributeError:
                raise ConfigError(
                    "profile.gang_topology",
                    profile.gang_topology,
                    "a plugin that carries a GangTopology (Topology, RequiredTopology)",
                ) from None

    def pre_filter(self, cycle: Cycle, task: Task) -> Status:
        for plugin in self.pre_filters:
            status = plugin.pre_filter(cycle, task)
            if not status.ok:
                return Status(status.code, status.reason, status.plugin or plugin.name)
        return SUCCESS

    def feasible(self, cycle: Cycle, task: Task) -> NDArray[np.intp]:
        """Rows of the nodes that pass every filter (a filter that returns None passes all)."""
        mask: NDArray[np.bool_] | None = None
        owned = False  # mask is our own array (not a plugin's, possibly cached): AND in place
        for plugin in self.filters:
            m = plugin.filter(cycle, task)
            if m is None:
                continue
            if mask is None:
                mask = m
            elif owned:
                np.logical_and(mask, m, out=mask)
            else:
                mask, owned = mask & m, True
        if mask is None:
            return np.arange(cycle.snapshot.n_nodes, dtype=np.intp)
        return mask.nonzero()[0]  # np.flatnonzero without its Python wrapper (1-D mask)

    def diagnose(self, cycle: Cycle, task: Task) -> Diagnosis:
        """Per-plugin reasons why no node fits (each node charged to its first rejecting filter)."""
        n = cycle.snapshot.n_nodes
        undecided = np.ones(n, dtype=np.bool_)
        reasons: list[Reason] = []
        for plugin in self.filters:
            mask = plugin.filter(cycle, task)
            if mask is None:
                continue
            rejected = undecided & ~mask
            if not rejected.any():
                continue
            covered = np.zeros(n, dtype=np.bool_)
            for rej in plugin.explain(cycle, task, rejected):
                hit = rej.nodes & rejected & ~covered
                if hit.any():
                    reasons.append(
                        Reason(plugin.name, rej.message, int(hit.sum()), rej.unresolvable)
                    )
                    covered |= hit
            rest = rejected & ~covered
            if rest.any():
                reasons.append(Reason(plugin.name, "rejected", int(rest.sum())))
            undecided &= ~rejected
        reasons.sort(key=lambda r: (-r.nodes, r.plugin, r.message))
        return Diagnosis(reasons=tuple(reasons), nodes_considered=n)

    def score(self, cycle: Cycle, task: Task, candidates: NDArray[np.intp]) -> NDArray[np.float64]:
        if self.mig is not None and self.mig.serves(cycle, task):
            # Milli-GPU fragment scores say nothing about MIG slots: the MIG plugin ranks alone
            # (MIG requests, and shares it may serve with a MIG instance or a share slot).
            return self.mig.score(cycle, task, candidates)
        # The weighted sum in profile order, without the plugins that return None (no
        # opinion) or all zeros: adding zeros would not change a bit of the total
        # (x + 0.0 == x), and a weight of 1 multiplies nothing, so the total is the same float
        # as the full sum. (The zero test, a few µs on 10,000 nodes, saves the multiply and
        # the add of a plugin that returns zeros instead of None.)
        total: NDArray[np.float64] | None = None
        owned = False  # total is our own array (a plugin's may be its cache): add in place
        for plugin, weight in self.scores:
            s = plugin.score(cycle, task, candidates)
            if s is None or (total is not None and not s.any()):
                continue
            part = s if weight == 1.0 and s.dtype == np.float64 else weight * s
            if total is None:
                total, owned = part, part is not s
            elif owned:
                total += part
            else:
                total, owned = total + part, True
        if total is None:
            return np.zeros(candidates.size, dtype=np.float64)
        return total

    @staticmethod
    def select(cycle: Cycle, candidates: NDArray[np.intp], totals: NDArray[np.float64]) -> int:
        """The highest total; among equal totals the node with the lowest seeded rank."""
        if candidates.size == 1:
            return int(candidates[0])
        # ufunc and method calls, not the numpy functions' Python wrappers: the same values
        best = totals == np.maximum.reduce(totals)
        tied = candidates[best]
        if tied.size == 1:
            return int(tied[0])
        return int(tied[cycle.tie_rank[tied].argmin()])

    def reserve(self, cycle: Cycle, task: Task, node: int) -> ClaimDecision | str | None:
        """The Reserve plugins' decision for the task on ``node``: the first ClaimDecision, or
        the first reason the node cannot take it after all; None when none decides anything."""
        decided: ClaimDecision | None = None
        for plugin in self.reserves:
            got = plugin.reserve(cycle, task, node)
            if isinstance(got, str):
                return got
            if got is not None and decided is None:
                decided = got
        return decided

    def choose_devices(self, cycle: Cycle, task: Task, node: int) -> tuple[int, ...]:
        """GPU slots on ``node`` for the task: DeviceScore plugins in order, then the default."""
        req = task.gpu
        if req is None or req.count == 0 or req.mig_profile:
            return ()
        # DeviceFit's mask of this cycle when it ran (the same rule, current), else computed.
        cached = cycle.state.get(SLOT_FIT)
        slot_fit = (
            cached[node]
            if cached is not None
            else fit.slot_fit_node(cycle.snapshot, cycle.scratch, req, node)
        )
        feasible = slot_fit.nonzero()[0]  # np.flatnonzero without its wrapper (1-D mask)
        for plugin in self.device_scores:
            chosen = plugin.choose(cycle, task, node, feasible)
            if chosen is not None:
                return chosen
        return default_devices(cycle, task, node, feasible)


def default_devices(
    cycle: Cycle, task: Task, node: int, feasible: NDArray[np.intp]
) -> tuple[int, ...]:
    """Whole GPUs: the lowest-index free slots. Shares: the tightest fit (least compute left after
    placing), lowest index on ties. This is the FGD simulator's 'best' GPU selection. Fewer
    slots than the request needs (none fits on this node) when ``feasible`` is too small: the
    Session then passes over the node."""
    req = task.gpu
    assert req is not None
    if feasible.size == 0:
        return ()
    if req.whole:
        return tuple(int(g) for g in feasible[: req.count])
    left = (
        cycle.snapshot.gpu_cap_milli[node, feasible] - cycle.scratch.gpu_used_milli[node, feasible]
    )
    return (int(feasible[int(np.argmin(left))]),)
