"""Built-in plugins: the registry, and the target workload the fragmentation-aware ones read.

``builtin_registry()`` lists every core plugin explicitly (no import-time registration); the
composition root (cli) calls it and may merge out-of-tree plugins. ``with_target`` hands a
Profile's fragmentation-aware plugins their target workload. The named policies (Profile
presets) are not here: they ship as configuration files (kallot.config, ``profiles/*.yaml``),
and ``kallot.config.presets`` turns a document into a Framework.
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


# Plugins (scores and filters) that read a target workload (plugin name -> arg key).
_TARGETED = {"FGD": "target", "KallotScore": "target", "Topology": "target", "CpuReserve": "target"}


def with_target(base: Profile, target: frag.TargetWorkload) -> Profile:
    """``base`` with ``target`` handed to its fragmentation-aware plugins (their ``target``
    arg): the simulators know the workload they place, a configuration file cannot say it."""
    args: dict[str, Mapping[str, Any]] = {k: dict(v) for k, v in base.args.items()}
    for plugin in (*(p for p, _ in base.score), *base.filter):
        if plugin in _TARGETED:
            args[plugin] = {**args.get(plugin, {}), _TARGETED[plugin]: target}
    return dataclasses.replace(base, args=args)
