"""Topology: how the GPUs of a node are linked, and how nodes group into blocks, racks and hosts.

In a node: link codes per GPU pair (NVML's common-ancestor levels plus NVLink link counts), NUMA
node and NIC affinity per GPU, NVLink islands, machine presets, and ``rank_gpu_sets``: which
``count`` free GPUs talk fastest, under a cost that a brute-force oracle can check. Above the
node: ``ClusterTopology`` turns node labels into nested domains (block > rack > host).

Where it sits: the Topology plugin and gang placement use it inside a session; the node agent's
``GetPreferredAllocation`` calls ``rank_gpu_sets`` with the link matrix it read from NVML, so both
sides rank GPU sets the same way. Pure: numpy and the standard library only.

A package of five modules, one per job: ``links`` (link codes, bandwidth, pair cost),
``gpu_sets`` (ranking GPU sets), ``groups`` (NVLink islands, NUMA nodes), ``machines`` (machine
presets) and ``cluster`` (levels above the node, gang context, required topology). Every name
is defined once there and imported here, so callers write ``topology.rank_gpu_sets``.
"""

from __future__ import annotations

from kallot.core.topology.cluster import (
    DEFAULT_CLUSTER_TOPOLOGY,
    HOSTNAME_LABEL,
    ClusterLevel,
    ClusterTopology,
    GangContext,
    required_in_node_level,
    required_mask,
    required_rejections,
)
from kallot.core.topology.gpu_sets import (
    EXACT_LIMIT,
    GpuChoice,
    GpuSet,
    best_gpu_set,
    describe_set,
    rank_gpu_sets,
)
from kallot.core.topology.groups import (
    IN_NODE_LEVELS,
    InNodeLevel,
    NodeGroups,
    in_one_group,
    islands_from_links,
    largest_group,
    satisfied,
)
from kallot.core.topology.links import (
    COST_SCALE,
    DEFAULT_BANDWIDTHS,
    MAX_NVLINKS,
    NVLINK_BASE,
    UNKNOWN,
    Bandwidths,
    LinkLevel,
    level_of,
    link_code,
    link_matrix,
    link_name,
    nvlinks_of,
    pair_costs,
)
from kallot.core.topology.machines import (
    PRESETS,
    NodeTopology,
    hgx_8gpu_nvswitch,
    nvlink_pairs_4gpu,
    pcie_8gpu_2numa,
    preset,
)

__all__ = [
    "COST_SCALE",
    "DEFAULT_BANDWIDTHS",
    "DEFAULT_CLUSTER_TOPOLOGY",
    "EXACT_LIMIT",
    "HOSTNAME_LABEL",
    "IN_NODE_LEVELS",
    "MAX_NVLINKS",
    "NVLINK_BASE",
    "PRESETS",
    "UNKNOWN",
    "Bandwidths",
    "ClusterLevel",
    "ClusterTopology",
    "GangContext",
    "GpuChoice",
    "GpuSet",
    "InNodeLevel",
    "LinkLevel",
    "NodeGroups",
    "NodeTopology",
    "best_gpu_set",
    "describe_set",
    "hgx_8gpu_nvswitch",
    "in_one_group",
    "islands_from_links",
    "largest_group",
    "level_of",
    "link_code",
    "link_matrix",
    "link_name",
    "nvlink_pairs_4gpu",
    "nvlinks_of",
    "pair_costs",
    "pcie_8gpu_2numa",
    "preset",
    "rank_gpu_sets",
    "required_in_node_level",
    "required_mask",
    "required_rejections",
    "satisfied",
]
