"""Extended resources backed by a DeviceClass (KEP-5004, gate DRAExtendedResource) on the real
control plane (etcd, kube-apiserver, kube-scheduler v1.36, kube-controller-manager's
resourceclaim controller and garbage collector): a pod asking ``nvidia.com/gpu`` on a node
without a device plugin for it is served by DRA through a special ResourceClaim the scheduler
creates for the pod. What kube-scheduler writes is recorded first; kallot writes the same
shape. Node names carry the test's run id; ``d*`` nodes have no ``nvidia.com/gpu`` in their
allocatable and ``gpu.nvidia.com`` slices with GPUs ``gpu-0``, ``gpu-1``, ... on one PCIe root.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from kallot.config import wire
from kallot.testing.controllers import ControllerManager
from kallot.testing.controlplane import ControlPlane, gpu_node_body
from kallot.testing.dra import nvidia_classes, nvidia_node_slices
from kallot.testing.live import Cluster, wait_until

pytestmark = pytest.mark.controlplane

GROUP, VERSION = "resource.k8s.io", "v1"
TIMEOUT = 60.0


@pytest.fixture(scope="module")
def cp() -> Iterator[ControlPlane]:
    with (
        ControlPlane(scheduler=True) as plane,
        ControllerManager(
            plane, controllers=("resourceclaim-controller", "garbage-collector-controller")
        ),
    ):
        yield plane


def dra_only_node(name: str) -> dict[str, Any]:
    """A node without ``nvidia.com/gpu`` in its capacity (no device plugin)."""
    body = gpu_node_body(name, gpus=0)
    for part in ("capacity", "allocatable"):
        body["status"][part].pop(wire.RESOURCE_GPU, None)
    return body


@pytest.fixture
def cluster(cp: ControlPlane, tmp_path: Path) -> Iterator[Cluster]:
    with cp.api_client() as api:
        c = Cluster(cp, api, tmp_path)
        co = client.CustomObjectsApi(api)
        for cls in nvidia_classes():
            try:
                co.create_cluster_custom_object(GROUP, VERSION, "deviceclasses", cls)
            except client.ApiException as exc:
                if exc.status != 409:
                    raise
        try:
            yield c
        finally:
            c.close()
            for s in co.list_cluster_custom_object(GROUP, VERSION, "resourceslices")["items"]:
                if c.run in s["metadata"]["name"]:
                    co.delete_cluster_custom_object(
                        GROUP, VERSION, "resourceslices", s["metadata"]["name"]
                    )


def _claims(c: Cluster) -> list[dict[str, Any]]:
    got = client.CustomObjectsApi(c.api).list_namespaced_custom_object(
        GROUP, VERSION, c.ns, "resourceclaims"
    )
    items: list[dict[str, Any]] = got["items"]
    return items


def _slices(c: Cluster, node: str, gpus: int) -> None:
    co = client.CustomObjectsApi(c.api)
    for s in nvidia_node_slices(node, gpus=gpus, roots=1):
        s["metadata"]["name"] = f"{s['metadata']['name']}-{c.run}"
        co.create_cluster_custom_object(GROUP, VERSION, "resourceslices", s)


def gpu_pod(name: str, scheduler: str, *containers: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": scheduler,
            "containers": [
                {
                    "name": f"c{i}",
                    "image": "busybox",
                    "resources": {"requests": {"cpu": "100m", **wants}, "limits": dict(wants)},
                }
                for i, wants in enumerate(containers)
            ],
        },
    }


def test_kube_scheduler_shape(cluster: Cluster) -> None:
    """What kube-scheduler v1.36 writes for a pod asking ``nvidia.com/gpu: 1`` on a node
    without a device plugin: a claim ``<pod>-extended-resources-<random>`` owned by the pod
    (controller), annotated, one ExactCount request per container and resource, allocated
    and reserved for the pod; the pod's ``status.extendedResourceClaimStatus`` maps the
    container's resource to the request. kallot writes the same shape (names may differ)."""
    node = f"d0-{cluster.run}"
    cluster.add_nodes([dra_only_node(node)])
    _slices(cluster, node, gpus=2)
    cluster.create_pods([gpu_pod("ks", "default-scheduler", {wire.RESOURCE_GPU: "1"})])
    wait_until(lambda: cluster.pod("ks")["spec"].get("nodeName"), timeout=TIMEOUT, what="bound")
    pod = cluster.pod("ks")
    (claim,) = _claims(cluster)
    out = os.environ.get("KALLOT_RECORD_EXTENDED")
    if out:
        Path(out).write_text(json.dumps({"pod": pod, "claim": claim}, indent=1))
    meta = claim["metadata"]
    assert meta["generateName"] == "ks-extended-resources-"
    assert meta["annotations"] == {"resource.kubernetes.io/extended-resource-claim": "true"}
    (owner,) = meta["ownerReferences"]
    assert owner["kind"] == "Pod" and owner["uid"] == pod["metadata"]["uid"]
    assert owner["controller"] is True
    status = pod["status"]["extendedResourceClaimStatus"]
    assert status["resourceClaimName"] == meta["name"]
    assert status["requestMappings"] == [
        {
            "containerName": "c0",
            "resourceName": "nvidia.com/gpu",
            "requestName": "container-0-request-1",
        }
    ]
    assert claim["spec"] == SPEC_ONE
    assert [r["name"] for r in claim["status"]["reservedFor"]] == ["ks"]
    KUBE_SCHEDULER_SHAPE.update(_shape(claim, pod))
    cluster.delete_pod("ks")
    wait_until(lambda: not _claims(cluster), timeout=TIMEOUT, what="the claim deleted by GC")


# Request "container-0-request-1": the container requests cpu and nvidia.com/gpu, sorted.
SPEC_ONE = {
    "devices": {
        "requests": [
            {
                "name": "container-0-request-1",
                "exactly": {
                    "deviceClassName": "gpu.nvidia.com",
                    "allocationMode": "ExactCount",
                    "count": 1,
                },
            }
        ]
    }
}
KUBE_SCHEDULER_SHAPE: dict[str, Any] = {}


def _shape(claim: dict[str, Any], pod: dict[str, Any]) -> dict[str, Any]:
    """What must be the same whoever scheduled the pod: the claim's metadata (names and uids
    left out), spec, allocation (devices, node selector), reservation, the pod's status."""
    meta = claim["metadata"]
    alloc = claim["status"]["allocation"]
    return {
        "generateName": meta["generateName"].replace(pod["metadata"]["name"], "<pod>"),
        "annotations": meta.get("annotations"),
        "owners": [
            {k: v for k, v in o.items() if k not in ("name", "uid")}
            for o in meta["ownerReferences"]
        ],
        "finalizers": meta.get("finalizers"),
        "spec": claim["spec"],
        "results": [
            {k: v for k, v in r.items() if k not in ("device", "pool")}
            for r in alloc["devices"]["results"]
        ],
        "nodeSelector": json.loads(
            json.dumps(alloc["nodeSelector"]).replace(pod["spec"]["nodeName"], "<node>")
        ),
        "reservedFor": [
            {k: v for k, v in r.items() if k == "resource"} for r in claim["status"]["reservedFor"]
        ],
        "podStatusKeys": sorted(pod["status"]["extendedResourceClaimStatus"]),
        "mappings": pod["status"]["extendedResourceClaimStatus"]["requestMappings"],
    }


# -- kallot -----------------------------------------------------------------------------------


def _kallot(cluster: Cluster) -> None:
    cluster.scheduler().wait_ready(timeout=60)


def _bound(cluster: Cluster, *names: str) -> None:
    wait_until(
        lambda: all(cluster.pod(n)["spec"].get("nodeName") for n in names),
        timeout=TIMEOUT,
        what=f"pods {names} bound\n{cluster.schedulers[-1].log_tail() if cluster.schedulers else ''}",
    )


def _claim_of(cluster: Cluster, pod: str) -> dict[str, Any]:
    uid = cluster.pod(pod)["metadata"]["uid"]
    mine = [
        c
        for c in _claims(cluster)
        if any(o["uid"] == uid for o in c["metadata"].get("ownerReferences") or [])
    ]
    assert len(mine) == 1, mine
    return mine[0]


def _devices(claim: dict[str, Any]) -> list[tuple[str, str]]:
    return sorted(
        (r["request"], r["device"]) for r in claim["status"]["allocation"]["devices"]["results"]
    )


def _pending_reason(cluster: Cluster, name: str) -> str:
    for c in cluster.pod(name).get("status", {}).get("conditions") or []:
        if c["type"] == "PodScheduled" and c["status"] == "False":
            return str(c.get("message", ""))
    return ""


def test_kallot_one_gpu_same_shape_and_gc(cluster: Cluster) -> None:
    """kallot, ``nvidia.com/gpu: 1`` on d0 (2 GPUs, DRA only): the same shape as
    kube-scheduler's (claim metadata, spec, allocation, reservation, pod status); one GPU of
    d0; the pod's device record names no device-plugin GPU (DRA serves it). Deleting the pod deletes the claim (the
    garbage collector, through the owner reference)."""
    node = f"d0-{cluster.run}"
    cluster.add_nodes([dra_only_node(node)])
    _slices(cluster, node, gpus=2)
    _kallot(cluster)
    cluster.create_pods([gpu_pod("k1", "kallot", {wire.RESOURCE_GPU: "1"})])
    _bound(cluster, "k1")
    pod = cluster.pod("k1")
    assert pod["spec"]["nodeName"] == node
    assert json.loads(pod["metadata"]["annotations"][wire.ANN_DEVICES])["devices"] == []
    claim = _claim_of(cluster, "k1")
    assert claim["metadata"]["name"].startswith("k1-extended-resources-")
    assert claim["spec"] == SPEC_ONE
    (dev,) = _devices(claim)
    assert dev[0] == "container-0-request-1" and dev[1] in ("gpu-0", "gpu-1")
    assert claim["status"]["reservedFor"] == [
        {"resource": "pods", "name": "k1", "uid": pod["metadata"]["uid"]}
    ]
    assert (
        pod["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
        == claim["metadata"]["name"]
    )
    if KUBE_SCHEDULER_SHAPE:  # recorded by test_kube_scheduler_shape in this run
        assert _shape(claim, pod) == KUBE_SCHEDULER_SHAPE
    cluster.delete_pod("k1")
    wait_until(lambda: not _claims(cluster), timeout=TIMEOUT, what="the claim deleted by GC")


def test_kallot_two_containers_and_implicit_name(cluster: Cluster) -> None:
    """d0 has 3 GPUs. Pod ``two``: container c0 asks ``nvidia.com/gpu: 1``, c1 asks
    ``deviceclass.resource.kubernetes.io/gpu.nvidia.com: 2`` (the implicit name of the class):
    one claim with requests container-0-request-1 (1 GPU) and container-1-request-1 (2 GPUs;
    c1 also asks cpu, sorted first), all 3 GPUs of d0 allocated, each container's resource
    mapped to its request. A second pod asking one GPU finds none: pending, the reason names
    the resource and the class."""
    node = f"d0-{cluster.run}"
    cluster.add_nodes([dra_only_node(node)])
    _slices(cluster, node, gpus=3)
    _kallot(cluster)
    implicit = "deviceclass.resource.kubernetes.io/gpu.nvidia.com"
    cluster.create_pods([gpu_pod("two", "kallot", {wire.RESOURCE_GPU: "1"}, {implicit: "2"})])
    _bound(cluster, "two")
    claim = _claim_of(cluster, "two")
    assert claim["spec"]["devices"]["requests"] == [
        {
            "name": "container-0-request-1",
            "exactly": {
                "deviceClassName": "gpu.nvidia.com",
                "allocationMode": "ExactCount",
                "count": 1,
            },
        },
        {
            "name": "container-1-request-1",
            "exactly": {
                "deviceClassName": "gpu.nvidia.com",
                "allocationMode": "ExactCount",
                "count": 2,
            },
        },
    ]
    got = _devices(claim)
    assert sorted(d for _, d in got) == ["gpu-0", "gpu-1", "gpu-2"]
    assert [r for r, _ in got] == [
        "container-0-request-1",
        "container-1-request-1",
        "container-1-request-1",
    ]
    assert cluster.pod("two")["status"]["extendedResourceClaimStatus"]["requestMappings"] == [
        {
            "containerName": "c0",
            "resourceName": wire.RESOURCE_GPU,
            "requestName": "container-0-request-1",
        },
        {"containerName": "c1", "resourceName": implicit, "requestName": "container-1-request-1"},
    ]
    cluster.create_pods([gpu_pod("more", "kallot", {wire.RESOURCE_GPU: "1"})])
    wait_until(
        lambda: _pending_reason(cluster, "more"),
        timeout=TIMEOUT,
        what=f"more pending with a reason\n{cluster.schedulers[-1].log_tail()}",
    )
    reason = _pending_reason(cluster, "more")
    assert "nvidia.com/gpu (DeviceClass gpu.nvidia.com)" in reason, reason
    events = " ".join(e.get("message", "") for e in cluster.events("more"))
    assert "nvidia.com/gpu (DeviceClass gpu.nvidia.com)" in events, events
    assert len(_claims(cluster)) == 1  # no claim for the pending pod


def test_device_plugin_node_first_then_dra(cluster: Cluster) -> None:
    """p0 advertises ``nvidia.com/gpu: 1`` (a device plugin), d0 has 1 DRA GPU and none in
    its allocatable. Pod ``a`` (1 GPU) takes p0's GPU through the device plugin (a device
    record, no claim); pod ``b`` finds p0 full and gets d0's gpu-0 through a special claim;
    pod ``c`` finds neither: pending."""
    dra_node, plugin_node = f"d0-{cluster.run}", f"p0-{cluster.run}"
    cluster.add_nodes([dra_only_node(dra_node), gpu_node_body(plugin_node, gpus=1)])
    _slices(cluster, dra_node, gpus=1)
    _kallot(cluster)
    cluster.create_pods([gpu_pod("a", "kallot", {wire.RESOURCE_GPU: "1"})])
    _bound(cluster, "a")
    a = cluster.pod("a")
    assert a["spec"]["nodeName"] == plugin_node
    assert wire.ANN_DEVICES in a["metadata"]["annotations"]
    assert not _claims(cluster)
    assert "extendedResourceClaimStatus" not in a["status"]
    cluster.create_pods([gpu_pod("b", "kallot", {wire.RESOURCE_GPU: "1"})])
    _bound(cluster, "b")
    assert cluster.pod("b")["spec"]["nodeName"] == dra_node
    assert _devices(_claim_of(cluster, "b")) == [("container-0-request-1", "gpu-0")]
    cluster.create_pods([gpu_pod("c", "kallot", {wire.RESOURCE_GPU: "1"})])
    wait_until(
        lambda: _pending_reason(cluster, "c"),
        timeout=TIMEOUT,
        what=f"c pending with a reason\n{cluster.schedulers[-1].log_tail()}",
    )
    assert len(_claims(cluster)) == 1
