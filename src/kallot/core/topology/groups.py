"""In-node groups: NVLink islands and NUMA nodes, per node of a Snapshot (``NodeGroups``), and
whether a set of GPUs sits in one group.

Where it sits: part of ``core.topology`` (the model layer); ``required`` in-node topology and
gang placement read it.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from kallot.core.snapshot import Snapshot
from kallot.core.topology.links import NVLINK_BASE, UNKNOWN, LinkLevel
from kallot.core.workload import TopologyConstraint, TopologyMode

I8 = NDArray[np.int8]
I32 = NDArray[np.int32]
I64 = NDArray[np.int64]
BOOL = NDArray[np.bool_]


class InNodeLevel(enum.Enum):
    """In-node levels a multi-GPU pod may ask its GPUs to share (``DeviceRequest.topology``)."""

    NVLINK = "nvlink"  # one NVLink island
    NUMA = "numa"  # one NUMA node

    @staticmethod
    def parse(text: str) -> InNodeLevel | None:
        key = text.strip().lower()
        return _IN_NODE_ALIASES.get(key)


_IN_NODE_ALIASES = {
    "nvlink": InNodeLevel.NVLINK,
    "island": InNodeLevel.NVLINK,
    "nvlink-island": InNodeLevel.NVLINK,
    "numa": InNodeLevel.NUMA,
    "socket": InNodeLevel.NUMA,
}
IN_NODE_LEVELS = ("nvlink", "numa")


def islands_from_links(link: I8) -> I32:
    """``[G]`` NVLink island ids: connected components of the NVLink graph, numbered in slot
    order from 0. A GPU without NVLinks is an island of its own. (NCCL routes rings over
    NVLink through intermediate GPUs, so a connected component is what matters, not a clique.)
    """
    g = link.shape[0]
    island = np.full(g, -1, dtype=np.int32)
    nv = link >= NVLINK_BASE
    next_id = 0
    for start in range(g):
        if island[start] >= 0:
            continue
        stack = [start]
        island[start] = next_id
        while stack:
            i = stack.pop()
            for j in np.flatnonzero(nv[i]):
                if island[j] < 0:
                    island[j] = next_id
                    stack.append(int(j))
        next_id += 1
    return island


@dataclass(frozen=True, slots=True)
class NodeGroups:
    """Per slot of every node: NVLink island and NUMA node (``[N, G]``, -1 unknown), and
    whether the node has any topology information (``known [N]``). Built once per session."""

    island: I32
    numa: I32
    known: BOOL

    @staticmethod
    def of(snapshot: Snapshot) -> NodeGroups:
        island = np.array(snapshot.gpu_island, dtype=np.int32, copy=True)
        if snapshot.gpu_link is not None:
            for n in range(snapshot.n_nodes):
                k = int(snapshot.gpu_valid[n].sum())
                row = snapshot.gpu_link[n, :k, :k]
                if k and (island[n, :k] < 0).all() and (row >= 0).any():
                    island[n, :k] = islands_from_links(np.asarray(row, dtype=np.int8))
        numa = np.asarray(snapshot.gpu_numa, dtype=np.int32)
        valid = snapshot.gpu_valid
        known = ((island >= 0) & valid).any(axis=1) | ((numa >= 0) & valid).any(axis=1)
        if snapshot.gpu_link is not None:
            known |= (snapshot.gpu_link >= 0).any(axis=(1, 2))
        return NodeGroups(island=island, numa=numa, known=np.asarray(known, dtype=np.bool_))

    def of_level(self, level: InNodeLevel) -> I32:
        return self.island if level is InNodeLevel.NVLINK else self.numa

    def node_link(self, snapshot: Snapshot, node: int) -> I8 | None:
        """``[G, G]`` link codes of one node: the snapshot's matrix where it has one, else one
        synthesized from islands and NUMA nodes (same island: NVLink of unknown width; same NUMA
        node: NODE; different NUMA nodes: SYS). None when nothing is known about the node."""
        if not self.known[node]:
            return None
        g = snapshot.max_gpus
        if snapshot.gpu_link is not None and (snapshot.gpu_link[node] >= 0).any():
            return np.asarray(snapshot.gpu_link[node], dtype=np.int8)
        isl, numa = self.island[node], self.numa[node]
        out = np.full((g, g), UNKNOWN, dtype=np.int8)
        same_numa = (numa[:, None] == numa[None, :]) & (numa[:, None] >= 0)
        diff_numa = (numa[:, None] != numa[None, :]) & (numa[:, None] >= 0) & (numa[None, :] >= 0)
        out[diff_numa] = LinkLevel.SYSTEM
        out[same_numa] = LinkLevel.NODE
        out[(isl[:, None] == isl[None, :]) & (isl[:, None] >= 0)] = NVLINK_BASE
        return out


def largest_group(free: BOOL, group: I32) -> I64:
    """``[C]`` the most free slots of one row that share a group id (-1 = a group of one).

    ``free`` and ``group`` are ``[C, G]``. Vectorized over rows; loops over the G group ids.
    """
    best = np.asarray(free.any(axis=1), dtype=np.int64)
    for gid in range(free.shape[1]):
        best = np.maximum(best, (free & (group == gid)).sum(axis=1))
    return best


def in_one_group(groups: NodeGroups, node: int, slots: Sequence[int], level: InNodeLevel) -> bool:
    """True if the slots of ``node`` share one group at ``level`` (always for fewer than two)."""
    if len(slots) < 2:
        return True
    ids = groups.of_level(level)[node, list(slots)]
    return bool(ids[0] >= 0 and (ids == ids[0]).all())


def satisfied(groups: NodeGroups, node: int, slots: Sequence[int], c: TopologyConstraint) -> bool:
    """Whether a device choice meets an in-node ``required`` constraint (others always do)."""
    if c.mode is not TopologyMode.REQUIRED:
        return True
    level = InNodeLevel.parse(c.level)
    return level is not None and in_one_group(groups, node, slots, level)
