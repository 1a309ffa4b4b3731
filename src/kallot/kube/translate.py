"""Kubernetes objects (plain dicts) -> core types: pods to ``Task``s, nodes to ``NodeSpec``s,
PodGroups to ``Job``s, and device records back to ``DeviceAssignment``s.

The only bilingual module of the live scheduler: the cache calls it once per object version and
keeps the result. Bad input raises ``ConfigError`` naming the field (``spec.containers[0]
.resources.limits[kallot.io/gpu-milli]``, ``metadata.annotations[kallot.io/sharing]``), the
value and what was expected; the controller turns that into an Event on the pod. The pod API is
documented in docs/pod-api.md, the node side in docs/node-inventory.md.
"""

from __future__ import annotations

import datetime as dt
import difflib
import functools
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from kallot.config import device_record, inventory
from kallot.core import mig
from kallot.core.decision import DeviceAssignment
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
    ALL_MODES,
    MILLI,
    Isolation,
    SharingMode,
    canonical_model,
)
from kallot.core.snapshot import DEFAULT_MAX_PODS, GpuSpec, NodeSpec
from kallot.core.workload import (
    NO_TOPOLOGY,
    DeviceRequest,
    Job,
    Task,
    TopologyConstraint,
    TopologyMode,
)
from kallot.kube import k8s_fields
from kallot.kube import models as kube_models  # model weights: pods and nodes (docs/serving.md)

# -- the pod API (docs/pod-api.md) ----------------------------------------------------------

SCHEDULER_NAME = "kallot"
RESOURCE_GPU = "nvidia.com/gpu"  # whole GPUs (the device plugin's resource)
RESOURCE_GPU_MILLI = "kallot.io/gpu-milli"  # a compute share of one GPU, 1..1000
RESOURCE_GPU_MEMORY = "kallot.io/gpu-memory"  # the memory of that share (a quantity)
RESOURCE_MIG_PREFIX = "nvidia.com/mig-"  # nvidia.com/mig-3g.40gb: 1 (GFD's mixed strategy)

ANN_GPU_MODEL = "kallot.io/gpu-model"
ANN_SHARING = "kallot.io/sharing"
ANN_ISOLATION = "kallot.io/isolation"
ANN_TOPOLOGY = "kallot.io/topology"
ANN_DO_NOT_DISRUPT = "kallot.io/do-not-disrupt"
# Karpenter's convention for pods no voluntary disruption may touch (stateful LLM servers);
# honoured like kallot.io/do-not-disrupt so one annotation protects a pod from both.
ANN_KARPENTER_DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
ANN_MIN_RUNTIME = "kallot.io/min-runtime"
LABEL_POD_GROUP = "kallot.io/pod-group"
LABEL_QUEUE = "kallot.io/queue"

ANN_DEVICES = device_record.ANNOTATION
ANN_BIND_PHASE = device_record.BIND_PHASE
ANN_BIND_TIME = device_record.BIND_TIME

# GFD labels read when a node has no kallot inventory (docs/node-inventory.md).
LABEL_GFD_PRODUCT = "nvidia.com/gpu.product"
LABEL_GFD_MEMORY = "nvidia.com/gpu.memory"
LABEL_GFD_SHARING = "nvidia.com/gpu.sharing-strategy"

# Taint keys kallot ignores on every node (``--tolerated-taint``). None by default: a pod lands
# on a tainted node only if it tolerates the taint, as with kube-scheduler (docs/pod-api.md).
DEFAULT_TOLERATED_TAINTS: frozenset[str] = frozenset()

# MIG profiles of the GPUs kallot knows (core.mig's tables: A100-40GB, A100-80GB, H100-80GB,
# H200-141GB), used to reject a misspelt profile up front instead of leaving the pod pending
# forever with "no idle MIG instance".
MIG_PROFILES: frozenset[str] = mig.ALL_PROFILE_NAMES

# -- quantities ------------------------------------------------------------------------------

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
}
_QUANTITY = re.compile(
    r"^(?P<num>[+-]?(?:\d+\.?\d*|\.\d+))(?:(?P<exp>[eE][+-]?\d+)|(?P<suf>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?$"
)
MIB = 2**20


def parse_quantity(text: object, field_name: str) -> Decimal:
    """A Kubernetes quantity ('500m', '16Gi', '1e3', 2) as a Decimal; ConfigError if malformed."""
    value = _quantity(str(text).strip())
    if value is None:
        raise ConfigError(field_name, text, "a Kubernetes quantity such as 2, 500m or 16Gi")
    return value


@functools.lru_cache(maxsize=4096)
def _quantity(raw: str) -> Decimal | None:
    # Cached: a cluster's pods repeat a handful of quantities ('1', '100m', '128Mi') thousands
    # of times, and every pod is read at start-up (Decimal is immutable, so sharing is safe).
    m = _QUANTITY.match(raw)
    if m is None:
        return None
    try:
        value = Decimal(m.group("num"))
    except InvalidOperation:  # pragma: no cover - the regex admits only numbers
        return None
    if m.group("exp"):
        value *= Decimal(10) ** int(m.group("exp")[1:])
    suffix = m.group("suf") or ""
    value *= _BINARY.get(suffix) or _DECIMAL[suffix]
    return value


def ceil_int(value: Decimal) -> int:
    return int(value.to_integral_value(rounding="ROUND_CEILING"))


def cpu_milli(text: object, field_name: str) -> int:
    return ceil_int(parse_quantity(text, field_name) * 1000)


def mem_mib(text: object, field_name: str) -> int:
    return ceil_int(parse_quantity(text, field_name) / MIB)


def parse_duration(text: str, field_name: str) -> float:
    """'90s', '15m', '1h30m', '2h' or plain seconds ('600') as seconds."""
    raw = text.strip()
    try:
        return float(raw) if raw else 0.0
    except ValueError:
        pass
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|m|s)", raw)
    if not parts or "".join(n + u for n, u in parts) != raw:
        raise ConfigError(field_name, text, "a duration such as 90s, 15m or 1h30m")
    scale = {"h": 3600.0, "m": 60.0, "s": 1.0}
    return sum(float(n) * scale[u] for n, u in parts)


def parse_time(text: object) -> float:
    """RFC 3339 time ('2026-12-03T08:30:00Z') as unix seconds; 0.0 when absent."""
    if not text:
        return 0.0
    return dt.datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()


# -- pods -------------------------------------------------------------------------------------


def _ann(name: str) -> str:
    return f"metadata.annotations[{name}]"


def _label(name: str) -> str:
    return f"metadata.labels[{name}]"


def _container_requests(
    container: Mapping[str, Any], where: str
) -> dict[str, tuple[Decimal, str, object]]:
    """resource -> (amount, field, raw value); requests default to limits, as in Kubernetes."""
    resources = container.get("resources") or {}
    out: dict[str, tuple[Decimal, str, object]] = {}
    for kind in ("limits", "requests"):  # requests override limits
        for name, raw in (resources.get(kind) or {}).items():
            fname = f"{where}.resources.{kind}[{name}]"
            out[name] = (parse_quantity(raw, fname), fname, raw)
    return out


@dataclass(frozen=True, slots=True)
class PodResources:
    """What a pod asks for, summed the way Kubernetes does (containers add up; an init
    container runs alone, so the pod needs the larger of the two; overhead adds)."""

    amounts: Mapping[str, Decimal]
    fields: Mapping[str, tuple[str, object]]  # resource -> (a field that asks for it, raw)


def pod_resources(pod: Mapping[str, Any]) -> PodResources:
    spec = pod.get("spec") or {}
    total: dict[str, Decimal] = {}
    fields: dict[str, tuple[str, object]] = {}
    for i, c in enumerate(spec.get("containers") or []):
        for name, (amount, fname, raw) in _container_requests(c, f"spec.containers[{i}]").items():
            total[name] = total.get(name, Decimal(0)) + amount
            fields.setdefault(name, (fname, raw))
    sidecars: dict[str, Decimal] = {}
    init_peak: dict[str, Decimal] = {}
    for i, c in enumerate(spec.get("initContainers") or []):
        reqs = _container_requests(c, f"spec.initContainers[{i}]")
        for name, (amount, fname, raw) in reqs.items():
            fields.setdefault(name, (fname, raw))
            if c.get("restartPolicy") == "Always":
                # A sidecar keeps running next to the app containers.
                sidecars[name] = sidecars.get(name, Decimal(0)) + amount
            else:
                peak = amount + sidecars.get(name, Decimal(0))
                init_peak[name] = max(init_peak.get(name, Decimal(0)), peak)
    for name, amount in sidecars.items():
        total[name] = total.get(name, Decimal(0)) + amount
    for name, peak in init_peak.items():
        total[name] = max(total.get(name, Decimal(0)), peak)
    for name, raw in (spec.get("overhead") or {}).items():
        fname = f"spec.overhead[{name}]"
        total[name] = total.get(name, Decimal(0)) + parse_quantity(raw, fname)
        fields.setdefault(name, (fname, raw))
    return PodResources(amounts=total, fields=fields)


def _integer(res: PodResources, name: str, expected: str) -> int:
    amount = res.amounts[name]
    fname, raw = res.fields[name]
    if amount != amount.to_integral_value() or amount < 0:
        raise ConfigError(fname, raw, expected)
    return int(amount)


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def parse_topology(text: str, field_name: str) -> TopologyConstraint:
    """'nvlink' (required), 'required:numa' or 'preferred:nvlink'."""
    raw = text.strip()
    if not raw:
        return NO_TOPOLOGY
    mode_text, _, level = raw.rpartition(":") if ":" in raw else ("required", "", raw)
    modes = {"required": TopologyMode.REQUIRED, "preferred": TopologyMode.PREFERRED}
    if mode_text not in modes or not level.strip():
        raise ConfigError(
            field_name, text, "a level such as nvlink, or required:<level> / preferred:<level>"
        )
    return TopologyConstraint(mode=modes[mode_text], level=level.strip())


def _bool(text: str, field_name: str) -> bool:
    key = text.strip().lower()
    if key in ("true", "yes", "1"):
        return True
    if key in ("false", "no", "0", ""):
        return False
    raise ConfigError(field_name, text, "true or false")


def pod_key(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def job_id(namespace: str, group: str) -> str:
    return f"{namespace}/{group}"


def _device_request(pod: Mapping[str, Any], res: PodResources) -> DeviceRequest | None:
    meta = pod.get("metadata") or {}
    ann: Mapping[str, str] = meta.get("annotations") or {}
    whole = (
        _integer(res, RESOURCE_GPU, "a whole number of GPUs") if RESOURCE_GPU in res.amounts else 0
    )
    milli = 0
    if RESOURCE_GPU_MILLI in res.amounts:
        milli = _integer(res, RESOURCE_GPU_MILLI, f"an integer 1..{MILLI} milli-GPU")
        if not 1 <= milli <= MILLI:
            fname, raw = res.fields[RESOURCE_GPU_MILLI]
            raise ConfigError(
                fname,
                raw,
                f"1..{MILLI} milli-GPU, the compute share of one GPU (for whole GPUs ask "
                f"{RESOURCE_GPU})",
            )
    memory = 0
    if RESOURCE_GPU_MEMORY in res.amounts:
        fname, raw = res.fields[RESOURCE_GPU_MEMORY]
        amount = res.amounts[RESOURCE_GPU_MEMORY]
        if amount <= 0:
            raise ConfigError(fname, raw, "a positive GPU memory size such as 20Gi")
        memory = ceil_int(amount / MIB)
        if not milli:
            raise ConfigError(
                fname,
                raw,
                f"{RESOURCE_GPU_MEMORY} together with {RESOURCE_GPU_MILLI} (the compute share, "
                f"1..{MILLI}) in the same pod",
            )
    migs = {
        name[len(RESOURCE_MIG_PREFIX) :]: name
        for name, amount in res.amounts.items()
        if name.startswith(RESOURCE_MIG_PREFIX) and amount
    }
    share = milli > 0
    kinds = [k for k, on in (("whole", whole > 0), ("share", share), ("mig", bool(migs))) if on]
    if len(kinds) > 1:
        names = {"whole": RESOURCE_GPU, "share": RESOURCE_GPU_MILLI, "mig": "nvidia.com/mig-*"}
        resource = {
            "whole": RESOURCE_GPU,
            "share": RESOURCE_GPU_MILLI,
            "mig": next(iter(migs.values()), ""),
        }
        fname, raw = res.fields[resource[kinds[1]]]
        raise ConfigError(
            fname,
            raw,
            "one kind of GPU request per pod: whole GPUs (nvidia.com/gpu), a share "
            f"({RESOURCE_GPU_MILLI} [+ {RESOURCE_GPU_MEMORY}]) or one MIG instance "
            f"(nvidia.com/mig-<profile>); this pod asks {' and '.join(names[k] for k in kinds)}",
        )
    mig_profile = ""
    if migs:
        if len(migs) > 1:
            fname, raw = res.fields[sorted(migs.values())[1]]
            raise ConfigError(fname, raw, "one MIG instance per pod (a single nvidia.com/mig-*)")
        mig_profile, rname = next(iter(migs.items()))
        fname, raw = res.fields[rname]
        if mig_profile not in MIG_PROFILES:
            raise ConfigError(
                fname.rpartition("[")[0],
                rname,
                f"a known MIG profile, one of {', '.join(sorted(MIG_PROFILES))}",
            )
        if res.amounts[rname] != 1:
            raise ConfigError(fname, raw, "1 (one MIG instance per pod)")
    if not kinds:
        if any(k in ann for k in (ANN_GPU_MODEL, ANN_SHARING, ANN_TOPOLOGY)):
            key = next(k for k in (ANN_GPU_MODEL, ANN_SHARING, ANN_TOPOLOGY) if k in ann)
            raise ConfigError(
                _ann(key),
                ann[key],
                "a GPU request to refine (nvidia.com/gpu, kallot.io/gpu-milli or "
                "nvidia.com/mig-<profile> in the containers' resources)",
            )
        return None

    models: frozenset[str] = frozenset()
    if ANN_GPU_MODEL in ann:
        model_names = _csv(ann[ANN_GPU_MODEL])
        if not model_names:
            raise ConfigError(
                _ann(ANN_GPU_MODEL), ann[ANN_GPU_MODEL], "GPU model names, e.g. H100-80GB"
            )
        models = frozenset(canonical_model(n) for n in model_names)
    modes = ALL_MODES
    if ANN_SHARING in ann:
        try:
            modes = frozenset(SharingMode.parse(t) for t in _csv(ann[ANN_SHARING]))
        except ValueError as exc:
            raise ConfigError(
                _ann(ANN_SHARING),
                ann[ANN_SHARING],
                "sharing modes from exclusive, time-slicing, mps, mig (comma-separated)",
            ) from exc
        if not modes:
            raise ConfigError(_ann(ANN_SHARING), ann[ANN_SHARING], "at least one sharing mode")
    isolation = Isolation.NONE
    if ANN_ISOLATION in ann:
        try:
            isolation = Isolation.parse(ann[ANN_ISOLATION])
        except ValueError as exc:
            raise ConfigError(
                _ann(ANN_ISOLATION), ann[ANN_ISOLATION], "none, memory-isolated or untrusted"
            ) from exc
    topology = NO_TOPOLOGY
    if ANN_TOPOLOGY in ann:
        topology = parse_topology(ann[ANN_TOPOLOGY], _ann(ANN_TOPOLOGY))

    if whole:
        req = DeviceRequest(
            count=whole, models=models, modes=modes, isolation=isolation, topology=topology
        )
        if not req.accepts(SharingMode.EXCLUSIVE):
            raise ConfigError(
                _ann(ANN_SHARING) if ANN_SHARING in ann else _ann(ANN_ISOLATION),
                ann.get(ANN_SHARING, ann.get(ANN_ISOLATION, "")),
                "exclusive among the accepted modes: whole GPUs are given exclusively",
            )
        return req
    if mig_profile:
        req = DeviceRequest(
            count=1,
            milli=MILLI,
            mig_profile=mig_profile,
            models=models,
            modes=modes,
            isolation=isolation,
            topology=topology,
        )
        if not req.accepts(SharingMode.MIG):
            raise ConfigError(
                _ann(ANN_SHARING) if ANN_SHARING in ann else _ann(ANN_ISOLATION),
                ann.get(ANN_SHARING, ann.get(ANN_ISOLATION, "")),
                "mig among the accepted modes for a MIG request",
            )
        return req
    if milli == MILLI and not memory:
        fname, raw = res.fields[RESOURCE_GPU_MILLI]
        raise ConfigError(
            fname,
            raw,
            f"a share below {MILLI}, or {MILLI} with {RESOURCE_GPU_MEMORY}; a whole GPU is "
            f"{RESOURCE_GPU}: 1",
        )
    # Without kallot.io/sharing a share accepts every mechanism its isolation allows, MIG
    # included: the core picks per pod (core.fit.option_key) and the node agent serves a share
    # on a MIG instance under kallot.io/gpu-milli (docs/node-agent.md). A pod that lists its
    # modes without mig stays off MIG.
    req = DeviceRequest(
        count=1,
        milli=milli,
        mem_mib=memory,
        models=models,
        modes=modes,
        isolation=isolation,
        topology=topology,
    )
    if not any(req.accepts(m) for m in (SharingMode.TIMESLICE, SharingMode.MPS, SharingMode.MIG)):
        key = ANN_ISOLATION if isolation is Isolation.UNTRUSTED else ANN_SHARING
        raise ConfigError(
            _ann(key),
            ann.get(key, ""),
            "a mode a share can run in (time-slicing, mps or mig, and isolation that allows "
            "it; untrusted work runs on whole GPUs or MIG instances only)",
        )
    return req


def pod_to_task(pod: Mapping[str, Any]) -> Task:
    """The core's Task for a pod; ConfigError names the first bad field."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    ann: Mapping[str, str] = meta.get("annotations") or {}
    labels: Mapping[str, str] = meta.get("labels") or {}
    namespace = str(meta.get("namespace", ""))
    res = pod_resources(pod)
    cpu = ceil_int(res.amounts.get("cpu", Decimal(0)) * 1000)
    mem = ceil_int(res.amounts.get("memory", Decimal(0)) / MIB)
    gpu = _device_request(pod, res)
    selector = {str(k): str(v) for k, v in (spec.get("nodeSelector") or {}).items()}
    group = labels.get(LABEL_POD_GROUP, "")
    if group and not re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", group):
        raise ConfigError(_label(LABEL_POD_GROUP), group, "the name of a PodGroup")
    min_runtime = 0.0
    if ANN_MIN_RUNTIME in ann:
        min_runtime = parse_duration(ann[ANN_MIN_RUNTIME], _ann(ANN_MIN_RUNTIME))
    disrupt = False
    for key in (ANN_DO_NOT_DISRUPT, ANN_KARPENTER_DO_NOT_DISRUPT):
        if key in ann:
            disrupt = disrupt or _bool(ann[key], _ann(key))
    priority = spec.get("priority") or 0
    if not isinstance(priority, int):
        raise ConfigError("spec.priority", priority, "an integer")
    return Task(
        id=str(meta.get("uid", "")) or pod_key(pod),
        cpu_milli=cpu,
        mem_mib=mem,
        gpu=gpu,
        priority=priority,
        created=parse_time(meta.get("creationTimestamp")),
        queue=labels.get(LABEL_QUEUE, ""),
        job=job_id(namespace, group) if group else "",
        node_selector=selector,
        do_not_disrupt=disrupt,
        min_runtime_s=min_runtime,
        model=kube_models.task_model(pod),
        k8s=k8s_fields.pod_info(pod, res.amounts),
    )


def pod_started(pod: Mapping[str, Any]) -> float:
    """Unix time the pod started holding its devices: the scheduler's bind time
    (``kallot.io/bind-time``, nanoseconds), else the kubelet's ``status.startTime``, else 0.0
    (unknown: treated as long running). Minimum runtimes of preemption count from it."""
    ann = (pod.get("metadata") or {}).get("annotations") or {}
    raw = ann.get(ANN_BIND_TIME)
    if raw:
        try:
            return int(raw) / 1e9
        except ValueError:
            pass  # a hand-edited annotation: fall back to what the kubelet says
    try:
        return parse_time((pod.get("status") or {}).get("startTime"))
    except ValueError:
        return 0.0


def is_kallot_pod(pod: Mapping[str, Any], scheduler_name: str = SCHEDULER_NAME) -> bool:
    return (pod.get("spec") or {}).get("schedulerName") == scheduler_name


def pod_node(pod: Mapping[str, Any]) -> str:
    return str((pod.get("spec") or {}).get("nodeName") or "")


def pod_finished(pod: Mapping[str, Any]) -> bool:
    """Succeeded or Failed: holds no resources any more."""
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def pod_record(pod: Mapping[str, Any]) -> device_record.DeviceRecord | None:
    """The device record of a bound pod, or None; ConfigError if it is malformed."""
    ann = (pod.get("metadata") or {}).get("annotations") or {}
    text = ann.get(ANN_DEVICES)
    if not text:
        return None
    return device_record.DeviceRecord.from_json(text)


def record_annotations(record: device_record.DeviceRecord, now_ns: int) -> dict[str, str]:
    """The annotations the binding writes: the record, ``bind-phase: allocating`` and the
    bind time (unix nanoseconds) the node agent uses to match the pod it admits."""
    return {
        ANN_DEVICES: record.to_json(),
        ANN_BIND_PHASE: "allocating",
        ANN_BIND_TIME: str(now_ns),
    }


def host_requests(pod: Mapping[str, Any]) -> tuple[int, int]:
    """(milli-CPU, MiB) a pod takes on its node; (0, 0) if its quantities are malformed (the
    API server validates them, so only a hand-made object gets here)."""
    try:
        res = pod_resources(pod)
    except ConfigError:
        return 0, 0
    cpu = ceil_int(res.amounts.get("cpu", Decimal(0)) * 1000)
    return cpu, ceil_int(res.amounts.get("memory", Decimal(0)) / MIB)


def foreign_whole_gpus(pod: Mapping[str, Any]) -> int:
    """Whole GPUs a bound pod without a device record holds (another scheduler's pod)."""
    try:
        res = pod_resources(pod)
    except ConfigError:
        return 0
    amount = res.amounts.get(RESOURCE_GPU, Decimal(0))
    return max(0, int(amount))


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
    claim. ``queue_tree`` turns the set of them into the core's ``QueueTree``; the controller
    then runs the queue actions (fair share, reclaim, preemption) instead of plain allocation.
    """

    name: str
    parent: str = ""
    priority: int = 0
    claims: Mapping[str, QueueClaim] = field(default_factory=dict)
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
    return QueueSpec(
        name=str(meta.get("name", "")),
        parent=str(spec.get("parent", "")),
        priority=int(spec.get("priority", 0)),
        claims=claims,
        extra={k: v for k, v in spec.items() if k not in ("parent", "priority", "resources")},
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


def _fallback_gpus(name: str, labels: Mapping[str, str], count: int) -> list[GpuSpec]:
    """GPUs of a node without a kallot inventory: count from allocatable, model and memory
    from GFD labels. Exclusive only: nothing on such a node enforces a share."""
    model = canonical_model(labels.get(LABEL_GFD_PRODUCT, "")) or "unknown"
    try:
        memory = int(labels.get(LABEL_GFD_MEMORY, "0"))
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
    gpu_count = amount(RESOURCE_GPU, lambda v, f: math.floor(parse_quantity(v, f)), 0)

    gpus: list[GpuSpec] = []
    migs: list[NodeMig] = []
    error: ConfigError | None = None
    text = ann.get(inventory.ANNOTATION)
    if text:
        try:
            inv = inventory.NodeInventory.from_json(
                text, where=f"Node {name}: {_ann(inventory.ANNOTATION)}"
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
    )
    return NodeInfo(spec=spec, mig=tuple(migs), inventory_error=error, signature=signature)


def record_to_assignments(
    record: device_record.DeviceRecord, node_uuids: Sequence[str]
) -> tuple[DeviceAssignment, ...]:
    """The record's devices, with slots re-derived from the node's GPU UUIDs (a record names
    GPUs by UUID; the index is a hint). Devices the node no longer has are dropped."""
    by_uuid = {u: i for i, u in enumerate(node_uuids)}
    out = []
    for d in record.assignments():
        slot = by_uuid.get(d.uuid)
        if slot is None:
            continue
        out.append(
            DeviceAssignment(
                slot=slot, uuid=d.uuid, milli=d.milli, mem_mib=d.mem_mib, mode=d.mode, mig=d.mig
            )
        )
    return tuple(out)


# -- unknown kallot.io/ keys (issue 16: a typo must not be silently ignored) -------------------

# Every kallot.io/ annotation a pod may carry (docs/pod-api.md), or that kallot writes on it.
POD_ANNOTATION_KEYS = frozenset(
    {
        ANN_GPU_MODEL,
        ANN_SHARING,
        ANN_ISOLATION,
        ANN_TOPOLOGY,
        ANN_DO_NOT_DISRUPT,
        ANN_MIN_RUNTIME,
        ANN_DEVICES,
        ANN_BIND_PHASE,
        ANN_BIND_TIME,
    }
)
# kallot.io/ keys read from a pod's labels, not its annotations.
POD_LABEL_KEYS = frozenset({LABEL_POD_GROUP, LABEL_QUEUE})
KALLOT_PREFIX = "kallot.io/"


def unknown_key_warnings(pod: Mapping[str, Any]) -> tuple[str, ...]:
    """One sentence per ``kallot.io/`` annotation or label of ``pod`` that kallot does not read,
    naming the closest key it knows (``difflib``), e.g. "annotation kallot.io/topolgy is not a
    kallot key (did you mean kallot.io/topology?); it is ignored"."""
    meta = pod.get("metadata") or {}
    out: list[str] = []
    for where, keys, known, other in (
        ("annotation", meta.get("annotations") or {}, POD_ANNOTATION_KEYS, POD_LABEL_KEYS),
        ("label", meta.get("labels") or {}, POD_LABEL_KEYS, POD_ANNOTATION_KEYS),
    ):
        for key in sorted(str(k) for k in keys):
            if not key.startswith(KALLOT_PREFIX) or key in known:
                continue
            if key in other:
                place = "labels" if where == "annotation" else "annotations"
                out.append(f"kallot reads {key} from {place}, not {where}s; it is ignored")
                continue
            n = len(KALLOT_PREFIX)
            names = sorted(k[n:] for k in known | other)
            close = difflib.get_close_matches(key[n:], names, n=1, cutoff=0.6)
            hint = f" (did you mean {KALLOT_PREFIX}{close[0]}?)" if close else ""
            out.append(f"{where} {key} is not a kallot key{hint}; it is ignored")
    return tuple(out)
