"""Filters and scores on node facts, after kube-scheduler's plugins of the same names:
NodeUnschedulable, TaintToleration (NoSchedule/NoExecute filter, PreferNoSchedule score),
NodeAffinity (required filter, preferred score), NodePorts, NodeResourcesFit for resources the
core does not model otherwise (ephemeral-storage, extended resources), VolumeBinding (node
topology of a pod's volumes, resolved by the shell) and NominatedNode (a preemptor prefers the
node its victims left).

Every plugin passes a task without ``k8s`` (simulations) through unchanged: its filter and
score return None (nothing to say about the task), so the Framework skips them.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from numpy.typing import NDArray

from kallot.core import k8s
from kallot.core.framework.cycle import Cycle
from kallot.core.framework.plugin import MAX_SCORE, FilterPlugin, Rejection, ScorePlugin
from kallot.core.helpers.k8s_pods import (
    normalize,
    placed,
    selector_mask,
    taint_mask,
    term_mask,
)
from kallot.core.workload import Task

BOOL = NDArray[np.bool_]
F64 = NDArray[np.float64]

_UNSCHEDULABLE_TAINT = k8s.Taint(k8s.TAINT_UNSCHEDULABLE, "", k8s.Effect.NO_SCHEDULE)
_PREFER = frozenset({k8s.Effect.PREFER_NO_SCHEDULE.value})


class NodeUnschedulable:
    """A cordoned node (spec.unschedulable) takes only pods that tolerate
    ``node.kubernetes.io/unschedulable:NoSchedule``."""

    name: ClassVar[str] = "NodeUnschedulable"

    def filter(self, cycle: Cycle, task: Task) -> BOOL | None:
        cordoned = cycle.snapshot.node_unschedulable
        if cordoned is None:
            return None
        tolerations = task.k8s.tolerations if task.k8s is not None else ()
        if k8s.tolerated(_UNSCHEDULABLE_TAINT, tolerations):
            return None
        return ~cordoned

    def explain(self, cycle: Cycle, task: Task, rejected: BOOL) -> tuple[Rejection, ...]:
        return (Rejection("node is cordoned (spec.unschedulable)", rejected),)


class TaintToleration:
    """Filter: every NoSchedule and NoExecute taint of the node is tolerated. Score: fewer
    untolerated PreferNoSchedule taints is better."""

    name: ClassVar[str] = "TaintToleration"

    def filter(self, cycle: Cycle, task: Task) -> BOOL | None:
        if not cycle.snapshot.node_taints:
            return None
        tolerations = task.k8s.tolerations if task.k8s is not None else ()
        return taint_mask(cycle.snapshot, tolerations, k8s.HARD_EFFECTS)

    def explain(self, cycle: Cycle, task: Task, rejected: BOOL) -> tuple[Rejection, ...]:
        tolerations = task.k8s.tolerations if task.k8s is not None else ()
        groups: dict[k8s.Taint, list[int]] = {}
        for n in np.flatnonzero(rejected):
            taint = k8s.untolerated(
                cycle.snapshot.node_taints[int(n)], tolerations, k8s.HARD_EFFECTS
            )
            if taint is not None:
                groups.setdefault(taint, []).append(int(n))
        out = []
        for taint, rows in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0].key)):
            mask = np.zeros(cycle.snapshot.n_nodes, dtype=np.bool_)
            mask[rows] = True
            text = (
                f"{taint.key}={taint.value}:{taint.effect}"
                if taint.value
                else (f"{taint.key}:{taint.effect}")
            )
            out.append(Rejection(f"untolerated taint {text}", mask, unresolvable=True))
        return tuple(out)

    def score(self, cycle: Cycle, task: Task, candidates: NDArray[np.intp]) -> F64 | None:
        s = cycle.snapshot
        if task.k8s is None or not s.node_taints:
            return None
        tolerations = tuple(
            t for t in task.k8s.tolerations if t.effect in ("", k8s.Effect.PREFER_NO_SCHEDULE)
        )
        raw = np.fromiter(
            (
                sum(
                    1
                    for t in s.node_taints[int(n)]
                    if t.effect in _PREFER and not k8s.tolerated(t, tolerations)
                )
                for n in candidates
            ),
            dtype=np.float64,
            count=candidates.size,
        )
        return normalize(raw, reverse=True)


class NodeAffinity:
    """Filter: spec.nodeSelector and the required node affinity (terms ORed, every operator,
    matchFields on metadata.name). Score: the summed weights of matching preferred terms."""

    name: ClassVar[str] = "NodeAffinity"

    def filter(self, cycle: Cycle, task: Task) -> BOOL | None:
        if task.k8s is None or task.k8s.required_nodes is None:
            return None
        return selector_mask(cycle.snapshot, task.k8s.required_nodes)

    def explain(self, cycle: Cycle, task: Task, rejected: BOOL) -> tuple[Rejection, ...]:
        return (Rejection("node(s) didn't match Pod's node affinity", rejected, unresolvable=True),)

    def score(self, cycle: Cycle, task: Task, candidates: NDArray[np.intp]) -> F64 | None:
        if task.k8s is None or not task.k8s.preferred_nodes:
            return None
        raw = np.zeros(candidates.size, dtype=np.float64)
        for p in task.k8s.preferred_nodes:
            raw += p.weight * term_mask(cycle.snapshot, p.term)[candidates]
        hi = float(raw.max()) if raw.size else 0.0
        return raw * (MAX_SCORE / hi) if hi > 0 else raw


class NodePorts:
    """The pod's host ports are free on the node (same port and protocol conflict when either
    host IP is 0.0.0.0 or both are equal), counting pods placed earlier in the session."""

    name: ClassVar[str] = "NodePorts"

    def filter(self, cycle: Cycle, task: Task) -> BOOL | None:
        if task.k8s is None or not task.k8s.host_ports:
            return None
        ports = task.k8s.host_ports
        out = np.ones(cycle.snapshot.n_nodes, dtype=np.bool_)
        for n, pod in placed(cycle).having("ports"):
            if out[n] and any(a.conflicts(b) for a in pod.host_ports for b in ports):
                out[n] = False
        return out

    def explain(self, cycle: Cycle, task: Task, rejected: BOOL) -> tuple[Rejection, ...]:
        return (Rejection("node(s) didn't have free ports for the requested pod ports", rejected),)


class ExtendedResources:
    """NodeResourcesFit for the resources the core does not otherwise model (ephemeral-storage
    and extended resources other than GPUs): the node's allocatable minus what its pods
    request, counting pods placed earlier in the session."""

    name: ClassVar[str] = "ExtendedResources"

    def _free(self, cycle: Cycle, resource: str) -> NDArray[np.int64]:
        index = placed(cycle)
        key = ("free", resource)
        cached = index.memo.get(key)
        if cached is not None:
            return cached  # type: ignore[return-value]
        s = cycle.snapshot
        free = np.fromiter(
            (
                (s.node_scalars[n].get(resource, 0) if s.node_scalars else 0)
                - sum(p.scalars.get(resource, 0) for p in pods.values())
                for n, pods in enumerate(index.by_node)
            ),
            dtype=np.int64,
            count=s.n_nodes,
        )
        index.memo[key] = free
        return free

    def filter(self, cycle: Cycle, task: Task) -> BOOL | None:
        if task.k8s is None or not task.k8s.scalars:
            return None
        out = np.ones(cycle.snapshot.n_nodes, dtype=np.bool_)
        for resource, amount in sorted(task.k8s.scalars.items()):
            if amount > 0:
                out &= self._free(cycle, resource) >= amount
        return out

    def explain(self, cycle: Cycle, task: Task, rejected: BOOL) -> tuple[Rejection, ...]:
        assert task.k8s is not None
        out = []
        for resource, amount in sorted(task.k8s.scalars.items()):
            short = rejected & (self._free(cycle, resource) < amount)
            if short.any():
                out.append(Rejection(f"insufficient {resource}", short))
        return tuple(out)


class VolumeBinding:
    """The node lies in every topology the pod's volumes allow: bound PersistentVolumes' node
    affinity (and zone labels), WaitForFirstConsumer claims' StorageClass allowedTopologies
    (resolved by the shell into ``PodInfo.volumes``); a missing or unbound immediate claim
    rules out every node."""

    name: ClassVar[str] = "VolumeBinding"

    def filter(self, cycle: Cycle, task: Task) -> BOOL | None:
        if task.k8s is None:
            return None
        vol = task.k8s.volumes
        if vol.error:
            return np.zeros(cycle.snapshot.n_nodes, dtype=np.bool_)
        if not vol.nodes:
            return None
        out = np.ones(cycle.snapshot.n_nodes, dtype=np.bool_)
        for selector in vol.nodes:
            out &= selector_mask(cycle.snapshot, selector)
        return out

    def explain(self, cycle: Cycle, task: Task, rejected: BOOL) -> tuple[Rejection, ...]:
        assert task.k8s is not None
        vol = task.k8s.volumes
        if vol.error:
            return (Rejection(vol.error, rejected, unresolvable=True),)
        return (
            Rejection("node(s) had volume node affinity conflict", rejected, unresolvable=True),
        )


class NominatedNode:
    """Score: a preemptor (status.nominatedNodeName) goes back to the node its victims left
    when that node still fits, as kube-scheduler tries the nominated node first."""

    name: ClassVar[str] = "NominatedNode"

    def score(self, cycle: Cycle, task: Task, candidates: NDArray[np.intp]) -> F64 | None:
        if task.k8s is None or not task.k8s.nominated_node:
            return None
        names = cycle.snapshot.node_names
        target = task.k8s.nominated_node
        # The profiles weigh this score above all others: the nominated node wins if feasible.
        return np.fromiter(
            (MAX_SCORE if names[int(n)] == target else 0.0 for n in candidates),
            dtype=np.float64,
            count=candidates.size,
        )


class NominatedReservation:
    """A pending pod nominated to a node (a preemptor waiting for its victims to leave) keeps
    its CPU, memory and pod slot there from pods of lower priority, as kube-scheduler counts
    nominated pods of equal or higher priority when it filters. A nominee placed in this
    session no longer reserves."""

    name: ClassVar[str] = "NominatedReservation"

    def _reserved(self, cycle: Cycle, task: Task) -> dict[int, tuple[int, int, int]]:
        s = cycle.snapshot
        done = {t.id for sign, _, t in cycle.scratch.pod_log if sign > 0}
        out: dict[int, tuple[int, int, int]] = {}
        for row, nominee in s.nominated:
            if nominee.id == task.id or nominee.priority < task.priority or nominee.id in done:
                continue
            cpu, mem, pods = out.get(row, (0, 0, 0))
            out[row] = (cpu + nominee.cpu_milli, mem + nominee.mem_mib, pods + 1)
        return out

    def filter(self, cycle: Cycle, task: Task) -> BOOL | None:
        s, x = cycle.snapshot, cycle.scratch
        if not s.nominated:
            return None
        reserved = self._reserved(cycle, task)
        if not reserved:
            return None
        out = np.ones(s.n_nodes, dtype=np.bool_)
        for row, (cpu, mem, pods) in reserved.items():
            out[row] = bool(
                s.node_cpu_milli[row] - x.node_cpu_used[row] - cpu >= task.cpu_milli
                and s.node_mem_mib[row] - x.node_mem_used[row] - mem >= task.mem_mib
                and x.node_pods_used[row] + pods < s.node_max_pods[row]
            )
        return out

    def explain(self, cycle: Cycle, task: Task, rejected: BOOL) -> tuple[Rejection, ...]:
        return (
            Rejection("resources held for a pod nominated to the node (a preemptor)", rejected),
        )


_f1: type[FilterPlugin] = NodeUnschedulable
_f2: type[FilterPlugin] = TaintToleration
_f3: type[FilterPlugin] = NodeAffinity
_f4: type[FilterPlugin] = NodePorts
_f5: type[FilterPlugin] = ExtendedResources
_f6: type[FilterPlugin] = VolumeBinding
_f7: type[FilterPlugin] = NominatedReservation
_s1: type[ScorePlugin] = TaintToleration
_s2: type[ScorePlugin] = NodeAffinity
_s3: type[ScorePlugin] = NominatedNode
