"""``autoscale`` of the scheduler configuration: the node shapes an autoscaler can add and
consolidation's limits, validated at the edge and turned into core values.

Where it sits: the config layer, below the shells. ``SchedulerConfiguration.autoscale``
(``config.scheduler``) holds an ``AutoscaleDoc``; ``shapes`` gives the ``core.provision``
``NodeShape``s the scale-up planner plans with and ``consolidation`` the core's
``ConsolidationConfig``. docs/autoscaling.md documents every field; ``node_shapes_from_nodepool``
maps a Karpenter NodePool's instance types onto shapes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

from kallot.core.errors import ConfigError
from kallot.core.k8s import Taint
from kallot.core.provision.shapes import DEFAULT_MAX_NEW, NodeShape
from kallot.core.resources import GPU_MODELS, SharingMode

if TYPE_CHECKING:
    from kallot.core.provision.consolidate import ConsolidationConfig

# Karpenter's well-known label of the NodePool a node belongs to, and its instance type label.
NODEPOOL_LABEL = "karpenter.sh/nodepool"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
MODES = {"exclusive": SharingMode.EXCLUSIVE, "mps": SharingMode.MPS, "mig": SharingMode.MIG}


class _Doc(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, populate_by_name=True, alias_generator=to_camel
    )


class TaintDoc(_Doc):
    key: str = Field(min_length=1)
    value: str = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"


class NodeShapeDoc(_Doc):
    """One kind of node (a NodePool and one of its instance types)."""

    name: str = Field(min_length=1)
    cpu: float = Field(gt=0)  # cores
    memory_gi_b: float = Field(gt=0, alias="memoryGiB")
    gpu_model: str = ""
    gpus: int = Field(default=0, ge=0)
    gpu_mode: Literal["exclusive", "mps", "mig"] = "mps"
    node_pool: str = ""  # Karpenter NodePool whose nodes have this shape
    instance_type: str = ""
    labels: dict[str, str] = Field(default_factory=dict)
    taints: tuple[TaintDoc, ...] = ()
    cost_per_hour: float = Field(default=0.0, ge=0)
    max_new: int = Field(default=DEFAULT_MAX_NEW, ge=0)

    @field_validator("gpu_model")
    @classmethod
    def _model(cls, v: str) -> str:
        if v and v not in GPU_MODELS:
            raise ValueError(f"a GPU model, one of {', '.join(sorted(GPU_MODELS))}")
        return v

    def shape(self) -> NodeShape:
        labels = dict(self.labels)
        if self.node_pool:
            labels.setdefault(NODEPOOL_LABEL, self.node_pool)
        if self.instance_type:
            labels.setdefault(INSTANCE_TYPE_LABEL, self.instance_type)
        return NodeShape(
            name=self.name,
            cpu_milli=round(self.cpu * 1000),
            mem_mib=round(self.memory_gi_b * 1024),
            gpu_model=self.gpu_model,
            gpus=self.gpus,
            gpu_mode=MODES[self.gpu_mode],
            mig_dynamic=self.gpu_mode == "mig",
            labels=labels,
            taints=tuple(Taint(key=t.key, value=t.value, effect=t.effect) for t in self.taints),
            cost=self.cost_per_hour,
            max_new=self.max_new,
        )


class ConsolidationDoc(_Doc):
    enabled: bool = False
    evictions_per_minute: int = Field(default=2, ge=0)
    gain_threshold: float = Field(default=1.0, ge=0)  # GPUs a move must free
    interval_seconds: float = Field(default=60.0, gt=0)

    def config(self) -> ConsolidationConfig:
        # Here, not at the top: the consolidation planner is the live scheduler's (and
        # ``kallot sim autoscale``'s); every reader of a configuration document imports this.
        from kallot.core.provision.consolidate import ConsolidationConfig

        return ConsolidationConfig(
            enabled=self.enabled,
            evictions_per_minute=self.evictions_per_minute,
            gain_threshold=self.gain_threshold,
            interval_s=self.interval_seconds,
        )


class AutoscaleDoc(_Doc):
    """``provisioner``: how kallot asks for the nodes it plans (``none``: plan and report
    only; ``karpenter``: placeholder pods Karpenter provisions for; ``provisioningRequest``:
    ``autoscaling.x-k8s.io/v1`` ProvisioningRequests for gangs, placeholders for the rest)."""

    provisioner: Literal["none", "karpenter", "provisioningRequest"] = "none"
    # Where the Karpenter placeholder pods live (the scheduler's RBAC lets it create pods there).
    placeholder_namespace: str = Field(default="kube-system", min_length=1)
    # An ask no node answered in this long is withdrawn; its pods are planned again.
    scale_up_timeout_seconds: float = Field(default=600.0, gt=0)
    node_shapes: tuple[NodeShapeDoc, ...] = ()
    consolidation: ConsolidationDoc = Field(default_factory=ConsolidationDoc)

    @field_validator("node_shapes")
    @classmethod
    def _unique(cls, v: tuple[NodeShapeDoc, ...]) -> tuple[NodeShapeDoc, ...]:
        names = [s.name for s in v]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"unique shape names (repeated: {', '.join(dup)})")
        return v

    def shapes(self) -> tuple[NodeShape, ...]:
        return tuple(s.shape() for s in self.node_shapes)


def node_shapes_from_nodepool(
    nodepool: Mapping[str, Any], instance_types: Mapping[str, Mapping[str, Any]]
) -> tuple[NodeShape, ...]:
    """Shapes of a Karpenter ``NodePool`` (``karpenter.sh/v1``): one per instance type its
    ``node.kubernetes.io/instance-type`` requirement allows (``In``), described by
    ``instance_types[name]`` = {cpu, memoryGiB, gpuModel, gpus[, gpuMode, costPerHour]} (the
    cloud's catalogue: Karpenter's own instance-type list is not an API object). The pool's
    template labels and taints go to every shape."""
    name = str(nodepool.get("metadata", {}).get("name", ""))
    spec = nodepool.get("spec", {}).get("template", {})
    labels = dict(spec.get("metadata", {}).get("labels", {}) or {})
    node_spec = spec.get("spec", {})
    taints = tuple(node_spec.get("taints", ()) or ())
    allowed: list[str] = []
    for req in node_spec.get("requirements", ()) or ():
        if req.get("key") == INSTANCE_TYPE_LABEL and req.get("operator") == "In":
            allowed.extend(str(v) for v in req.get("values", ()))
    if not allowed:
        raise ConfigError(
            f"NodePool {name}: spec.template.spec.requirements",
            None,
            f"a requirement on {INSTANCE_TYPE_LABEL} with operator In",
        )
    out = []
    for itype in allowed:
        desc = instance_types.get(itype)
        if desc is None:
            raise ConfigError(
                f"NodePool {name}: instance type", itype, f"one of {sorted(instance_types)}"
            )
        doc = NodeShapeDoc.model_validate(
            {
                **desc,
                "name": f"{name}-{itype}",
                "nodePool": name,
                "instanceType": itype,
                "labels": labels,
                "taints": taints,
            }
        )
        out.append(doc.shape())
    return tuple(out)
