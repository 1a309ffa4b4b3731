"""Filter + Score + DeviceScore "Topology": topology-aware placement traded against fragmentation.

Filter: a ``required`` in-node constraint (all GPUs in one NVLink island / NUMA node) and, while
a gang is tried inside one domain (``core.gang``), that domain. Score: one number per node,
``(1 - locality) * fragmentation + locality * topology`` (docs/design/006-topology.md works the
arithmetic): fragmentation is kallot's FGD score; topology a weighted mean of the link quality
of the best free GPU set, how whole the placement keeps NVLink islands for others, and the
gang's closeness to its peers. DeviceScore: the best-connected GPU set
(``core.topology.rank_gpu_sets``), next to the gang's GPUs on the node; the reason is recorded
for the Decision.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from kallot.core import frag, gang, topology
from kallot.core.errors import ConfigError
from kallot.core.framework.cycle import (
    DEVICE_REASONS,
    GANG_CONTEXT,
    Cycle,
    StateKey,
)
from kallot.core.framework.plugin import (
    MAX_SCORE,
    DeviceScorePlugin,
    FilterPlugin,
    PreFilterPlugin,
    Rejection,
    ScorePlugin,
)
from kallot.core.helpers.kallot_frag import KallotFrag
from kallot.core.helpers.required_topology import RequiredRule
from kallot.core.status import SUCCESS, Status
from kallot.core.workload import Task, TopologyMode

F64 = NDArray[np.float64]
BOOL = NDArray[np.bool_]
DEFAULT_LOCALITY = 0.5
# Weights of the topology terms (docs/design/006-topology.md): link quality and gang closeness
# count twice as much as keeping islands whole for others.
LINK_WEIGHT = 2.0
KEEP_WEIGHT = 1.0
GANG_WEIGHT = 2.0


@dataclass(slots=True)
class _SetCache:
    """Per node: GB/s of the slowest pair of the best free set for one request shape."""

    gbps: F64
    version: NDArray[np.int64]


class TopologyAware:
    """Args: ``locality`` (0..1, weight of topology against fragmentation, default 0.5),
    ``levels`` (cluster levels widest first, as ``[{"name": "rack", "label": "..."}]``; default
    block/rack/host from ``kallot.io/block``, ``kallot.io/rack``, the hostname), ``target``
    (the fragmentation score's TargetWorkload, learned when absent)."""

    name: ClassVar[str] = "Topology"

    def __init__(
        self,
        *,
        locality: float = DEFAULT_LOCALITY,
        cluster: topology.ClusterTopology = topology.DEFAULT_CLUSTER_TOPOLOGY,
        target: frag.TargetWorkload | None = None,
        bandwidths: topology.Bandwidths = topology.DEFAULT_BANDWIDTHS,
    ) -> None:
        self.locality = locality
        self.gang_topology = gang.GangTopology(cluster=cluster, aware=True)
        self.bandwidths = bandwidths
        self._frag = KallotFrag(target, quantize=False)
        self._rule = RequiredRule(self.name)
        self._sets_key: StateKey[dict[tuple[object, ...], _SetCache]] = StateKey(
            f"{self.name}/sets"
        )
        self._domains_key: StateKey[list[NDArray[np.int32]]] = StateKey(f"{self.name}/domains")

    @staticmethod
    def from_args(args: Mapping[str, Any]) -> TopologyAware:
        unknown = set(args) - {"locality", "levels", "target"}
        if unknown:
            raise ConfigError("Topology args", sorted(unknown), "only locality, levels, target")
        locality = args.get("locality", DEFAULT_LOCALITY)
        if not isinstance(locality, int | float) or not 0.0 <= float(locality) <= 1.0:
            raise ConfigError("Topology args.locality", locality, "a number in [0, 1]")
        target = args.get("target")
        if target is not None and not isinstance(target, frag.TargetWorkload):
            raise ConfigError("Topology args.target", type(target).__name__, "a TargetWorkload")
        cluster = topology.DEFAULT_CLUSTER_TOPOLOGY
        if "levels" in args:
            cluster = _levels(args["levels"])
        return TopologyAware(locality=float(locality), cluster=cluster, target=target)

    # -- shared per-session data ---------------------------------------------------------------

    def groups(self, cycle: Cycle) -> topology.NodeGroups:
        return self._rule.groups(cycle)

    def _domains(self, cycle: Cycle) -> list[NDArray[np.int32]]:
        """[N] domain ids per cluster level, narrowest (host) first."""
        d = cycle.session.get(self._domains_key)
        if d is None:
            cluster = self.gang_topology.cluster
            labels = cycle.snapshot.labels
            d = [cluster.domains(labels, lv) for lv in reversed(cluster.levels)]
            cycle.session.put(self._domains_key, d)
        return d

    _slot_fit = staticmethod(RequiredRule.slot_fit)

    # -- pre-filter / filter ---------------------------------------------------------------------

    def pre_filter(self, cycle: Cycle, task: Task) -> Status:
        req = task.gpu
        if req is None or req.topology.mode is TopologyMode.NONE:
            return SUCCESS
        return self._rule.level_status(req.topology.level)

    _in_node_level = staticmethod(topology.required_in_node_level)

    def filter(self, cycle: Cycle, task: Task) -> BOOL:
        return self._rule.mask(cycle, task)

    def explain(self, cycle: Cycle, task: Task, rejected: BOOL) -> tuple[Rejection, ...]:
        return self._rule.rejections(cycle, task, rejected)

    # -- score -------------------------------------------------------------------------------------

    def score(self, cycle: Cycle, task: Task, candidates: NDArray[np.intp]) -> F64:
        frag_score = self._frag.score(cycle, task, candidates)
        loc = self.topology_score(cycle, task, candidates)
        if loc is None:
            return frag_score
        return (1.0 - self.locality) * frag_score + self.locality * loc

    def topology_score(self, cycle: Cycle, task: Task, candidates: NDArray[np.intp]) -> F64 | None:
        """[C] in [0, 100]: the mean of the terms that apply (None when none does)."""
        terms: list[tuple[float, F64]] = []
        req = task.gpu
        ctx = cycle.session.get(GANG_CONTEXT)
        if req is not None and req.whole and req.count > 0:
            # The GPUs that should be well linked: the pod's own, or, for a gang's first pod,
            # as much of the whole gang as one node can hold (so a gang of 1-GPU pods that fits
            # on one node goes to a node where those GPUs share an NVLink island).
            group = req.count
            if ctx is not None and int(ctx.peers.sum()) == 0:
                group = max(group, min(ctx.remaining_gpus, cycle.snapshot.max_gpus))
            if group >= 2:
                terms.append((LINK_WEIGHT, self.link_score(cycle, task, candidates, group)))
            terms.append((KEEP_WEIGHT, self.keep_score(cycle, task, candidates, group)))
        if ctx is not None:
            terms.append((GANG_WEIGHT, self.gang_score(cycle, ctx, candidates)))
        if not terms:
            return None
        total = sum(w * t for w, t in terms)
        return np.asarray(total / sum(w for w, _ in terms), dtype=np.float64)

    def keep_score(self, cycle: Cycle, task: Task, candidates: NDArray[np.intp], group: int) -> F64:
        """How well the placement keeps NVLink islands whole for others:
        ``100 * (1 - (s - group) / (G - group))`` where ``s`` is the smallest free island that
        holds ``group`` GPUs on the node and ``G`` the largest GPU count of any node. A 1-GPU pod
        scores 100 on a PCIe node (islands of one) or on the last free GPU of an HGX node, 0 on
        an idle HGX node (8 - 1 over 8 - 1). When no island holds the group nothing whole is
        broken: 100."""
        g = cycle.snapshot.max_gpus
        if g <= group:
            return np.full(candidates.size, MAX_SCORE)
        free = self._slot_fit(cycle, task)[candidates]
        island = self.groups(cycle).island[candidates]
        alone = (free & (island < 0)).any(axis=1)  # a free GPU outside any island: its own
        smallest = np.where(alone & (group == 1), 1, g + 1)
        for gid in range(g):
            count = (free & (island == gid)).sum(axis=1)
            smallest = np.where(count >= group, np.minimum(smallest, count), smallest)
        s = np.where(smallest > g, group, smallest)
        return np.asarray(MAX_SCORE * (1.0 - (s - group) / (g - group)), dtype=np.float64)

    def link_score(self, cycle: Cycle, task: Task, candidates: NDArray[np.intp], group: int) -> F64:
        """``100 * GB/s of the best set's slowest pair / GB/s of the best link type`` (NV18 =
        450 GB/s by default): 100 on an NVSwitch node, 5 for a PCIe pair (24 / 450 * 100 = 5.3),
        2.2 across sockets. Nodes without topology, or with fewer than ``group`` free GPUs,
        count as SYS. ``group`` is how many of the node's GPUs should be well linked (at least
        the pod's own)."""
        level = self._in_node_level(task)
        req = task.gpu
        assert req is not None
        # Which GPUs can take the request depends on its models, modes and isolation too.
        key = (
            group,
            level.value if level is not None else "",
            req.models,
            req.modes,
            req.isolation,
        )
        caches = cycle.session.get(self._sets_key)
        if caches is None:
            caches = {}
            cycle.session.put(self._sets_key, caches)
        n = cycle.snapshot.n_nodes
        entry = caches.get(key)
        if entry is None:
            entry = caches[key] = _SetCache(np.zeros(n), np.full(n, -1, dtype=np.int64))
        stale = candidates[entry.version[candidates] != cycle.scratch.node_version[candidates]]
        if stale.size:
            slots = self._slot_fit(cycle, task)
            for node in stale:
                best = self._best(cycle, task, int(node), np.flatnonzero(slots[node]), group)
                entry.gbps[node] = (
                    self.bandwidths.of(_slowest_code(cycle, self, int(node), best.slots))
                    if best is not None
                    else self.bandwidths.system
                )
                entry.version[node] = cycle.scratch.node_version[node]
        top = self.bandwidths.of(topology.link_code(topology.LinkLevel.SYSTEM, 18))
        return np.minimum(MAX_SCORE * entry.gbps[candidates] / top, MAX_SCORE)

    def gang_score(
        self, cycle: Cycle, ctx: topology.GangContext, candidates: NDArray[np.intp]
    ) -> F64:
        """Closeness to the gang: level i from the narrowest (host = 0) of L levels weighs
        ``100 * (L - i) / L``; a node gets the weight of the narrowest level whose domain already
        holds a peer or, before any peer is placed, has room for the whole rest of the gang."""
        domains = self._domains(cycle)
        n_levels = len(domains)
        free = _free_gpus(cycle)
        first = int(ctx.peers.sum()) == 0
        out = np.zeros(candidates.size, dtype=np.float64)
        for i in range(n_levels - 1, -1, -1):  # widest first, so narrower levels overwrite
            dom = domains[i]
            ok = dom >= 0
            size = int(dom.max()) + 1 if ok.any() else 0
            if size == 0:
                continue
            if first:
                room = np.bincount(dom[ok], weights=free[ok], minlength=size)
                good = room >= ctx.remaining_gpus
            else:
                good = np.bincount(dom[ok], weights=ctx.peers[ok], minlength=size) > 0
            cand_dom = dom[candidates]
            hit = (cand_dom >= 0) & good[np.maximum(cand_dom, 0)]
            out[hit] = MAX_SCORE * (n_levels - i) / n_levels
        return out

    # -- device choice -----------------------------------------------------------------------------

    def _best(
        self, cycle: Cycle, task: Task, node: int, feasible: NDArray[np.intp], count: int
    ) -> topology.GpuSet | None:
        groups = self.groups(cycle)
        link = groups.node_link(cycle.snapshot, node)
        if link is None:
            return None
        level = self._in_node_level(task)
        ranked = topology.rank_gpu_sets(
            link,
            feasible,
            count,
            groups=None if level is None else groups.of_level(level)[node],
            limit=1,
            bandwidths=self.bandwidths,
        )
        return ranked[0] if ranked else None

    def choose(
        self, cycle: Cycle, task: Task, node: int, feasible: NDArray[np.intp]
    ) -> tuple[int, ...] | None:
        req = task.gpu
        if req is None or req.count == 0:
            return None
        if not req.whole:
            return self._frag.choose(cycle, task, node, feasible)
        groups = self.groups(cycle)
        link = groups.node_link(cycle.snapshot, node)
        if link is None:
            return None
        ctx = cycle.session.get(GANG_CONTEXT)
        peers = tuple(ctx.slots.get(node, ())) if ctx is not None else ()
        if peers and self._in_node_level(task) is None:
            # Join the gang's GPUs on this node: the best set of ours plus theirs.
            ranked = topology.rank_gpu_sets(
                link,
                [*feasible.tolist(), *peers],
                req.count + len(peers),
                must_include=peers,
                limit=1,
                bandwidths=self.bandwidths,
            )
            best = (
                topology.GpuSet(
                    tuple(s for s in ranked[0].slots if s not in peers),
                    ranked[0].bottleneck,
                    ranked[0].total,
                    ranked[0].cut,
                )
                if ranked
                else None
            )
        else:
            best = self._best(cycle, task, node, feasible, req.count)
        if best is None:
            return None
        reasons = cycle.session.get(DEVICE_REASONS)
        if reasons is None:
            reasons = {}
            cycle.session.put(DEVICE_REASONS, reasons)
        n_sets = _n_sets(feasible.size, req.count)
        reasons[task.id] = (
            topology.describe_set(
                link, best.slots, islands=groups.island[node], bandwidths=self.bandwidths
            )
            + f"; best of {n_sets} free set{'s' if n_sets != 1 else ''} by slowest link, then "
            "total link cost, then fewest good links cut from the GPUs left free"
        )
        return best.slots


def _n_sets(free: int, count: int) -> int:
    return math.comb(free, count)


def _slowest_code(cycle: Cycle, plugin: TopologyAware, node: int, slots: Sequence[int]) -> int:
    """Link code of the slowest pair of ``slots`` (NV18-like when there is one GPU)."""
    link = plugin.groups(cycle).node_link(cycle.snapshot, node)
    assert link is not None
    if len(slots) < 2:
        return topology.link_code(topology.LinkLevel.SYSTEM, 18)
    sub = [int(link[a, b]) for i, a in enumerate(slots) for b in slots[i + 1 :]]
    return min(sub, key=plugin.bandwidths.of)


def _free_gpus(cycle: Cycle) -> F64:
    s, x = cycle.snapshot, cycle.scratch
    idle = s.gpu_valid & s.gpu_healthy & (x.gpu_clients == 0) & (x.gpu_used_milli == 0)
    return np.asarray(idle.sum(axis=1) * s.node_schedulable, dtype=np.float64)


def _levels(value: Any) -> topology.ClusterTopology:
    if not isinstance(value, Sequence) or isinstance(value, str) or not value:
        raise ConfigError("Topology args.levels", value, "a non-empty list of {name, label}")
    levels = []
    for i, item in enumerate(value):
        if not isinstance(item, Mapping) or set(item) != {"name", "label"}:
            raise ConfigError(f"Topology args.levels[{i}]", item, "a mapping with name and label")
        if not all(isinstance(item[k], str) and item[k] for k in ("name", "label")):
            raise ConfigError(f"Topology args.levels[{i}]", item, "non-empty strings")
        levels.append(topology.ClusterLevel(item["name"], item["label"]))
    try:
        return topology.ClusterTopology(tuple(levels))
    except ValueError as exc:
        raise ConfigError("Topology args.levels", value, str(exc)) from None


_p: type[PreFilterPlugin] = TopologyAware
_f: type[FilterPlugin] = TopologyAware
_s: type[ScorePlugin] = TopologyAware
_d: type[DeviceScorePlugin] = TopologyAware
