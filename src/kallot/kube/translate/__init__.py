"""Kubernetes objects (plain dicts) -> core types: pods to ``Task``s (``translate.pod``), nodes to
``NodeSpec``s (``translate.node``), PodGroups to ``Job``s and Queues to the ``QueueTree``
(``translate.groups``), device records (``translate.record``), all on exact quantities
(``translate.quantity``); ``translate.keys`` warns about ``kallot.io/`` keys kallot does not read;
``translate.models`` reads the model weights a pod loads and a node caches.

The only bilingual part of the live scheduler: the cache (``kube.state.store``) calls it once per
object version and keeps the result. A package of its own below the state, the owners, DRA and
the binder (all of which read its names and quantities), importing none of them. Bad input raises ``ConfigError`` naming the field, the
value and what was expected; problem reporting (``kube.schedule.problems``) turns that into
an Event on the pod. The wire names
(resources, annotations, labels) are defined once in ``config.wire`` and re-exported here for
the kube shell's callers (``translate.RESOURCE_GPU``).
"""

from __future__ import annotations

from kallot.config.wire import (
    ANN_BIND_PHASE,
    ANN_BIND_TIME,
    ANN_DEVICES,
    ANN_DO_NOT_DISRUPT,
    ANN_GPU_MODEL,
    ANN_ISOLATION,
    ANN_KARPENTER_DO_NOT_DISRUPT,
    ANN_MIN_RUNTIME,
    ANN_SHARING,
    ANN_TOPOLOGY,
    KALLOT_PREFIX,
    LABEL_GFD_MEMORY,
    LABEL_GFD_PRODUCT,
    LABEL_GFD_SHARING,
    LABEL_POD_GROUP,
    LABEL_QUEUE,
    RESOURCE_GPU,
    RESOURCE_GPU_MEMORY,
    RESOURCE_GPU_MILLI,
    RESOURCE_MIG_PREFIX,
    SCHEDULER_NAME,
)
from kallot.kube.translate.groups import (
    DEFAULT_QUEUE,
    QueueClaim,
    QueueSpec,
    pod_group_to_job,
    queue_refusal,
    queue_spec,
    queue_tree,
)
from kallot.kube.translate.keys import (
    POD_ANNOTATION_KEYS,
    POD_LABEL_KEYS,
    unknown_key_warnings,
)
from kallot.kube.translate.node import (
    DEFAULT_TOLERATED_TAINTS,
    NodeInfo,
    NodeMig,
    node_info,
    plugins_not_serving,
)
from kallot.kube.translate.pod import (
    MIG_PROFILES,
    PodResources,
    foreign_whole_gpus,
    host_requests,
    is_kallot_pod,
    job_id,
    parse_topology,
    pod_finished,
    pod_key,
    pod_node,
    pod_resources,
    pod_started,
    pod_to_task,
)
from kallot.kube.translate.quantity import (
    MIB,
    ceil_int,
    cpu_milli,
    mem_mib,
    parse_duration,
    parse_quantity,
    parse_time,
)
from kallot.kube.translate.record import (
    pod_record,
    record_annotations,
    record_to_assignments,
)

__all__ = [
    "ANN_BIND_PHASE",
    "ANN_BIND_TIME",
    "ANN_DEVICES",
    "ANN_DO_NOT_DISRUPT",
    "ANN_GPU_MODEL",
    "ANN_ISOLATION",
    "ANN_KARPENTER_DO_NOT_DISRUPT",
    "ANN_MIN_RUNTIME",
    "ANN_SHARING",
    "ANN_TOPOLOGY",
    "DEFAULT_QUEUE",
    "DEFAULT_TOLERATED_TAINTS",
    "KALLOT_PREFIX",
    "LABEL_GFD_MEMORY",
    "LABEL_GFD_PRODUCT",
    "LABEL_GFD_SHARING",
    "LABEL_POD_GROUP",
    "LABEL_QUEUE",
    "MIB",
    "MIG_PROFILES",
    "POD_ANNOTATION_KEYS",
    "POD_LABEL_KEYS",
    "RESOURCE_GPU",
    "RESOURCE_GPU_MEMORY",
    "RESOURCE_GPU_MILLI",
    "RESOURCE_MIG_PREFIX",
    "SCHEDULER_NAME",
    "NodeInfo",
    "NodeMig",
    "PodResources",
    "QueueClaim",
    "QueueSpec",
    "ceil_int",
    "cpu_milli",
    "foreign_whole_gpus",
    "host_requests",
    "is_kallot_pod",
    "job_id",
    "mem_mib",
    "node_info",
    "parse_duration",
    "parse_quantity",
    "parse_time",
    "parse_topology",
    "plugins_not_serving",
    "pod_finished",
    "pod_group_to_job",
    "pod_key",
    "pod_node",
    "pod_record",
    "pod_resources",
    "pod_started",
    "pod_to_task",
    "queue_refusal",
    "queue_spec",
    "queue_tree",
    "record_annotations",
    "record_to_assignments",
    "unknown_key_warnings",
]
