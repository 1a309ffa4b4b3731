"""The wire names of kallot's API, defined once: resource names, annotation and label keys, the
scheduler name and the CRD group.

Sits below every shell (``config`` layer), so the scheduler (``kube``), the node agent
(``node``), the reports and the test helpers read the same strings. The pod API they make up is
documented in docs/pod-api.md, the node side in docs/node-inventory.md.
"""

from __future__ import annotations

from kallot.core import workload as _workload

# -- the scheduler and its CRDs ------------------------------------------------------------------

SCHEDULER_NAME = "kallot"  # spec.schedulerName of the pods kallot schedules
CRD_GROUP = "kallot.io"  # PodGroup and Queue (kallot.io/v1alpha1)
CRD_VERSION = "v1alpha1"
KALLOT_PREFIX = "kallot.io/"  # every kallot annotation and label key starts with it

# -- resources a pod asks for (and a node's device plugin advertises) ------------------------------

RESOURCE_GPU = "nvidia.com/gpu"  # whole GPUs (the device plugin's resource)
RESOURCE_GPU_MILLI = "kallot.io/gpu-milli"  # a compute share of one GPU, 1..1000
RESOURCE_GPU_MEMORY = "kallot.io/gpu-memory"  # the memory of that share (a quantity)
RESOURCE_MIG_PREFIX = "nvidia.com/mig-"  # nvidia.com/mig-3g.40gb: 1 (GFD's mixed strategy)

# -- pod annotations and labels (docs/pod-api.md) --------------------------------------------------

ANN_GPU_MODEL = "kallot.io/gpu-model"
ANN_SHARING = "kallot.io/sharing"
ANN_ISOLATION = "kallot.io/isolation"
ANN_TOPOLOGY = "kallot.io/topology"
ANN_DO_NOT_DISRUPT = "kallot.io/do-not-disrupt"
# Karpenter's convention for pods no voluntary disruption may touch (stateful LLM servers);
# honoured like kallot.io/do-not-disrupt so one annotation protects a pod from both.
ANN_KARPENTER_DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
ANN_MIN_RUNTIME = "kallot.io/min-runtime"
# The longest kallot.io/min-runtime accepted (a pod asking more pends with a one-line reason):
# core.workload.MIN_RUNTIME_MAX_S, defined where the task's field is.
MIN_RUNTIME_MAX_S = _workload.MIN_RUNTIME_MAX_S
ANN_MODEL = "kallot.io/model"  # the model a pod serves (docs/serving.md)
ANN_MODEL_SIZE = "kallot.io/model-size"
# Set by the scheduler beside karpenter.sh/do-not-disrupt on the model servers it protects, so
# it clears only what it set (kube.autoscale.disruption).
ANN_DISRUPTION_GUARD = "kallot.io/disruption-guard"
LABEL_POD_GROUP = "kallot.io/pod-group"
LABEL_QUEUE = "kallot.io/queue"

# Written by the scheduler when it binds a pod (config.device_record):
ANN_DEVICES = "kallot.io/devices"  # the device record (JSON)
ANN_BIND_PHASE = (
    "kallot.io/bind-phase"  # "allocating" (set by the scheduler) -> "allocated" (agent)
)
ANN_BIND_TIME = "kallot.io/bind-time"  # unix time in nanoseconds, as a string

# -- CDI (the container edits the node agent hands the runtime) ----------------------------------

CDI_KIND_GPU = "nvidia.com/gpu"  # the CDI kind of kallot's GPU devices (vendor/class)
CDI_ANN_POD = "kallot.io/pod"  # CDI annotation naming the pod a device was allocated to

# -- node annotations and labels (docs/node-inventory.md) ------------------------------------------

ANN_GPU_INVENTORY = "kallot.io/gpu-inventory"  # the node agent's inventory (JSON)
ANN_MODEL_CACHE = "kallot.io/model-cache"  # models cached on the node (JSON)
ANN_MIG_PLAN = "kallot.io/mig-plan"  # the scheduler's planned MIG layout (config.mig_plan)
ANN_MIG_PLAN_STATUS = "kallot.io/mig-plan-status"  # the agent's answer to it
# The Node condition the agent writes: False while the kubelet would not give a GPU pod its
# record's devices (node.kubelet_checkpoint); the scheduler then places none there.
CONDITION_DEVICE_PLUGINS_READY = "kallot.io/DevicePluginsReady"
# Set ("true") by the scheduler's scale-up loop on the nodes of a configured node shape that
# hold kallot's pods or were handed to a capacity ask, and removed once they are neither
# (kube.autoscale.scaleup); Karpenter placeholder pods require it absent. Karpenter ignores a
# pod whose node affinity names kubernetes.io/hostname, so taken nodes are marked instead.
LABEL_CAPACITY_TAKEN = "kallot.io/capacity-taken"
# GFD labels, read when a node has no kallot inventory.
LABEL_GFD_PRODUCT = "nvidia.com/gpu.product"
LABEL_GFD_MEMORY = "nvidia.com/gpu.memory"
LABEL_GFD_SHARING = "nvidia.com/gpu.sharing-strategy"
LABEL_GFD_PRESENT = "nvidia.com/gpu.present"
LABEL_GFD_PREFIX = "nvidia.com/"  # every GFD label starts with it
