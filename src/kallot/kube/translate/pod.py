"""Pod objects (plain dicts) -> the core's ``Task``: resources summed as Kubernetes sums them,
the GPU request (whole, share, MIG), kallot's annotations and labels, device records, and a
warning for every ``kallot.io/`` key kallot does not read.

The store (``kube.state.store``) calls it once per pod version and keeps the result. Bad input
raises ``ConfigError`` naming the field (``spec.containers[0].resources.limits[kallot.io/gpu-milli]``,
``metadata.annotations[kallot.io/sharing]``), the value and what was expected; problem reporting
(``kube.schedule.problems``) turns that into an Event on the pod. The pod API is documented in docs/pod-api.md.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from kallot.config import wire
from kallot.core import mig
from kallot.core.errors import ConfigError
from kallot.core.resources import (
    ALL_MODES,
    MILLI,
    Isolation,
    SharingMode,
    canonical_model,
)
from kallot.core.workload import (
    NO_TOPOLOGY,
    DeviceRequest,
    Task,
    TopologyConstraint,
    TopologyMode,
)
from kallot.kube.api import k8s_fields
from kallot.kube.translate import models as kube_models  # docs/serving.md
from kallot.kube.translate.quantity import (
    MIB,
    ceil_int,
    parse_duration,
    parse_quantity,
    parse_time,
)

# MIG profiles of the GPUs kallot knows (core.mig's tables: A100-40GB, A100-80GB, H100-80GB,
# H200-141GB), used to reject a misspelt profile up front instead of leaving the pod pending
# forever with "no idle MIG instance".
MIG_PROFILES: frozenset[str] = mig.ALL_PROFILE_NAMES
# Resource names in this domain are Kubernetes' own, not extended resources.
NATIVE_PREFIX = "kubernetes.io/"


def _may_be_backed(name: str) -> bool:
    """An extended resource a DeviceClass may back: not Kubernetes' own, and not kallot's
    (kallot.io/gpu-milli and the like are kallot's fractions, modelled by the core itself).
    Per-container requests are kept only for pods asking one: 200 bytes a pod otherwise."""
    return "/" in name and not name.startswith((NATIVE_PREFIX, wire.KALLOT_PREFIX))


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
    # Each container's requests (init containers first: name, resource -> whole count, 0 when
    # fractional), when one asks for an extended resource, which a DeviceClass may back
    # (core.dra.extended; the API server demands integers of extended resources).
    containers: tuple[tuple[str, Mapping[str, int]], ...] = ()


def pod_resources(pod: Mapping[str, Any]) -> PodResources:
    spec = pod.get("spec") or {}
    total: dict[str, Decimal] = {}
    fields: dict[str, tuple[str, object]] = {}
    regular: list[tuple[Any, _Requests]] = []
    init: list[tuple[Any, _Requests]] = []
    for i, c in enumerate(spec.get("containers") or []):
        reqs = _container_requests(c, f"spec.containers[{i}]")
        regular.append((c.get("name", ""), reqs))
        for name, (amount, fname, raw) in reqs.items():
            total[name] = total.get(name, Decimal(0)) + amount
            fields.setdefault(name, (fname, raw))
    sidecars: dict[str, Decimal] = {}
    init_peak: dict[str, Decimal] = {}
    for i, c in enumerate(spec.get("initContainers") or []):
        reqs = _container_requests(c, f"spec.initContainers[{i}]")
        init.append((c.get("name", ""), reqs))
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
    containers: tuple[tuple[str, Mapping[str, int]], ...] = ()
    if any(_may_be_backed(n) for n in total):
        containers = tuple(
            (
                str(name),
                {n: int(a) if a == a.to_integral_value() else 0 for n, (a, _, _) in reqs.items()},
            )
            for name, reqs in (*init, *regular)
        )
    return PodResources(amounts=total, fields=fields, containers=containers)


_Requests = dict[str, tuple[Decimal, str, object]]


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
        _integer(res, wire.RESOURCE_GPU, "a whole number of GPUs")
        if wire.RESOURCE_GPU in res.amounts
        else 0
    )
    milli = 0
    if wire.RESOURCE_GPU_MILLI in res.amounts:
        milli = _integer(res, wire.RESOURCE_GPU_MILLI, f"an integer 1..{MILLI} milli-GPU")
        if not 1 <= milli <= MILLI:
            fname, raw = res.fields[wire.RESOURCE_GPU_MILLI]
            raise ConfigError(
                fname,
                raw,
                f"1..{MILLI} milli-GPU, the compute share of one GPU (for whole GPUs ask "
                f"{wire.RESOURCE_GPU})",
            )
    memory = 0
    if wire.RESOURCE_GPU_MEMORY in res.amounts:
        fname, raw = res.fields[wire.RESOURCE_GPU_MEMORY]
        amount = res.amounts[wire.RESOURCE_GPU_MEMORY]
        if amount <= 0:
            raise ConfigError(fname, raw, "a positive GPU memory size such as 20Gi")
        memory = ceil_int(amount / MIB)
        if not milli:
            raise ConfigError(
                fname,
                raw,
                f"{wire.RESOURCE_GPU_MEMORY} together with {wire.RESOURCE_GPU_MILLI} (the compute share, "
                f"1..{MILLI}) in the same pod",
            )
    migs = {
        name[len(wire.RESOURCE_MIG_PREFIX) :]: name
        for name, amount in res.amounts.items()
        if name.startswith(wire.RESOURCE_MIG_PREFIX) and amount
    }
    share = milli > 0
    kinds = [k for k, on in (("whole", whole > 0), ("share", share), ("mig", bool(migs))) if on]
    if len(kinds) > 1:
        names = {
            "whole": wire.RESOURCE_GPU,
            "share": wire.RESOURCE_GPU_MILLI,
            "mig": "nvidia.com/mig-*",
        }
        resource = {
            "whole": wire.RESOURCE_GPU,
            "share": wire.RESOURCE_GPU_MILLI,
            "mig": next(iter(migs.values()), ""),
        }
        fname, raw = res.fields[resource[kinds[1]]]
        raise ConfigError(
            fname,
            raw,
            "one kind of GPU request per pod: whole GPUs (nvidia.com/gpu), a share "
            f"({wire.RESOURCE_GPU_MILLI} [+ {wire.RESOURCE_GPU_MEMORY}]) or one MIG instance "
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
        if any(k in ann for k in (wire.ANN_GPU_MODEL, wire.ANN_SHARING, wire.ANN_TOPOLOGY)):
            key = next(
                k for k in (wire.ANN_GPU_MODEL, wire.ANN_SHARING, wire.ANN_TOPOLOGY) if k in ann
            )
            raise ConfigError(
                _ann(key),
                ann[key],
                "a GPU request to refine (nvidia.com/gpu, kallot.io/gpu-milli or "
                "nvidia.com/mig-<profile> in the containers' resources)",
            )
        return None

    models: frozenset[str] = frozenset()
    if wire.ANN_GPU_MODEL in ann:
        model_names = _csv(ann[wire.ANN_GPU_MODEL])
        if not model_names:
            raise ConfigError(
                _ann(wire.ANN_GPU_MODEL), ann[wire.ANN_GPU_MODEL], "GPU model names, e.g. H100-80GB"
            )
        models = frozenset(canonical_model(n) for n in model_names)
    modes = ALL_MODES
    if wire.ANN_SHARING in ann:
        try:
            modes = frozenset(SharingMode.parse(t) for t in _csv(ann[wire.ANN_SHARING]))
        except ValueError as exc:
            raise ConfigError(
                _ann(wire.ANN_SHARING),
                ann[wire.ANN_SHARING],
                "sharing modes from exclusive, time-slicing, mps, mig (comma-separated)",
            ) from exc
        if not modes:
            raise ConfigError(
                _ann(wire.ANN_SHARING), ann[wire.ANN_SHARING], "at least one sharing mode"
            )
    isolation = Isolation.NONE
    if wire.ANN_ISOLATION in ann:
        try:
            isolation = Isolation.parse(ann[wire.ANN_ISOLATION])
        except ValueError as exc:
            raise ConfigError(
                _ann(wire.ANN_ISOLATION),
                ann[wire.ANN_ISOLATION],
                "none, memory-isolated or untrusted",
            ) from exc
    topology = NO_TOPOLOGY
    if wire.ANN_TOPOLOGY in ann:
        topology = parse_topology(ann[wire.ANN_TOPOLOGY], _ann(wire.ANN_TOPOLOGY))

    if whole:
        req = DeviceRequest(
            count=whole, models=models, modes=modes, isolation=isolation, topology=topology
        )
        if not req.accepts(SharingMode.EXCLUSIVE):
            raise ConfigError(
                _ann(wire.ANN_SHARING) if wire.ANN_SHARING in ann else _ann(wire.ANN_ISOLATION),
                ann.get(wire.ANN_SHARING, ann.get(wire.ANN_ISOLATION, "")),
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
                _ann(wire.ANN_SHARING) if wire.ANN_SHARING in ann else _ann(wire.ANN_ISOLATION),
                ann.get(wire.ANN_SHARING, ann.get(wire.ANN_ISOLATION, "")),
                "mig among the accepted modes for a MIG request",
            )
        return req
    if milli == MILLI and not memory:
        fname, raw = res.fields[wire.RESOURCE_GPU_MILLI]
        raise ConfigError(
            fname,
            raw,
            f"a share below {MILLI}, or {MILLI} with {wire.RESOURCE_GPU_MEMORY}; a whole GPU is "
            f"{wire.RESOURCE_GPU}: 1",
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
        key = wire.ANN_ISOLATION if isolation is Isolation.UNTRUSTED else wire.ANN_SHARING
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
    group = labels.get(wire.LABEL_POD_GROUP, "")
    if group and not re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", group):
        raise ConfigError(_label(wire.LABEL_POD_GROUP), group, "the name of a PodGroup")
    min_runtime = 0.0
    if wire.ANN_MIN_RUNTIME in ann:
        min_runtime = parse_duration(
            ann[wire.ANN_MIN_RUNTIME], _ann(wire.ANN_MIN_RUNTIME), at_most=wire.MIN_RUNTIME_MAX_S
        )
    disrupt = False
    for key in (wire.ANN_DO_NOT_DISRUPT, wire.ANN_KARPENTER_DO_NOT_DISRUPT):
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
        queue=labels.get(wire.LABEL_QUEUE, ""),
        job=job_id(namespace, group) if group else "",
        node_selector=selector,
        do_not_disrupt=disrupt,
        min_runtime_s=min_runtime,
        model=kube_models.task_model(pod),
        k8s=k8s_fields.pod_info(pod, res.amounts, container_requests=res.containers),
    )


def pod_started(pod: Mapping[str, Any]) -> float:
    """Unix time the pod started holding its devices: the scheduler's bind time
    (``kallot.io/bind-time``, nanoseconds), else the kubelet's ``status.startTime``, else 0.0
    (unknown: treated as long running). Minimum runtimes of preemption count from it."""
    ann = (pod.get("metadata") or {}).get("annotations") or {}
    raw = ann.get(wire.ANN_BIND_TIME)
    if raw:
        try:
            return int(raw) / 1e9
        except ValueError:
            pass  # a hand-edited annotation: fall back to what the kubelet says
    try:
        return parse_time((pod.get("status") or {}).get("startTime"))
    except ValueError:
        return 0.0


def is_kallot_pod(pod: Mapping[str, Any], scheduler_name: str = wire.SCHEDULER_NAME) -> bool:
    return (pod.get("spec") or {}).get("schedulerName") == scheduler_name


def pod_node(pod: Mapping[str, Any]) -> str:
    return str((pod.get("spec") or {}).get("nodeName") or "")


def pod_finished(pod: Mapping[str, Any]) -> bool:
    """Succeeded or Failed: holds no resources any more."""
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


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
    amount = res.amounts.get(wire.RESOURCE_GPU, Decimal(0))
    return max(0, int(amount))
