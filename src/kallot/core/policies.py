"""Built-in plugins and named policies (Profile presets).

``builtin_registry()`` lists every core plugin explicitly (no import-time registration); the
composition root (cli) calls it and may merge out-of-tree plugins. ``PROFILES`` maps the policy
names used on the command line to Profiles; ``profile(name, target=...)`` hands the
fragmentation-aware policies their target workload.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from kallot.core import frag
from kallot.core.errors import ConfigError
from kallot.core.framework.plugin import Plugin
from kallot.core.framework.profile import Profile
from kallot.core.framework.registry import Registry
from kallot.core.plugins.best_fit import BestFit
from kallot.core.plugins.cpu_reserve import CpuReserve
from kallot.core.plugins.device_fit import DeviceFit
from kallot.core.plugins.dot_product import DotProduct
from kallot.core.plugins.dra_fit import DraAllocation
from kallot.core.plugins.fgd import FGD
from kallot.core.plugins.gpu_clustering import GpuClustering
from kallot.core.plugins.gpu_packing import GpuPacking
from kallot.core.plugins.k8s_affinity import InterPodAffinity, PodTopologySpread
from kallot.core.plugins.k8s_node import (
    ExtendedResources,
    NodeAffinity,
    NodePorts,
    NodeUnschedulable,
    NominatedNode,
    NominatedReservation,
    TaintToleration,
    VolumeBinding,
)
from kallot.core.plugins.kallot_score import KallotScore
from kallot.core.plugins.memory_fit import MemoryFit
from kallot.core.plugins.mig_fit import MigFit
from kallot.core.plugins.model_cache import ModelCacheScore
from kallot.core.plugins.node_resources_fit import NodeResourcesFit
from kallot.core.plugins.node_selector import NodeSelector
from kallot.core.plugins.priority_sort import PrioritySort
from kallot.core.plugins.random_score import RandomGpu, RandomScore
from kallot.core.plugins.required_topology import RequiredTopology
from kallot.core.plugins.topology_aware import TopologyAware


def _no_args(cls: type[Plugin]) -> Callable[[Mapping[str, Any]], Any]:
    def factory(args: Mapping[str, Any]) -> Any:
        if args:
            raise ConfigError(f"{cls.name} args", dict(args), "no args")
        return cls()

    return factory


def _cpu_reserve(args: Mapping[str, Any]) -> CpuReserve:
    unknown = set(args) - {"target"}
    if unknown:
        raise ConfigError("CpuReserve args", sorted(unknown), "only ['target']")
    target = args.get("target")
    if target is not None and not isinstance(target, frag.TargetWorkload):
        raise ConfigError("CpuReserve args.target", type(target).__name__, "a TargetWorkload")
    return CpuReserve(target)


def builtin_registry() -> Registry:
    """Every plugin the core ships, by name."""
    return Registry(
        {
            PrioritySort.name: _no_args(PrioritySort),
            NodeResourcesFit.name: _no_args(NodeResourcesFit),
            NodeSelector.name: _no_args(NodeSelector),
            DeviceFit.name: _no_args(DeviceFit),
            MigFit.name: _no_args(MigFit),
            MemoryFit.name: _no_args(MemoryFit),
            RandomScore.name: _no_args(RandomScore),
            RandomGpu.name: _no_args(RandomGpu),
            DotProduct.name: _no_args(DotProduct),
            GpuClustering.name: _no_args(GpuClustering),
            GpuPacking.name: _no_args(GpuPacking),
            BestFit.name: _no_args(BestFit),
            FGD.name: FGD.from_args,
            KallotScore.name: KallotScore.from_args,
            CpuReserve.name: _cpu_reserve,
            TopologyAware.name: TopologyAware.from_args,
            ModelCacheScore.name: ModelCacheScore.from_args,
            RequiredTopology.name: _no_args(RequiredTopology),
            **{
                cls.name: _no_args(cls)
                for cls in (
                    NodeUnschedulable,
                    TaintToleration,
                    NodeAffinity,
                    NodePorts,
                    ExtendedResources,
                    VolumeBinding,
                    InterPodAffinity,
                    PodTopologySpread,
                    NominatedNode,
                    NominatedReservation,
                    DraAllocation,
                )
            },
        }
    )


# Kubernetes semantics beyond resources (core.plugins.k8s_*), in every profile: no-ops for
# tasks without ``Task.k8s`` (simulations), kube-scheduler's rules for pods.
K8S_FILTERS = (
    "NodeUnschedulable",
    "TaintToleration",
    "NodeAffinity",
    "NodePorts",
    "ExtendedResources",
    "VolumeBinding",
    "PodTopologySpread",
    "InterPodAffinity",
    "NominatedReservation",
    "DraAllocation",
)
# Their scores (0 for tasks without Task.k8s); a preemptor's nominated node outweighs all.
K8S_SCORES: tuple[tuple[str, int], ...] = (
    ("TaintToleration", 1),
    ("NodeAffinity", 1),
    ("InterPodAffinity", 1),
    ("PodTopologySpread", 1),
    ("NominatedNode", 1000),
    # DRA claims: the node whose allocation kallot's DRA policy likes best.
    ("DraAllocation", 10),
)

# MigFit serves MIG requests (DeviceFit passes them through), in every profile.
# RequiredTopology makes ``required`` topology a filter under every policy (it scores nothing);
# it is also the first DeviceScore plugin of the profiles without the Topology plugin.
FILTERS = (
    "NodeResourcesFit",
    "NodeSelector",
    "DeviceFit",
    "MigFit",
    "RequiredTopology",
    *K8S_FILTERS,
)
PRE_FILTERS = ("RequiredTopology",)
REQUIRED = "RequiredTopology"
# Declared capabilities (``Profile.mig``, ``Profile.gang_topology``): MigFit chooses MIG
# instances in every profile; gangs are placed under RequiredTopology's GangTopology (required
# domains only), or the Topology plugin's (topology-aware) in the ``topology`` profile.
MIG = "MigFit"

# The openb paper's six policies (names as on kallot's command line) and kallot's default.
# GPU choice inside the node: 'best' (the framework default: tightest fit for shares,
# lowest-index idle GPUs for whole GPUs) unless a DeviceScore plugin is listed.
PROFILES: dict[str, Profile] = {
    # No score plugins: the seeded node order decides (used by tests of the framework itself).
    "first-fit": Profile(
        name="first-fit",
        pre_filter=PRE_FILTERS,
        filter=FILTERS,
        device_score=(REQUIRED,),
        mig=MIG,
        gang_topology=REQUIRED,
    ),
    "random": Profile(
        name="random",
        pre_filter=PRE_FILTERS,
        filter=FILTERS,
        score=(("RandomScore", 1),),
        device_score=(REQUIRED, "RandomGpu"),
        mig=MIG,
        gang_topology=REQUIRED,
    ),
    "dotprod": Profile(
        name="dotprod",
        pre_filter=PRE_FILTERS,
        filter=FILTERS,
        score=(("DotProduct", 1),),
        device_score=(REQUIRED,),
        mig=MIG,
        gang_topology=REQUIRED,
    ),
    "clustering": Profile(
        name="clustering",
        pre_filter=PRE_FILTERS,
        filter=FILTERS,
        score=(("GpuClustering", 1),),
        device_score=(REQUIRED,),
        mig=MIG,
        gang_topology=REQUIRED,
    ),
    "packing": Profile(
        name="packing",
        pre_filter=PRE_FILTERS,
        filter=FILTERS,
        score=(("GpuPacking", 1),),
        device_score=(REQUIRED,),
        mig=MIG,
        gang_topology=REQUIRED,
    ),
    "bestfit": Profile(
        name="bestfit",
        pre_filter=PRE_FILTERS,
        filter=FILTERS,
        score=(("BestFit", 1),),
        device_score=(REQUIRED,),
        mig=MIG,
        gang_topology=REQUIRED,
    ),
    "fgd": Profile(
        name="fgd",
        pre_filter=PRE_FILTERS,
        filter=FILTERS,
        score=(("FGD", 1),),
        device_score=(REQUIRED, "FGD"),
        mig=MIG,
        gang_topology=REQUIRED,
    ),
    "kallot": Profile(
        name="kallot",
        pre_filter=PRE_FILTERS,
        # CpuReserve: CPU-only tasks keep off the CPU idle GPUs need once CPU runs out first.
        filter=(*FILTERS, "CpuReserve"),
        # MemoryFit scores 0 and chooses nothing unless a share says its memory (openb's never
        # do), so KallotScore alone decides for milli-GPU shares and whole GPUs.
        score=(("KallotScore", 1), ("MemoryFit", 1), ("ModelCache", 1)),  # docs/serving.md
        device_score=(REQUIRED, "MemoryFit", "KallotScore"),
        mig=MIG,
        gang_topology=REQUIRED,
    ),
}

# kallot with topology: one plugin filters (in-node 'required', a gang's domain), scores
# (fragmentation against locality, docs/design/006-topology.md) and picks the GPU set.
PROFILES["topology"] = Profile(
    name="topology",
    pre_filter=("Topology",),
    filter=(*FILTERS, "Topology"),
    score=(("Topology", 1),),
    device_score=("Topology",),
    mig=MIG,
    gang_topology="Topology",
)

for _name, _profile in PROFILES.items():
    PROFILES[_name] = dataclasses.replace(_profile, score=(*_profile.score, *K8S_SCORES))

# Plugins (scores and filters) that read a target workload (plugin name -> arg key).
_TARGETED = {"FGD": "target", "KallotScore": "target", "Topology": "target", "CpuReserve": "target"}

POLICY_NAMES = ("random", "dotprod", "clustering", "packing", "bestfit", "fgd", "kallot")


def profile(name: str, *, target: frag.TargetWorkload | None = None) -> Profile:
    """The named policy's Profile; ``target`` goes to its fragmentation-aware plugins."""
    if name not in PROFILES:
        raise ConfigError("policy", name, f"one of {', '.join(POLICY_NAMES)}")
    base = PROFILES[name]
    if target is None:
        return base
    args: dict[str, Mapping[str, Any]] = {k: dict(v) for k, v in base.args.items()}
    for plugin in (*(p for p, _ in base.score), *base.filter):
        if plugin in _TARGETED:
            args[plugin] = {**args.get(plugin, {}), _TARGETED[plugin]: target}
    return dataclasses.replace(base, args=args)
