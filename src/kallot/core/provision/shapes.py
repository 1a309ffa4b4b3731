"""Node shapes: what kind of node an autoscaler can add, as the planner sees it.

Where it sits: the model of ``core.provision``. Shells build ``NodeShape``s from kallot's
scheduler configuration (``autoscale.shapes``, ``kallot.config.autoscale``) or from Karpenter
NodePools' instance types, and the planner (``core.provision.plan``) turns a shape into the
``NodeSpec`` of a hypothetical node that the same core then places pods on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kallot.core.k8s import Taint
from kallot.core.resources import GPU_MODELS, SharingMode
from kallot.core.snapshot import GpuSpec, NodeSpec
from kallot.core.topology.cluster import HOSTNAME_LABEL

DEFAULT_MAX_NEW = 64  # nodes of one shape one plan may ask for unless the shape says otherwise


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeShape:
    """One kind of node an autoscaler can create.

    ``gpus`` GPUs of ``gpu_model`` (0: a CPU node), each in ``gpu_mode`` (``mig_dynamic``: a
    MIG GPU whose layout kallot sets on demand, which is what a new node offers). ``labels``
    and ``taints`` are what a node of this shape carries (Karpenter copies its NodePool's
    template labels and taints to every node it makes): node selectors, tolerations and the
    topology levels of gangs are checked against them. ``cost`` (per hour, any unit) is what
    the planner minimises; 0 means the shape's GPU count (1 for a CPU node), so the default
    objective is GPU-hours. ``max_new``: at most this many new nodes per plan (a NodePool's
    limits).
    """

    name: str
    cpu_milli: int
    mem_mib: int
    gpu_model: str = ""
    gpus: int = 0
    gpu_mode: SharingMode = SharingMode.MPS
    mig_dynamic: bool = False
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: Sequence[Taint] = ()
    cost: float = 0.0
    max_new: int = DEFAULT_MAX_NEW
    max_pods: int = 110

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("NodeShape.name: empty, expected a name")
        if self.cpu_milli <= 0 or self.mem_mib <= 0:
            raise ValueError(
                f"NodeShape {self.name}: cpu_milli {self.cpu_milli}, mem_mib {self.mem_mib}, "
                "expected > 0"
            )
        if self.gpus < 0 or (self.gpus and self.gpu_model not in GPU_MODELS):
            raise ValueError(
                f"NodeShape {self.name}: gpus {self.gpus} of model {self.gpu_model!r}, expected "
                f"gpus >= 0 and a model in {sorted(GPU_MODELS)}"
            )
        if self.cost < 0 or self.max_new < 0:
            raise ValueError(
                f"NodeShape {self.name}: cost {self.cost}, max_new {self.max_new}, expected >= 0"
            )

    @property
    def price(self) -> float:
        """What one node of this shape costs the objective (``cost``, or its GPU count)."""
        return self.cost or float(max(1, self.gpus))

    def node(self, name: str) -> NodeSpec:
        """A new, empty node of this shape named ``name``."""
        mem = GPU_MODELS[self.gpu_model].memory_mib if self.gpus else 0
        gpus = [
            GpuSpec(
                model=self.gpu_model,
                mem_mib=mem,
                uuid=f"GPU-{name}-{j}",
                mode=self.gpu_mode,
                mig_dynamic=self.mig_dynamic and self.gpu_mode is SharingMode.MIG,
                numa=j * 2 // max(1, self.gpus),
            )
            for j in range(self.gpus)
        ]
        return NodeSpec(
            name=name,
            cpu_milli=self.cpu_milli,
            mem_mib=self.mem_mib,
            gpus=gpus,
            labels={**self.labels, HOSTNAME_LABEL: name},
            taints=tuple(self.taints),
            max_pods=self.max_pods,
        )
