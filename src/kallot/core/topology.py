"""Topology: how the GPUs of a node are linked, and how nodes group into blocks, racks and hosts.

In a node: link codes per GPU pair (NVML's common-ancestor levels plus NVLink link counts), NUMA
node and NIC affinity per GPU, NVLink islands, machine presets, and ``rank_gpu_sets``: which
``count`` free GPUs talk fastest, under a cost that a brute-force oracle can check. Above the
node: ``ClusterTopology`` turns node labels into nested domains (block > rack > host).

Where it sits: the Topology plugin and gang placement use it inside a session; the node agent's
``GetPreferredAllocation`` calls ``rank_gpu_sets`` with the link matrix it read from NVML, so both
sides rank GPU sets the same way. Pure: numpy and the standard library only.
"""

from __future__ import annotations

import enum
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from kallot.core.snapshot import Labels, Snapshot
from kallot.core.workload import Task, TopologyConstraint, TopologyMode

I8 = NDArray[np.int8]
I32 = NDArray[np.int32]
I64 = NDArray[np.int64]
BOOL = NDArray[np.bool_]

UNKNOWN = -1  # link code of a pair whose link is not known (and of padding slots)
NVLINK_BASE = 100  # codes >= 100 are NVLink: code - 100 links (0 = NVLink, count unknown)
MAX_NVLINKS = 27  # int8 headroom: 100 + 27 = 127


class LinkLevel(enum.IntEnum):
    """How two GPUs of one node reach each other, as NVML's ``nvmlDeviceGetTopologyCommonAncestor``
    reports it (the values are NVML's), plus NVLink, which NVML reports separately.

    Best first: NVLINK, then INTERNAL (same board) ... SYSTEM (across CPU sockets).
    """

    INTERNAL = 0  # NVML_TOPOLOGY_INTERNAL: same board (e.g. a dual-GPU card)
    SINGLE = 10  # NVML_TOPOLOGY_SINGLE: one PCIe switch (nvidia-smi "PIX")
    MULTIPLE = 20  # NVML_TOPOLOGY_MULTIPLE: several PCIe switches, no host bridge ("PXB")
    HOSTBRIDGE = 30  # NVML_TOPOLOGY_HOSTBRIDGE: through a CPU host bridge ("PHB")
    NODE = 40  # NVML_TOPOLOGY_NODE: same NUMA node, across host bridges ("NODE")
    SYSTEM = 50  # NVML_TOPOLOGY_SYSTEM: across the SMP interconnect, QPI/UPI ("SYS")
    NVLINK = NVLINK_BASE  # direct NVLink or NVSwitch ("NV#")


_SHORT = {
    LinkLevel.INTERNAL: "BRD",
    LinkLevel.SINGLE: "PIX",
    LinkLevel.MULTIPLE: "PXB",
    LinkLevel.HOSTBRIDGE: "PHB",
    LinkLevel.NODE: "NODE",
    LinkLevel.SYSTEM: "SYS",
}


def link_code(level: int, nvlinks: int = 0) -> int:
    """The int8 code stored in ``Snapshot.gpu_link`` for one GPU pair.

    ``level`` is NVML's common-ancestor value (0/10/20/30/40/50); ``nvlinks`` the number of
    active NVLinks between the two GPUs. Any NVLink wins over the PCIe path, as NCCL routes it.
    """
    if nvlinks < 0:
        raise ValueError(f"nvlinks: got {nvlinks}, expected >= 0")
    if nvlinks > 0:
        return NVLINK_BASE + min(nvlinks, MAX_NVLINKS)
    if level == UNKNOWN:
        return UNKNOWN
    try:
        return int(LinkLevel(level))
    except ValueError:
        raise ValueError(
            f"level: got {level}, expected an NVML common-ancestor level "
            f"({', '.join(str(int(x)) for x in LinkLevel if x is not LinkLevel.NVLINK)})"
        ) from None


def level_of(code: int) -> LinkLevel | None:
    """The level of a link code (None when unknown)."""
    if code >= NVLINK_BASE:
        return LinkLevel.NVLINK
    if code < 0:
        return None
    return LinkLevel(code)


def nvlinks_of(code: int) -> int:
    """NVLinks between the pair (0 when the path is PCIe or unknown, or the count is unknown)."""
    return code - NVLINK_BASE if code >= NVLINK_BASE else 0


def link_name(code: int) -> str:
    """nvidia-smi's name for a link: 'NV18', 'NV' (count unknown), 'PIX', 'SYS', ... or '?'."""
    level = level_of(code)
    if level is None:
        return "?"
    if level is LinkLevel.NVLINK:
        n = nvlinks_of(code)
        return f"NV{n}" if n else "NV"
    return _SHORT[level]


def link_matrix(
    levels: Sequence[Sequence[int]], nvlinks: Sequence[Sequence[int]] | None = None
) -> I8:
    """``[G, G]`` link codes from NVML's per-pair common-ancestor levels and NVLink counts.

    Raises ValueError naming the offending entry when the matrices are not square, not the same
    size, not symmetric, or hold a value NVML does not report. The diagonal is ignored.
    """
    g = len(levels)
    if any(len(row) != g for row in levels):
        raise ValueError(f"topology.levels: expected a {g}x{g} matrix")
    if nvlinks is not None and nvlinks and (len(nvlinks) != g or any(len(r) != g for r in nvlinks)):
        raise ValueError(f"topology.nvlinks: expected a {g}x{g} matrix like topology.levels")
    out = np.full((g, g), UNKNOWN, dtype=np.int8)
    for i in range(g):
        for j in range(g):
            if i == j:
                continue
            links = int(nvlinks[i][j]) if nvlinks else 0
            try:
                out[i, j] = link_code(int(levels[i][j]), links)
            except ValueError as exc:
                raise ValueError(f"topology.levels[{i}][{j}]/nvlinks[{i}][{j}]: {exc}") from None
    if not np.array_equal(out, out.T):
        i, j = (int(x) for x in np.argwhere(out != out.T)[0])
        raise ValueError(
            f"topology[{i}][{j}]: got {link_name(int(out[i, j]))} one way and "
            f"{link_name(int(out[j, i]))} the other, expected a symmetric matrix"
        )
    return out


# ---------------------------------------------------------------------------------------------
# Bandwidth and pair cost


@dataclass(frozen=True, slots=True, kw_only=True)
class Bandwidths:
    """Per-direction GPU-to-GPU bandwidth (GB/s) by link level: the cost model's only input.

    NVLink 2, 3 and 4 all run 25 GB/s per link per direction (V100: 6 links, A100: 12, H100/H200:
    18), so a pair's NVLink bandwidth is ``links * nvlink_per_link``. The PCIe values assume PCIe
    Gen4 x16 (31.5 GB/s nominal) and lose bandwidth with every hop away from one switch; they are
    assumptions, not measurements (docs/design/006-topology.md gives the sources and reasons).
    """

    nvlink_per_link: float = 25.0
    nvlink_unknown_links: int = 12  # NVLink reported without a link count: assume an A100's 12
    internal: float = 24.0
    single: float = 24.0
    multiple: float = 22.0
    hostbridge: float = 18.0
    node: float = 14.0
    system: float = 10.0

    def of(self, code: int) -> float:
        """GB/s for one link code (unknown links count as SYSTEM, the worst case)."""
        level = level_of(code)
        if level is LinkLevel.NVLINK:
            links = nvlinks_of(code) or self.nvlink_unknown_links
            return links * self.nvlink_per_link
        return {
            LinkLevel.INTERNAL: self.internal,
            LinkLevel.SINGLE: self.single,
            LinkLevel.MULTIPLE: self.multiple,
            LinkLevel.HOSTBRIDGE: self.hostbridge,
            LinkLevel.NODE: self.node,
        }.get(level, self.system)  # type: ignore[arg-type]


DEFAULT_BANDWIDTHS = Bandwidths()
COST_SCALE = 10_000  # pair cost = COST_SCALE / GB/s = tenths of a millisecond to move 1 GB


def pair_costs(link: I8, bandwidths: Bandwidths = DEFAULT_BANDWIDTHS) -> I64:
    """``[G, G]`` integer pair costs: the time to move 1 GB over the pair's link, in 0.1 ms.

    NV18 (450 GB/s) costs 22, NV12 33, PIX 417, NODE 714, SYS 1000. The diagonal is 0.
    """
    codes = np.unique(link)
    table = {int(c): round(COST_SCALE / bandwidths.of(int(c))) for c in codes}
    out = np.zeros(link.shape, dtype=np.int64)
    for c, cost in table.items():
        out[link == c] = cost
    np.fill_diagonal(out, 0)
    return out


# ---------------------------------------------------------------------------------------------
# GPU-set ranking


@dataclass(frozen=True, slots=True)
class GpuSet:
    """A candidate set of GPU slots with its cost. Smaller ``key()`` is better.

    ``bottleneck``: the costliest pair (a ring all-reduce runs at its slowest link);
    ``total``: the sum over all pairs (how well the set is connected overall);
    ``cut``: the sum of costs from the set to the free GPUs left out. A larger cut means the set
    is loosely tied to what stays free, so taking it keeps the remaining free GPUs' best groups
    intact (the in-node fragmentation term).
    """

    slots: tuple[int, ...]
    bottleneck: int
    total: int
    cut: int

    def key(self) -> tuple[int, int, int, tuple[int, ...]]:
        return (self.bottleneck, self.total, -self.cut, self.slots)


@dataclass(frozen=True, slots=True)
class GpuChoice:
    """The best set, how many sets were compared, and whether the comparison was exhaustive."""

    best: GpuSet
    considered: int
    exact: bool


EXACT_LIMIT = 50_000  # compare every set when there are at most this many; greedy above


def rank_gpu_sets(
    link: I8 | Sequence[Sequence[int]],
    free: Sequence[int] | NDArray[np.integer],
    count: int,
    *,
    must_include: Sequence[int] = (),
    groups: Sequence[int] | NDArray[np.integer] | None = None,
    limit: int | None = None,
    bandwidths: Bandwidths = DEFAULT_BANDWIDTHS,
) -> list[GpuSet]:
    """Sets of ``count`` slots from ``free``, best first, under ``GpuSet.key``.

    Pure: usable without a Snapshot (the node agent's ``GetPreferredAllocation`` passes the
    link matrix from NVML, the available device indices, its ``must_include`` indices and the
    allocation size). ``groups[g]`` (optional, per slot of the node) restricts sets to one group
    (e.g. one NVLink island for a ``required`` constraint; -1 = a group of its own). Every set
    is compared when there are at most ``EXACT_LIMIT`` of them, so the first one is optimal;
    beyond that a greedy search from every seed GPU is used (not guaranteed optimal).
    Returns [] when no set exists (too few free slots, or none within one group).
    """
    codes = np.asarray(link, dtype=np.int8)
    free_slots = np.unique(np.asarray(free, dtype=np.int64))
    must = tuple(sorted({int(s) for s in must_include}))
    if count < 0:
        raise ValueError(f"count: got {count}, expected >= 0")
    if codes.ndim != 2 or codes.shape[0] != codes.shape[1]:
        raise ValueError(f"link: got shape {codes.shape}, expected a square [G, G] matrix")
    g = codes.shape[0]
    if free_slots.size and (free_slots[0] < 0 or free_slots[-1] >= g):
        raise ValueError(f"free: got slots {free_slots.tolist()}, expected indices in 0..{g - 1}")
    if not set(must) <= set(free_slots.tolist()):
        raise ValueError(f"must_include: got {list(must)}, expected a subset of free")
    if len(must) > count or count > free_slots.size:
        return []
    cost = pair_costs(codes, bandwidths)
    sets = _candidate_sets(cost, free_slots, count, must)
    if groups is not None and sets.shape[0] and count > 1:
        grp = np.asarray(groups, dtype=np.int64)[sets]
        one = (grp == grp[:, :1]).all(axis=1) & (grp[:, 0] >= 0)
        sets = sets[one]
    if sets.shape[0] == 0:
        return []
    bottleneck, total, cut = _set_costs(cost, free_slots, sets)
    order = np.lexsort((*(sets[:, i] for i in range(count - 1, -1, -1)), -cut, total, bottleneck))
    if limit is not None:
        order = order[:limit]
    return [
        GpuSet(tuple(int(s) for s in sets[i]), int(bottleneck[i]), int(total[i]), int(cut[i]))
        for i in order
    ]


def best_gpu_set(
    link: I8 | Sequence[Sequence[int]],
    free: Sequence[int] | NDArray[np.integer],
    count: int,
    *,
    must_include: Sequence[int] = (),
    groups: Sequence[int] | NDArray[np.integer] | None = None,
    bandwidths: Bandwidths = DEFAULT_BANDWIDTHS,
) -> GpuChoice | None:
    """The first set of ``rank_gpu_sets`` with how many were compared (None if there is none)."""
    ranked = rank_gpu_sets(
        link, free, count, must_include=must_include, groups=groups, bandwidths=bandwidths
    )
    if not ranked:
        return None
    n_free = len(np.unique(np.asarray(free)))
    n_must = len(set(must_include))
    exact = math.comb(n_free - n_must, count - n_must) <= EXACT_LIMIT
    return GpuChoice(best=ranked[0], considered=len(ranked), exact=exact)


def _candidate_sets(
    cost: I64, free: NDArray[np.int64], count: int, must: tuple[int, ...]
) -> NDArray[np.int64]:
    """``[M, count]`` sorted slot sets containing ``must``: all of them, or greedy ones."""
    optional = [int(s) for s in free if int(s) not in must]
    need = count - len(must)
    if need == 0:
        return np.array([must], dtype=np.int64).reshape(1, count)
    if math.comb(len(optional), need) <= EXACT_LIMIT:
        combos = np.array(list(itertools.combinations(optional, need)), dtype=np.int64)
        if must:
            combos = np.hstack(
                [np.tile(np.array(must, dtype=np.int64), (combos.shape[0], 1)), combos]
            )
        return np.sort(combos, axis=1)
    return _greedy_sets(cost, optional, need, must)


def _greedy_sets(
    cost: I64, optional: list[int], need: int, must: tuple[int, ...]
) -> NDArray[np.int64]:
    """One set per seed GPU: start from ``must`` + seed, then add the GPU whose worst and total
    cost to the set are smallest, until full. O(F^2 * count) instead of C(F, count)."""
    out: set[tuple[int, ...]] = set()
    opt = np.array(optional, dtype=np.int64)
    for seed in optional:
        chosen = [*must, seed]
        left = opt[opt != seed]
        while len(chosen) < len(must) + need:
            to_set = cost[np.ix_(left, np.array(chosen))]
            order = np.lexsort((left, to_set.sum(axis=1), to_set.max(axis=1)))
            pick = int(left[order[0]])
            chosen.append(pick)
            left = left[left != pick]
        out.add(tuple(sorted(chosen)))
    return np.array(sorted(out), dtype=np.int64)


def _set_costs(cost: I64, free: NDArray[np.int64], sets: NDArray[np.int64]) -> tuple[I64, I64, I64]:
    """(bottleneck, total, cut) per row of ``sets`` (vectorized over rows)."""
    k = sets.shape[1]
    sub = cost[sets[:, :, None], sets[:, None, :]]  # [M, k, k]
    iu = np.triu_indices(k, 1)
    pairs = sub[:, iu[0], iu[1]]  # [M, k(k-1)/2]
    if pairs.shape[1]:
        bottleneck = pairs.max(axis=1)
        total = pairs.sum(axis=1)
    else:
        bottleneck = np.zeros(sets.shape[0], dtype=np.int64)
        total = np.zeros(sets.shape[0], dtype=np.int64)
    to_free = cost[:, free].sum(axis=1)  # [G]: cost from each slot to every free slot
    cut = to_free[sets].sum(axis=1) - 2 * total
    return (
        np.asarray(bottleneck, dtype=np.int64),
        np.asarray(total, dtype=np.int64),
        np.asarray(cut, dtype=np.int64),
    )


def describe_set(
    link: I8 | Sequence[Sequence[int]],
    slots: Sequence[int],
    *,
    islands: Sequence[int] | NDArray[np.integer] | None = None,
    bandwidths: Bandwidths = DEFAULT_BANDWIDTHS,
) -> str:
    """One line on a GPU set: 'GPUs 0,1,2,3: NV18 between every pair (450 GB/s), one NVLink
    island'. Used as the Placement's reason and in the node agent's logs."""
    codes = np.asarray(link, dtype=np.int8)
    names = ",".join(str(s) for s in slots)
    if len(slots) < 2:
        return f"GPU {names}"
    pairs = [(int(a), int(b)) for a, b in itertools.combinations(slots, 2)]
    worst = min(pairs, key=lambda p: (bandwidths.of(int(codes[p])), p))  # slowest, first pair
    worst_code = int(codes[worst])
    uniform = all(int(codes[p]) == worst_code for p in pairs)
    gbps = bandwidths.of(worst_code)
    head = (
        f"{link_name(worst_code)} between every pair ({gbps:.0f} GB/s)"
        if uniform
        else f"slowest pair {worst[0]}-{worst[1]} {link_name(worst_code)} ({gbps:.0f} GB/s)"
    )
    tail = ""
    if islands is not None:
        isl = [int(islands[s]) for s in slots]
        tail = ", one NVLink island" if isl[0] >= 0 and len(set(isl)) == 1 else ""
    return f"GPUs {names}: {head}{tail}"


# ---------------------------------------------------------------------------------------------
# In-node groups (NVLink islands, NUMA nodes)


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


# ---------------------------------------------------------------------------------------------
# Machine presets


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeTopology:
    """One machine's GPU topology: link codes ``[G, G]``, NUMA node and nearest NIC per GPU,
    and the per-direction bandwidth of each NIC (GB/s). Presets below; the node agent builds
    one from NVML (``link_matrix`` + ``nvmlDeviceGetNumaNodeId``)."""

    name: str
    link: I8
    numa: tuple[int, ...]
    nic: tuple[int, ...]  # index of the NIC nearest each GPU (-1 unknown)
    nic_gbps: float = 0.0

    @property
    def gpus(self) -> int:
        return int(self.link.shape[0])

    @property
    def nics(self) -> int:
        return len({n for n in self.nic if n >= 0})

    def islands(self) -> I32:
        return islands_from_links(self.link)

    def nic_share_gbps(self) -> NDArray[np.float64]:
        """``[G]`` NIC bandwidth per GPU: its NIC's bandwidth split among the GPUs that share it."""
        nic = np.array(self.nic)
        share = np.zeros(self.gpus, dtype=np.float64)
        for n in set(self.nic):
            if n >= 0:
                users = nic == n
                share[users] = self.nic_gbps / users.sum()
        return share


def _matrix(g: int, pair: dict[tuple[int, int], int], default: int) -> I8:
    out = np.full((g, g), default, dtype=np.int8)
    for (i, j), code in pair.items():
        out[i, j] = out[j, i] = code
    np.fill_diagonal(out, UNKNOWN)
    return out


def hgx_8gpu_nvswitch(nvlinks: int = 18) -> NodeTopology:
    """8-GPU HGX/DGX H100 or H200: every pair NV18 through four NVSwitches (nvidia-smi topo
    shows NV18 everywhere), GPUs 0-3 on NUMA node 0 and 4-7 on node 1, one 400 Gb/s ConnectX-7
    NIC per GPU (DGX H100 User Guide, network ports table)."""
    return NodeTopology(
        name="hgx-8-nvswitch",
        link=_matrix(8, {}, link_code(LinkLevel.SYSTEM, nvlinks)),
        numa=(0, 0, 0, 0, 1, 1, 1, 1),
        nic=tuple(range(8)),
        nic_gbps=50.0,
    )


def pcie_8gpu_2numa() -> NodeTopology:
    """8-GPU PCIe server, two sockets: two GPUs per PCIe switch (PIX), two switches per socket
    (NODE between them), SYS across sockets; no NVLink; one 200 Gb/s NIC per socket."""
    pairs: dict[tuple[int, int], int] = {}
    for i, j in itertools.combinations(range(8), 2):
        if i // 2 == j // 2:
            pairs[(i, j)] = LinkLevel.SINGLE
        elif i // 4 == j // 4:
            pairs[(i, j)] = LinkLevel.NODE
    return NodeTopology(
        name="pcie-8-2numa",
        link=_matrix(8, pairs, LinkLevel.SYSTEM),
        numa=(0, 0, 0, 0, 1, 1, 1, 1),
        nic=(0, 0, 0, 0, 1, 1, 1, 1),
        nic_gbps=25.0,
    )


def nvlink_pairs_4gpu(nvlinks: int = 12) -> NodeTopology:
    """4 PCIe GPUs bridged in NVLink pairs (e.g. A100 PCIe with NVLink bridges: 0-1 and 2-3,
    NV12), one pair per socket (SYS between pairs); one 200 Gb/s NIC on socket 0."""
    nv = link_code(LinkLevel.SINGLE, nvlinks)
    return NodeTopology(
        name="nvlink-pairs-4",
        link=_matrix(4, {(0, 1): nv, (2, 3): nv}, LinkLevel.SYSTEM),
        numa=(0, 0, 1, 1),
        nic=(0, 0, 0, 0),
        nic_gbps=25.0,
    )


PRESETS = {
    "hgx-8-nvswitch": hgx_8gpu_nvswitch,
    "pcie-8-2numa": pcie_8gpu_2numa,
    "nvlink-pairs-4": nvlink_pairs_4gpu,
}


def preset(name: str) -> NodeTopology:
    if name not in PRESETS:
        raise ValueError(f"topology preset: got {name!r}, expected one of {sorted(PRESETS)}")
    return PRESETS[name]()


# ---------------------------------------------------------------------------------------------
# Cluster topology (levels above the node)

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
