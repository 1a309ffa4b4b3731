"""Machine presets: one machine's GPU topology (``NodeTopology``: links, NUMA nodes, NICs) and
the shapes kallot ships (HGX 8-GPU NVSwitch, PCIe 8-GPU on two NUMA nodes, 4 GPUs in NVLink
pairs).

Where it sits: part of ``core.topology`` (the model layer); tests, the fake node inventory and
the simulators build nodes from them.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from kallot.core.topology.groups import islands_from_links
from kallot.core.topology.links import UNKNOWN, LinkLevel, link_code

I8 = NDArray[np.int8]
I32 = NDArray[np.int32]
I64 = NDArray[np.int64]
BOOL = NDArray[np.bool_]


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
