"""GPU links inside a node: link codes per GPU pair (NVML's common-ancestor levels plus NVLink
link counts), their names, the link matrix of a machine, and bandwidth and pair cost per link.

Where it sits: part of ``core.topology`` (the model layer); the node agent builds link matrices
from NVML with ``link_matrix``.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

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
