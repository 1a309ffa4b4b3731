"""DRA test fixtures: ``gpu.nvidia.com``-shaped ResourceSlices and DeviceClasses, as NVIDIA's
DRA driver (dra-driver-nvidia-gpu v0.4.x) publishes them, written by hand from its attribute
names (../shared/reference/dra.md section 4, docs/dra.md), for allocator tests and benchmarks.

``nvidia_node_slices`` builds one node's pool: whole GPUs on two PCIe roots, optionally static
MIG instances, dynamic-MIG partitions with per-GPU counter sets (``memory``,
``multiprocessors``, ``memory-slice-0..7``: the API wants counter names as DNS labels) and
consumable-capacity GPUs. ``dra_control_plane`` and ``create_nvidia_classes`` set up the
live DRA tests' cluster (kube-controller-manager with the claim controllers, the classes).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from kallot.config import wire
from kallot.testing.controllers import ControllerManager
from kallot.testing.controlplane import DEFAULT_FEATURE_GATES, ControlPlane

# The DRA API group and version the live tests write (kubernetes' CustomObjectsApi).
GROUP, VERSION = "resource.k8s.io", "v1"
# kube-controller-manager's controllers a DRA cluster needs: ResourceClaims from templates,
# and their removal with their pods.
DRA_CONTROLLERS = ("resourceclaim-controller", "garbage-collector-controller")


@contextlib.contextmanager
def dra_control_plane(
    *,
    scheduler: bool,
    feature_gates: Mapping[str, bool] = DEFAULT_FEATURE_GATES,
    controllers: Sequence[str] = DRA_CONTROLLERS,
) -> Iterator[ControlPlane]:
    """A control plane (with kube-scheduler when ``scheduler``) and kube-controller-manager
    running ``controllers``."""
    with (
        ControlPlane(scheduler=scheduler, feature_gates=feature_gates) as plane,
        ControllerManager(plane, controllers=controllers),
    ):
        yield plane


def create_nvidia_classes(co: Any) -> None:
    """NVIDIA's DeviceClasses through ``co`` (a kubernetes ``CustomObjectsApi``); a class that
    is already there (409: another test of the same control plane made it) is kept."""
    for cls in nvidia_classes():
        try:
            co.create_cluster_custom_object(GROUP, VERSION, "deviceclasses", cls)
        except Exception as exc:  # kubernetes.client.ApiException, not imported here
            if getattr(exc, "status", None) != 409:
                raise


NVIDIA = "gpu.nvidia.com"
STD = "resource.kubernetes.io"


def nvidia_classes() -> list[dict[str, Any]]:
    base = f"device.driver == '{NVIDIA}' && device.attributes['{NVIDIA}']"
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": "gpu.nvidia.com"},
            "spec": {
                "selectors": [{"cel": {"expression": f"{base}.type == 'gpu'"}}],
                "extendedResourceName": wire.RESOURCE_GPU,
            },
        },
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": "mig.nvidia.com"},
            "spec": {"selectors": [{"cel": {"expression": f"{base}.type == 'mig'"}}]},
        },
    ]


def _gpu_attrs(node: str, i: int, roots: int, total: int) -> dict[str, Any]:
    root = f"pci0000:{(i * roots // max(total, 1)) * 0x40:02x}"
    return {
        "type": {"string": "gpu"},
        "uuid": {"string": f"GPU-{node}-{i:04d}"},
        "productName": {"string": "NVIDIA H100 80GB HBM3"},
        "brand": {"string": "Nvidia"},
        "architecture": {"string": "Hopper"},
        "cudaComputeCapability": {"version": "9.0.0"},
        "driverVersion": {"version": "570.124.6"},
        "cudaDriverVersion": {"version": "12.8.0"},
        "addressingMode": {"string": "HMM"},
        f"{STD}/pciBusID": {"string": f"0000:{0x18 + i * 0x10:02x}:00.0"},
        f"{STD}/pcieRoot": {"string": root},
    }


# A100-40GB MIG profiles as NVIDIA's driver counts them: (profile, memory slices, SMs, GiB).
A100_PROFILES = (("1g.5gb", 1, 14, 5), ("2g.10gb", 2, 28, 10), ("3g.20gb", 4, 42, 20),
                 ("4g.20gb", 4, 56, 20), ("7g.40gb", 8, 98, 40))  # fmt: skip
A100_STARTS = {"1g.5gb": (0, 1, 2, 3, 4, 5, 6), "2g.10gb": (0, 2, 4), "3g.20gb": (0, 4),
               "4g.20gb": (0,), "7g.40gb": (0,)}  # fmt: skip


def nvidia_node_slices(
    node: str,
    *,
    gpus: int = 8,
    roots: int = 2,
    dynamic_mig: int = 0,
    shared: int = 0,
    generation: int = 1,
    taint_gpu: int = -1,
) -> list[dict[str, Any]]:
    """One node's ``gpu.nvidia.com`` pool: ``gpus`` whole GPUs ``gpu-<i>`` (all GPUs split in
    index order over ``roots`` PCIe roots ``pci0000:00``, ``pci0000:40``, ...), then ``dynamic_mig`` A100 GPUs offered as partitions ``gpu-<g>-mig-<profile>-<start>``
    consuming counter set ``gpu-<g>-counter-set``, then ``shared`` consumable-capacity GPUs
    ``gpu-<s>`` (``memory`` 80Gi, request policy 1Gi steps, default the whole GPU)."""
    devices: list[dict[str, Any]] = []
    total = gpus + dynamic_mig + shared  # GPUs split evenly over the PCIe roots, in order
    for i in range(gpus):
        dev: dict[str, Any] = {
            "name": f"gpu-{i}",
            "attributes": _gpu_attrs(node, i, roots, total),
            "capacity": {"memory": {"value": "80Gi"}},
        }
        if i == taint_gpu:
            dev["taints"] = [
                {"key": "nvidia.com/unhealthy", "value": "xid", "effect": "NoSchedule"}
            ]
        devices.append(dev)
    counter_sets = []
    for g in range(gpus, gpus + dynamic_mig):
        counters = {"memory": {"value": "40Gi"}, "multiprocessors": {"value": "98"}}
        counters.update({f"memory-slice-{k}": {"value": "1"} for k in range(8)})
        counter_sets.append({"name": f"gpu-{g}-counter-set", "counters": counters})
        for profile, slices, sms, gib in A100_PROFILES:
            for start in A100_STARTS[profile]:
                attrs = _gpu_attrs(node, g, roots, total)
                attrs["type"] = {"string": "mig"}
                attrs["productName"] = {"string": "NVIDIA A100-SXM4-40GB"}
                attrs["parentUUID"] = attrs.pop("uuid")
                attrs["profile"] = {"string": profile}
                used = {f"memory-slice-{k}": {"value": "1"} for k in range(start, start + slices)}
                devices.append(
                    {
                        "name": f"gpu-{g}-mig-{profile.replace('.', '')}-{start}",
                        "attributes": attrs,
                        "capacity": {
                            "memory": {"value": f"{gib}Gi"},
                            "multiprocessors": {"value": str(sms)},
                        },
                        "consumesCounters": [
                            {
                                "counterSet": f"gpu-{g}-counter-set",
                                "counters": {
                                    "memory": {"value": f"{gib}Gi"},
                                    "multiprocessors": {"value": str(sms)},
                                    **used,
                                },
                            }
                        ],
                    }
                )
    first_shared = gpus + dynamic_mig
    for s in range(first_shared, first_shared + shared):
        devices.append(
            {
                "name": f"gpu-{s}",
                "attributes": _gpu_attrs(node, s, roots, total),
                "allowMultipleAllocations": True,
                "capacity": {
                    "memory": {
                        "value": "80Gi",
                        "requestPolicy": {
                            "default": "80Gi",
                            "validRange": {"min": "1Gi", "step": "1Gi"},
                        },
                    }
                },
            }
        )
    specs: list[dict[str, Any]] = []
    if counter_sets:
        specs.append({"nodeName": node, "sharedCounters": counter_sets})
    specs.append({"nodeName": node, "devices": devices})
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{NVIDIA}-{k}"},
            "spec": {
                "driver": NVIDIA,
                "pool": {"name": node, "generation": generation, "resourceSliceCount": len(specs)},
                **spec,
            },
        }
        for k, spec in enumerate(specs)
    ]


def claim(
    name: str,
    requests: list[dict[str, Any]],
    *,
    constraints: list[dict[str, Any]] | None = None,
    config: list[dict[str, Any]] | None = None,
    namespace: str = "default",
) -> dict[str, Any]:
    """A ResourceClaim object."""
    devices: dict[str, Any] = {"requests": requests}
    if constraints:
        devices["constraints"] = constraints
    if config:
        devices["config"] = config
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
        "spec": {"devices": devices},
    }


def exactly(name: str, device_class: str, **fields: Any) -> dict[str, Any]:
    """A request ``{name, exactly: {deviceClassName, ...fields}}``; a ``selectors`` list of
    strings becomes CEL selectors."""
    body: dict[str, Any] = {"deviceClassName": device_class}
    for key, value in fields.items():
        body[key] = [{"cel": {"expression": e}} for e in value] if key == "selectors" else value
    return {"name": name, "exactly": body}
