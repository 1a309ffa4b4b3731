"""Node objects (plain dicts) -> the cache's ``NodeInfo``: the core's ``NodeSpec`` (capacities,
GPUs from the node agent's inventory or, without one, from allocatable and GFD labels, taints,
model caches) and the node's MIG instances.

The cache (``kube.state.store``) calls it for every node event and keeps the result while its
``signature`` is unchanged. A bad inventory never raises: it is reported
(``NodeInfo.inventory_error``). The node side is documented in docs/node-inventory.md.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kallot.config import inventory, wire
from kallot.core.errors import ConfigError
from kallot.core.resources import (
    SharingMode,
    canonical_model,
)
from kallot.core.snapshot import DEFAULT_MAX_PODS, GpuSpec, NodeSpec
from kallot.kube.api import k8s_fields
from kallot.kube.translate import models as kube_models  # docs/serving.md
from kallot.kube.translate.quantity import cpu_milli, mem_mib, parse_quantity

# Taint keys kallot ignores on every node (``--tolerated-taint``). None by default: a pod lands
# on a tainted node only if it tolerates the taint, as with kube-scheduler (docs/pod-api.md).
DEFAULT_TOLERATED_TAINTS: frozenset[str] = frozenset()


# -- nodes --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeMig:
    """One existing MIG instance on a node: GPU slot, profile name, start slice, uuid."""

    slot: int
    profile: str
    start: int
    uuid: str = ""


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """A node as the cache keeps it: the core's NodeSpec (without usage) and its MIG
    instances. ``inventory_error`` says why a published inventory was not used."""

    spec: NodeSpec
    mig: tuple[NodeMig, ...] = ()
    inventory_error: ConfigError | None = None
    signature: tuple[Any, ...] = ()


def _schedulable(node: Mapping[str, Any]) -> bool:
    """Ready. Cordons and taints are the k8s plugins' (NodeUnschedulable, TaintToleration)."""
    conditions = (node.get("status") or {}).get("conditions") or []
    ready = [c for c in conditions if c.get("type") == "Ready"]
    return bool(ready) and ready[0].get("status") == "True"


def plugins_not_serving(node: Mapping[str, Any]) -> str:
    """The agent's ``kallot.io/DevicePluginsReady`` condition's message while it is False
    (node.kubelet_checkpoint: the kubelet would not give a GPU pod its record's devices now);
    "" when True or absent (no kallot agent, or a DRA-only one)."""
    for c in (node.get("status") or {}).get("conditions") or []:
        if c.get("type") == wire.CONDITION_DEVICE_PLUGINS_READY and c.get("status") == "False":
            return str(c.get("message") or c.get("reason") or "not ready")
    return ""


def _fallback_gpus(name: str, labels: Mapping[str, str], count: int) -> list[GpuSpec]:
    """GPUs of a node without a kallot inventory: count from allocatable, model and memory
    from GFD labels. Exclusive only: nothing on such a node enforces a share."""
    model = canonical_model(labels.get(wire.LABEL_GFD_PRODUCT, "")) or "unknown"
    try:
        memory = int(labels.get(wire.LABEL_GFD_MEMORY, "0"))
    except ValueError:
        memory = 0
    if memory <= 0:
        from kallot.core.resources import GPU_MODELS

        memory = GPU_MODELS[model].memory_mib if model in GPU_MODELS else 0
    return [
        GpuSpec(model=model, mem_mib=memory, uuid=f"GPU-{name}-{i}", mode=SharingMode.EXCLUSIVE)
        for i in range(count)
    ]


def node_info(
    node: Mapping[str, Any], *, tolerated_taints: frozenset[str] = DEFAULT_TOLERATED_TAINTS
) -> NodeInfo:
    """The cache's view of a Node object (never raises for a bad inventory: it is reported)."""
    meta = node.get("metadata") or {}
    status = node.get("status") or {}
    name = str(meta.get("name", ""))
    labels: dict[str, str] = dict(meta.get("labels") or {})
    ann: Mapping[str, str] = meta.get("annotations") or {}
    alloc: Mapping[str, Any] = status.get("allocatable") or status.get("capacity") or {}
    where = f"Node {name}: status.allocatable"

    def amount(key: str, convert: Any, default: int) -> int:
        if key not in alloc:
            return default
        try:
            return int(convert(alloc[key], f"{where}[{key}]"))
        except ConfigError:
            return 0

    cpu = amount("cpu", cpu_milli, 0)
    mem = amount("memory", mem_mib, 0)
    pods = amount("pods", lambda v, f: math.floor(parse_quantity(v, f)), DEFAULT_MAX_PODS)
    gpu_count = amount(wire.RESOURCE_GPU, lambda v, f: math.floor(parse_quantity(v, f)), 0)

    gpus: list[GpuSpec] = []
    migs: list[NodeMig] = []
    error: ConfigError | None = None
    text = ann.get(inventory.ANNOTATION)
    if text:
        try:
            inv = inventory.NodeInventory.from_json(
                text, where=f"Node {name}: metadata.annotations[{inventory.ANNOTATION}]"
            )
            gpus = inv.to_gpu_specs()
            for d in sorted(inv.devices, key=lambda d: d.index):
                for m in d.mig:
                    migs.append(
                        NodeMig(slot=d.index, profile=m.profile, start=m.start, uuid=m.uuid)
                    )
        except ConfigError as exc:
            error = exc
    else:
        gpus = _fallback_gpus(name, labels, gpu_count)
    waiting = plugins_not_serving(node)
    if waiting:
        # Until the kubelet has taken in the plugins' devices, none of them is placed (the
        # DRA pool's GPUs, unhealthy to the core already, are the ResourceSlices' business).
        gpus = [dataclasses.replace(g, healthy=False) for g in gpus]
    spec = NodeSpec(
        name=name,
        cpu_milli=cpu,
        mem_mib=mem,
        gpus=gpus,
        labels=labels,
        max_pods=pods,
        schedulable=_schedulable(node),
        model_cache=kube_models.node_cache(node),
        taints=[t for t in k8s_fields.node_taints(node) if t.key not in tolerated_taints],
        unschedulable=bool((node.get("spec") or {}).get("unschedulable")),
        scalars=k8s_fields.node_scalars(alloc, parse_quantity),
    )
    signature = (
        cpu,
        mem,
        pods,
        spec.schedulable,
        tuple(sorted(labels.items())),
        text or "",
        gpu_count if not text else -1,
        kube_models.node_signature(node),
        tuple(spec.taints),
        spec.unschedulable,
        tuple(sorted(spec.scalars.items())),
        waiting,
    )
    return NodeInfo(spec=spec, mig=tuple(migs), inventory_error=error, signature=signature)
