"""Extended resources backed by a DeviceClass without an API server: the special claim's
requests and mappings as kube-scheduler names them (``core.dra.extended``), and which way the
live scheduler's DRA cache serves a pod per session (device plugin or DRA)."""

from __future__ import annotations

from typing import Any

from kallot.config import wire
from kallot.config.dra import device_class_from_json
from kallot.core.dra.extended import RequestMapping, backing_class, extended_claim
from kallot.core.dra.model import DeviceClass
from kallot.kube.dra.cache import DraCache
from kallot.kube.translate import pod_to_task
from kallot.testing.controlplane import gpu_node_body
from kallot.testing.dra import nvidia_classes, nvidia_node_slices

IMPLICIT = "deviceclass.resource.kubernetes.io/mig.nvidia.com"


def _classes() -> dict[str, Any]:
    return {c["metadata"]["name"]: device_class_from_json(c) for c in nvidia_classes()}


def test_requests_are_named_by_container_and_sorted_resource_index() -> None:
    """Init container ``init`` (index 0) asks cpu and ``nvidia.com/gpu: 1``: request
    container-0-request-1 (cpu sorts first). Container ``a`` (index 1) asks
    ``example.com/nic: 1`` (no class backs it: left to device plugins), ``nvidia.com/gpu: 2``
    and the implicit name of mig.nvidia.com: sorted keys are deviceclass...(0),
    example.com/nic (1), nvidia.com/gpu (2), so requests container-1-request-0 (mig) and
    container-1-request-2 (2 GPUs). Container ``b`` asks nothing backed: no request."""
    containers = [
        ("init", {"cpu": 1, wire.RESOURCE_GPU: 1}),
        ("a", {"example.com/nic": 1, wire.RESOURCE_GPU: 2, IMPLICIT: 1}),
        ("b", {"cpu": 2}),
    ]
    got = extended_claim("ns", "uid-1", containers, _classes())
    assert got is not None
    assert got.claim.key == "ns/uid-1-extended-resources"
    assert [
        (r.name, r.exactly.device_class, r.exactly.count) for r in got.claim.requests if r.exactly
    ] == [
        ("container-0-request-1", "gpu.nvidia.com", 1),
        ("container-1-request-0", "mig.nvidia.com", 1),
        ("container-1-request-2", "gpu.nvidia.com", 2),
    ]
    assert got.mappings == (
        RequestMapping("init", wire.RESOURCE_GPU, "container-0-request-1"),
        RequestMapping("a", IMPLICIT, "container-1-request-0"),
        RequestMapping("a", wire.RESOURCE_GPU, "container-1-request-2"),
    )
    assert got.describe() == (
        f"{IMPLICIT} (DeviceClass mig.nvidia.com), nvidia.com/gpu (DeviceClass gpu.nvidia.com)"
    )
    assert extended_claim("ns", "p", [("c", {"example.com/nic": 1})], _classes()) is None


def _gpu_pod(uid: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "default", "uid": uid},
        "spec": {
            "containers": [
                {"name": "c", "resources": {"limits": {wire.RESOURCE_GPU: "1"}}},
            ]
        },
    }


def _dra_only(name: str) -> dict[str, Any]:
    body = gpu_node_body(name, gpus=0)
    for part in ("capacity", "allocatable"):
        body["status"][part].pop(wire.RESOURCE_GPU)
    return body


def test_device_plugin_first_then_dra_then_device_plugin_again() -> None:
    """p0 advertises nvidia.com/gpu, d0 does not (DRA slices). A 1-GPU pod is first given
    to the device plugin (its task keeps the GPU request, no claims); when that finds no place
    the next session gives it to DRA (no GPU request, the special claim, p0 left out); when
    that finds none either it waits, and starts with the device plugin again."""
    c = DraCache()
    c.replace_classes(nvidia_classes())
    c.replace_slices(nvidia_node_slices("d0", gpus=1, roots=1))
    c.replace_nodes([gpu_node_body("p0", gpus=1), _dra_only("d0")])
    task = pod_to_task(_gpu_pod("u1"))
    assert task.gpu is not None and task.k8s is not None and task.k8s.container_requests
    (first,) = c.attach([task])
    assert first.gpu is not None and first.k8s is not None and first.k8s.dra is None
    assert c.unschedulable("u1", "insufficient GPUs") is None  # DRA's turn next
    (second,) = c.attach([task])
    assert second.gpu is None and second.k8s is not None and second.k8s.dra is not None
    dra = second.k8s.dra
    assert dra.extended is not None and dra.off_nodes == frozenset({"p0"})
    assert [cl.key for cl in dra.claims] == ["default/u1-extended-resources"]
    # Both tried: parked, with both reasons.
    assert c.unschedulable("u1", "no device") == "no device; by device plugin: insufficient GPUs"
    (third,) = c.attach([task])
    assert third.gpu is not None


def test_no_node_advertises_dra_at_once_and_all_do_device_plugin() -> None:
    c = DraCache()
    c.replace_classes(nvidia_classes())
    c.replace_nodes([_dra_only("d0")])
    task = pod_to_task(_gpu_pod("u2"))
    (got,) = c.attach([task])
    assert got.gpu is None and got.k8s is not None and got.k8s.dra is not None
    c.replace_nodes([gpu_node_body("z0", gpus=0)])  # nvidia.com/gpu: "0" is not advertising
    (got,) = c.attach([task])
    assert got.gpu is None
    c.replace_nodes([gpu_node_body("p0", gpus=1)])
    (got,) = c.attach([task])
    assert got.gpu is not None and got.k8s is not None and got.k8s.dra is None
    assert c.unschedulable("u2", "insufficient GPUs") == "insufficient GPUs"  # no other way


def test_several_classes_for_one_name_the_newest_then_first_by_name() -> None:
    """KEP-5004: the class created last serves the name; among those created at the same
    time, the first by name."""
    old = DeviceClass(
        "a-old", extended_resource_name="example.com/gpu", created="2026-01-01T00:00:00Z"
    )
    b = DeviceClass(
        "b-new", extended_resource_name="example.com/gpu", created="2026-02-01T00:00:00Z"
    )
    c = DeviceClass(
        "c-new", extended_resource_name="example.com/gpu", created="2026-02-01T00:00:00Z"
    )
    classes = {x.name: x for x in (c, old, b)}
    got = backing_class("example.com/gpu", classes)
    assert got is not None and got.name == "b-new"
    assert backing_class("example.com/other", classes) is None
    implicit = backing_class("deviceclass.resource.kubernetes.io/a-old", classes)
    assert implicit is not None and implicit.name == "a-old"
