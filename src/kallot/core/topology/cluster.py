"""Cluster topology: levels above the node (block > rack > host) from node labels
(``ClusterTopology``), the context of a gang being placed (``GangContext``), and the mask and
reasons of ``required`` topology that the RequiredTopology and Topology plugins share.

Where it sits: part of ``core.topology`` (the model layer); gang allocate
(``core.actions.gang_allocate``) and the topology plugins use it inside a session.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from kallot.core.snapshot import Labels
from kallot.core.topology.groups import InNodeLevel, NodeGroups, largest_group
from kallot.core.workload import Task, TopologyMode

I8 = NDArray[np.int8]
I32 = NDArray[np.int32]
I64 = NDArray[np.int64]
BOOL = NDArray[np.bool_]

HOSTNAME_LABEL = "kubernetes.io/hostname"


@dataclass(frozen=True, slots=True)
class ClusterLevel:
    """One level above the node: its short name and the node label whose value names a domain."""

    name: str
    label: str


@dataclass(frozen=True, slots=True)
class ClusterTopology:
    """Levels above the node, widest first (e.g. block > rack > host), after the convention of
    Kueue's and KAI's Topology objects: each level is a node label key.

    A domain at level i is the tuple of a node's label values at levels 0..i, so two racks
    named 'r1' in different blocks are different domains. Levels whose label no node carries
    are skipped; a node missing the label of a level it should have is in no domain there.
    The host level is the node itself (its hostname label, if any, is unique per node).
    """

    levels: tuple[ClusterLevel, ...]

    def __post_init__(self) -> None:
        names = [lv.name for lv in self.levels]
        labels = [lv.label for lv in self.levels]
        for what, values in (("name", names), ("label", labels)):
            dup = sorted({v for v in values if values.count(v) > 1})
            if dup:
                raise ValueError(
                    f"ClusterTopology.levels[].{what}: {dup} repeated, expected unique"
                )

    def index(self, level: str) -> int | None:
        """Index of a level by short name or label key (None if neither)."""
        for i, lv in enumerate(self.levels):
            if level in (lv.name, lv.label):
                return i
        return None

    def resolve(self, level: str) -> ClusterLevel | None:
        """The named level; an unconfigured label key becomes a one-off level of its own."""
        i = self.index(level)
        if i is not None:
            return self.levels[i]
        if "/" in level or "." in level:
            return ClusterLevel(level, level)
        return None

    def narrower_first(self, level: ClusterLevel) -> tuple[ClusterLevel, ...]:
        """The levels to try for a gang constrained at ``level``: host first, up to ``level``."""
        i = self.index(level.label)
        if i is None:
            return (level,)
        return tuple(reversed(self.levels[i:]))  # levels are widest first

    def wider(self, level: ClusterLevel) -> tuple[ClusterLevel, ...]:
        """Levels wider than ``level``, nearest first (a ``preferred`` gang's fallbacks)."""
        i = self.index(level.label)
        return () if i is None else tuple(reversed(self.levels[:i]))

    def domains(self, labels: Labels, level: ClusterLevel) -> I32:
        """``[N]`` domain id per node at ``level`` (-1 = in no domain), numbered in the order of
        the label values (so the order is deterministic and readable)."""
        n = labels.n
        if level.label == HOSTNAME_LABEL:
            return np.arange(n, dtype=np.int32)  # every node is its own host, labelled or not
        i = self.index(level.label)
        chain = (level,) if i is None else self.levels[: i + 1]
        columns: list[I32] = []
        for lv in chain:
            if lv.label not in labels.codes:
                if lv is chain[-1]:
                    return np.full(n, -1, dtype=np.int32)
                continue
            columns.append(np.asarray(labels.domain(lv.label), dtype=np.int32))
        if not columns:
            return np.full(n, -1, dtype=np.int32)
        stacked = np.stack(columns, axis=1)
        missing = (stacked < 0).any(axis=1)
        _, ids = np.unique(stacked, axis=0, return_inverse=True)
        out = np.asarray(ids.reshape(-1), dtype=np.int32)
        # Re-number so -1 marks nodes outside every domain.
        out[missing] = -1
        return out

    def domain_name(self, labels: Labels, level: ClusterLevel, node: int) -> str:
        """'kallot.io/rack=r3' for the domain of ``node`` at ``level``."""
        if level.label == HOSTNAME_LABEL:
            value = labels.value_of(HOSTNAME_LABEL, node)
            return f"{level.name} {value}" if value else f"{level.name} of node row {node}"
        return f"{level.label}={labels.value_of(level.label, node)}"


DEFAULT_CLUSTER_TOPOLOGY = ClusterTopology(
    (
        ClusterLevel("block", "kallot.io/block"),
        ClusterLevel("rack", "kallot.io/rack"),
        ClusterLevel("host", HOSTNAME_LABEL),
    )
)


# ---------------------------------------------------------------------------------------------
# Gang context shared with the Topology plugin during one gang's placement


@dataclass(slots=True)
class GangContext:
    """What the Topology plugin knows about the gang being placed (put under
    ``framework.cycle.GANG_CONTEXT`` by ``core.actions.gang_allocate`` for each try, removed
    after).

    ``peers[n]``: gang members on node n so far (running ones included); ``remaining_gpus``: the
    whole GPUs its unplaced tasks still need (the current task included); ``allowed``: the [N]
    mask of the one domain the gang is being tried in (None = anywhere); ``domain``: its name;
    ``slots``: the GPU slots the gang's placed tasks hold, per node (so a pod joining peers on a
    node takes GPUs well linked to theirs).
    """

    job: str
    peers: I32
    remaining_gpus: int
    allowed: BOOL | None = None
    domain: str = ""
    slots: dict[int, list[int]] = field(default_factory=dict)  # node -> GPUs the gang holds


# -- required topology: the filter and its reasons, shared by the RequiredTopology and Topology
# plugins (the Topology plugin also weighs link quality; RequiredTopology is the floor every
# profile stands on) --------------------------------------------------------------------------


def required_in_node_level(task: Task) -> InNodeLevel | None:
    """The in-node level (one NVLink island, one NUMA node) a multi-GPU task requires, if any."""
    req = task.gpu
    if req is None or req.count < 2 or req.topology.mode is not TopologyMode.REQUIRED:
        return None
    return InNodeLevel.parse(req.topology.level)


def required_mask(
    n_nodes: int,
    ctx: GangContext | None,
    level: InNodeLevel | None,
    *,
    groups: Callable[[], NodeGroups],
    slot_fit: Callable[[], BOOL],
    count: int,
) -> BOOL:
    """[N] nodes a task may use under its hard constraints: inside the gang's domain (``ctx``)
    and, for a required in-node ``level``, with ``count`` fitting GPUs in one group."""
    mask = np.ones(n_nodes, dtype=np.bool_)
    if ctx is not None and ctx.allowed is not None:
        mask &= ctx.allowed
    if level is not None:
        mask &= largest_group(slot_fit(), groups().of_level(level)) >= count
    return mask


def required_rejections(
    rejected: BOOL,
    ctx: GangContext | None,
    level: InNodeLevel | None,
    *,
    groups: Callable[[], NodeGroups],
    slot_fit: Callable[[], BOOL],
    count: int,
) -> list[tuple[str, BOOL, bool]]:
    """Why ``required_mask`` rejected the nodes in ``rejected``: (message, nodes, unresolvable)."""
    out: list[tuple[str, BOOL, bool]] = []
    left = rejected.copy()
    if ctx is not None and ctx.allowed is not None:
        outside = left & ~ctx.allowed
        if outside.any():
            out.append((f"outside the gang's domain {ctx.domain}", outside, False))
            left &= ~outside
    if level is not None and left.any():
        g = groups()
        unknown = left & ~g.known
        if unknown.any():
            out.append(("the node publishes no GPU topology", unknown, True))
            left &= ~unknown
        if left.any():
            most = largest_group(slot_fit(), g.of_level(level))
            name = "NVLink island" if level is InNodeLevel.NVLINK else "NUMA node"
            out.append(
                (
                    f"fewer than {count} free GPUs in one {name} (most in one: "
                    f"{int(most[left].max())})",
                    left,
                    False,
                )
            )
    return out
