"""What a device record is trusted for, independently of admission (docs/security.md).

Where it sits: both readers of ``kallot.io/devices`` ask ``record_refusal`` whether a bound
pod's record could have been written by the scheduler for that pod. The node agent
(``node.k8s.pod_record``): a refused record makes the pod one without a record, so Allocate
(``node.allocate``) never hands out what it names and the exporter charges it nothing. The
scheduler's store (``kube.state.store``): a refused record holds no devices, so a pod created onto a
node with a forged record naming every GPU blocks no one's placement.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from kallot.config import device_record, wire
from kallot.config.device_record import DeviceRecord
from kallot.core.dra.model import parse_quantity
from kallot.core.errors import ConfigError

RESOURCE_GPU = wire.RESOURCE_GPU
RESOURCE_MILLI = wire.RESOURCE_GPU_MILLI
RESOURCE_MIG_PREFIX = wire.RESOURCE_MIG_PREFIX
#: The record modes handed out as shares (under ``kallot.io/gpu-milli``).
SHARED_MODES = ("mps", "time-slicing")


def mig_resource(profile: str) -> str:
    return RESOURCE_MIG_PREFIX + profile


def _units(value: object) -> int:
    try:
        return int(parse_quantity(str(value)))
    except (ConfigError, ValueError, ArithmeticError):
        return 0


def pod_gpu_requests(pod: Mapping[str, Any]) -> Counter[str]:
    """The pod's GPU extended resources (``nvidia.com/gpu``, ``kallot.io/gpu-milli``,
    ``nvidia.com/mig-*``) as the scheduler sums them: app containers and sidecars, or the
    largest init container if more. A value that is not a whole number counts as 0 (the API
    server refuses fractional extended resources)."""
    spec = pod.get("spec") or {}

    def asked(c: Mapping[str, Any]) -> Counter[str]:
        res = c.get("resources") or {}
        out: Counter[str] = Counter()
        for part in ("requests", "limits"):  # limits win: extended resources need them equal
            for name, value in (res.get(part) or {}).items():
                if name in (RESOURCE_GPU, RESOURCE_MILLI) or str(name).startswith(
                    RESOURCE_MIG_PREFIX
                ):
                    out[str(name)] = _units(value)
        return out

    total: Counter[str] = Counter()
    for c in spec.get("containers") or []:
        total.update(asked(c))
    sidecars: Counter[str] = Counter()
    peak: Counter[str] = Counter()
    for c in spec.get("initContainers") or []:
        if c.get("restartPolicy") == "Always":
            sidecars.update(asked(c))
        else:
            here = asked(c) + sidecars
            peak = Counter({k: max(peak[k], here[k]) for k in set(peak) | set(here)})
    total.update(sidecars)
    return Counter(
        {k: max(total[k], peak[k]) for k in set(total) | set(peak) if total[k] or peak[k]}
    )


def record_refusal(
    pod: Mapping[str, Any], record: DeviceRecord, scheduler_name: str = wire.SCHEDULER_NAME
) -> str:
    """Why ``record`` is not honoured on ``pod`` ("" when it is).

    Independent of admission (docs/security.md): a record is honoured only on a pod that
    kallot schedules (``spec.schedulerName``), and only for what the pod requests, so a pod
    carrying a forged record that asks no GPU, or names more GPUs than it asks, is charged
    nothing and blocks nobody.
    """
    name = (pod.get("spec") or {}).get("schedulerName") or "default-scheduler"
    if name != scheduler_name:
        return (
            f"{device_record.ANNOTATION}: pod has spec.schedulerName {name!r}, expected "
            f"{scheduler_name!r} (only kallot's pods carry device records); refusing the record"
        )
    asked = pod_gpu_requests(pod)
    if not asked:
        return (
            f"{device_record.ANNOTATION}: the pod requests no GPU resource, expected a record "
            "only on a pod that asks one; refusing the record"
        )
    whole = sum(1 for d in record.devices if d.mode == "exclusive" and d.mig is None)
    share = sum(d.milli for d in record.devices if d.mode in SHARED_MODES)
    migs = Counter(d.mig.profile for d in record.devices if d.mig is not None)
    over: list[str] = []
    if whole > asked[RESOURCE_GPU]:
        over.append(f"{whole} whole GPUs for {asked[RESOURCE_GPU]} {RESOURCE_GPU}")
    milli = asked[RESOURCE_MILLI]
    if milli:  # a share may sit on a MIG instance: it is handed out under the milli resource
        if share > milli:
            over.append(f"{share} milli-GPU for {milli} {RESOURCE_MILLI}")
    else:
        if share:
            over.append(f"a {share} milli-GPU share for no {RESOURCE_MILLI}")
        for profile, n in sorted(migs.items()):
            res = mig_resource(profile)
            if n > asked[res]:
                over.append(f"{n} x {profile} for {asked[res]} {res}")
    if over:
        return (
            f"{device_record.ANNOTATION}: the record names more than the pod requests "
            f"({'; '.join(over)}); refusing the record"
        )
    return ""
