"""PodGroup and Queue objects (plain dicts) -> the core's ``Job`` (a gang) and ``QueueTree``
(teams' quotas).

The store (``kube.state.store``) calls ``pod_group_to_job`` and ``queue_spec`` for every
PodGroup and Queue event and keeps the result; the session actions (``kube.schedule.actions``)
build the ``QueueTree`` from the Queues' specs when they change. Bad input raises ``ConfigError`` naming the field.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from kallot.core.errors import ConfigError
from kallot.core.queueing.queue_tree import (
    CPU,
    GPU,
    GPU_MEMORY,
    MEMORY,
    Queue,
    QueueResource,
    QueueTree,
    model_resource,
)
from kallot.core.resources import (
    MILLI,
)
from kallot.core.workload import (
    NO_TOPOLOGY,
    Job,
    TopologyConstraint,
    TopologyMode,
)
from kallot.kube.translate.pod import job_id
from kallot.kube.translate.quantity import MIB, ceil_int, parse_quantity

# -- pod groups and queues ----------------------------------------------------------------------


def pod_group_to_job(group: Mapping[str, Any]) -> Job:
    """A ``kallot.io/v1alpha1`` PodGroup as the core's Job (the CRD schema validates types)."""
    meta = group.get("metadata") or {}
    spec = group.get("spec") or {}
    where = f"PodGroup {meta.get('namespace', '')}/{meta.get('name', '')}: spec"
    min_available = spec.get("minAvailable", 1)
    if not isinstance(min_available, int) or min_available < 1:
        raise ConfigError(f"{where}.minAvailable", min_available, "an integer >= 1")
    topology = NO_TOPOLOGY
    topo = spec.get("topology") or {}
    if topo:
        modes = {"required": TopologyMode.REQUIRED, "preferred": TopologyMode.PREFERRED}
        mode = str(topo.get("mode", "required")).lower()
        if mode not in modes or not topo.get("level"):
            raise ConfigError(f"{where}.topology", topo, "{mode: required|preferred, level: <key>}")
        topology = TopologyConstraint(mode=modes[mode], level=str(topo["level"]))
    return Job(
        id=job_id(str(meta.get("namespace", "")), str(meta.get("name", ""))),
        min_available=min_available,
        queue=str(spec.get("queue", "")),
        priority=int(spec.get("priority", 0)),
        topology=topology,
    )


@dataclass(frozen=True, slots=True)
class QueueClaim:
    """A Queue's claim on one resource, in the core's integer units (``core.queueing``):
    ``quota`` guaranteed, ``limit`` hard cap (-1 = none), ``weight`` over-quota weight."""

    quota: int = 0
    limit: int = -1
    weight: int = 1


@dataclass(frozen=True, slots=True)
class QueueSpec:
    """A ``kallot.io/v1alpha1`` Queue (cluster-scoped): a team's quotas in the tree.

    ``claims`` maps the core's resource names (``gpu`` milli GPU-equivalents, ``gpu_memory``
    MiB, ``cpu`` milli-CPU, ``memory`` MiB, ``gpu/<model>`` milli GPUs of that model) to the
    claim. ``queue_tree`` turns the set of them into the core's ``QueueTree``; the session
    then runs the queue actions (fair share, reclaim, preemption) instead of plain allocation.
    """

    name: str
    parent: str = ""
    priority: int = 0
    claims: Mapping[str, QueueClaim] = field(default_factory=dict)
    # The namespaces whose pods may submit to this queue (spec.namespaces); None: any
    # namespace. Queues are cluster-scoped and a pod's kallot.io/queue label is the tenant's
    # own word, so this is what keeps team-b out of team-a's guarantee (docs/security.md).
    namespaces: frozenset[str] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def gpu_quota_milli(self) -> int:
        """The GPU quota (milli GPU-equivalents), -1 when none is set."""
        claim = self.claims.get(GPU)
        return claim.quota if claim is not None else -1


# CRD key under spec.resources -> (core resource, units of one CRD unit).
_QUEUE_RESOURCES: Mapping[str, tuple[str, Decimal]] = {
    "gpu": (GPU, Decimal(MILLI)),
    "gpuMemory": (GPU_MEMORY, Decimal(1) / MIB),
    "cpu": (CPU, Decimal(1000)),
    "memory": (MEMORY, Decimal(1) / MIB),
}


def queue_spec(obj: Mapping[str, Any]) -> QueueSpec:
    """A Queue object as a QueueSpec; ConfigError names the bad field."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    where = f"Queue {meta.get('name')}: spec.resources"
    resources = spec.get("resources") or {}

    def claim(body: Mapping[str, Any], path: str, scale: Decimal) -> QueueClaim:
        def amount(key: str) -> int:
            value = body.get(key)
            if value is None:
                return -1
            return ceil_int(parse_quantity(value, f"{path}.{key}") * scale)

        weight = body.get("overQuotaWeight", 1)
        if not isinstance(weight, int) or weight < 0:
            raise ConfigError(f"{path}.overQuotaWeight", weight, "an integer >= 0")
        return QueueClaim(quota=max(0, amount("quota")), limit=amount("limit"), weight=weight)

    claims: dict[str, QueueClaim] = {}
    for key, (resource, scale) in _QUEUE_RESOURCES.items():
        if resources.get(key):
            claims[resource] = claim(resources[key], f"{where}.{key}", scale)
    for model, body in (resources.get("models") or {}).items():
        claims[model_resource(str(model))] = claim(
            body or {}, f"{where}.models[{model}]", Decimal(MILLI)
        )
    unknown = sorted(set(resources) - {*_QUEUE_RESOURCES, "models"})
    if unknown:
        raise ConfigError(
            f"{where}.{unknown[0]}", resources[unknown[0]], "gpu, gpuMemory, cpu, memory or models"
        )
    namespaces: frozenset[str] | None = None
    if "namespaces" in spec:
        raw = spec["namespaces"]
        path = f"Queue {meta.get('name')}: spec.namespaces"
        if not isinstance(raw, list):
            raise ConfigError(path, raw, "a list of namespace names")
        for i, ns in enumerate(raw):
            if not isinstance(ns, str) or not _DNS_LABEL.fullmatch(ns):
                raise ConfigError(f"{path}[{i}]", ns, "a namespace name (a DNS label)")
        namespaces = frozenset(raw)
    return QueueSpec(
        name=str(meta.get("name", "")),
        parent=str(spec.get("parent", "")),
        priority=int(spec.get("priority", 0)),
        claims=claims,
        namespaces=namespaces,
        extra={
            k: v
            for k, v in spec.items()
            if k not in ("parent", "priority", "resources", "namespaces")
        },
    )


_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def queue_refusal(queue: str, namespace: str, queues: Mapping[str, QueueSpec]) -> str:
    """Why a pod of ``namespace`` may not submit to ``queue`` ("" when it may; "" names the
    default queue, which a Queue object may restrict too). A queue no Queue object defines is
    the core's to resolve (the pod is refused a queue that does not exist)."""
    queue = queue or DEFAULT_QUEUE
    spec = queues.get(queue)
    if spec is None or spec.namespaces is None or namespace in spec.namespaces:
        return ""
    allowed = ", ".join(sorted(spec.namespaces)) or "none"
    return (
        f"namespace {namespace} may not use Queue {queue} (its spec.namespaces: {allowed}); "
        "expected a queue that lists the pod's namespace"
    )


# The leaf that takes pods naming no queue (label kallot.io/queue), unless a Queue of that name
# exists: guaranteed nothing, unlimited, weight 1, so unlabelled pods share what is idle.
DEFAULT_QUEUE = "default"


def queue_tree(specs: Iterable[QueueSpec]) -> QueueTree:
    """The core's queue tree for the cluster's Queues; ConfigError names the bad queue.

    Every claim a Queue makes (GPU-equivalents, GPU memory, CPU, memory, per GPU model) is a
    guarantee and a hard limit; fair share (the dominant resource) is taken over GPU-equivalents
    only, so a team's share of idle GPUs does not depend on how much CPU its pods ask.
    """
    queues = [
        Queue(
            name=q.name,
            parent=q.parent,
            priority=q.priority,
            resources={
                resource: QueueResource(
                    guaranteed=c.quota,
                    limit=None if c.limit < 0 else c.limit,
                    over_quota_weight=float(c.weight),
                )
                for resource, c in q.claims.items()
            },
        )
        for q in sorted(specs, key=lambda q: q.name)
    ]
    if all(q.name != DEFAULT_QUEUE for q in queues):
        queues.append(Queue(name=DEFAULT_QUEUE))
    return QueueTree(queues=tuple(queues), fairness=(GPU,), default_queue=DEFAULT_QUEUE)
