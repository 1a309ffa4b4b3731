"""Extended resources backed by a DeviceClass (KEP-5004, gate DRAExtendedResource) on the real
control plane (etcd, kube-apiserver, kube-scheduler v1.36, kube-controller-manager's
resourceclaim controller and garbage collector): a pod asking ``nvidia.com/gpu`` on a node
without a device plugin for it is served by DRA through a special ResourceClaim the scheduler
creates for the pod. What kube-scheduler writes is recorded first; kallot writes the same
shape. Node names carry the test's run id; ``d*`` nodes have no ``nvidia.com/gpu`` in their
allocatable and ``gpu.nvidia.com`` slices with GPUs ``gpu-0``, ``gpu-1``, ... on one PCIe root.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from kallot.config import wire
from kallot.kube.api.client import KubeClient
from kallot.kube.ops import explain
from kallot.testing.controlplane import DEFAULT_FEATURE_GATES, ControlPlane, gpu_node_body
from kallot.testing.dra import (
    GROUP,
    VERSION,
    create_nvidia_classes,
    dra_control_plane,
    nvidia_node_slices,
)
from kallot.testing.live import Cluster, pending_reason, wait_until

pytestmark = pytest.mark.controlplane

TIMEOUT = 60.0


@pytest.fixture(scope="module")
def cp() -> Iterator[ControlPlane]:
    with dra_control_plane(scheduler=True) as plane:
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
        create_nvidia_classes(co)
        try:
            yield c
        finally:
            c.close()
            slices = co.list_cluster_custom_object(GROUP, VERSION, "resourceslices")
            assert isinstance(slices, dict)  # the client annotates custom objects as object
            for s in slices["items"]:
                if c.run in s["metadata"]["name"]:
                    co.delete_cluster_custom_object(
                        GROUP, VERSION, "resourceslices", s["metadata"]["name"]
                    )


def _claims(c: Cluster) -> list[dict[str, Any]]:
    got = client.CustomObjectsApi(c.api).list_namespaced_custom_object(
        GROUP, VERSION, c.ns, "resourceclaims"
    )
    assert isinstance(got, dict)  # the client annotates custom objects as object
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
    container's resource to the request; deleting the pod deletes the claim (garbage
    collector). kallot writes the same shape (``SHAPE``; names may differ). With
    ``KALLOT_RECORD_EXTENDED=<file>`` the pod and claim are written there as JSON."""
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
    assert _shape(claim, pod) == SHAPE
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
# What kube-scheduler v1.36 wrote for pod ``<pod>`` asking ``nvidia.com/gpu: 1`` (container
# c0), recorded on this control plane (test_kube_scheduler_shape checks it stays so; kallot
# must write the same).
SHAPE: dict[str, Any] = {
    "generateName": "<pod>-extended-resources-",
    "annotations": {"resource.kubernetes.io/extended-resource-claim": "true"},
    "owners": [{"apiVersion": "v1", "kind": "Pod", "controller": True}],
    "finalizers": ["resource.kubernetes.io/delete-protection"],
    "spec": SPEC_ONE,
    "results": [{"request": "container-0-request-1", "driver": "gpu.nvidia.com"}],
    "nodeSelector": {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["<node>"]}]}
        ]
    },
    "reservedFor": [{"resource": "pods"}],
    "podStatusKeys": ["requestMappings", "resourceClaimName"],
    "mappings": [
        {
            "containerName": "c0",
            "resourceName": "nvidia.com/gpu",
            "requestName": "container-0-request-1",
        }
    ],
}


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


async def _explain(cluster: Cluster, name: str) -> explain.Explanation:
    kc = await KubeClient.connect(cluster.cp.kubeconfig_path)
    try:
        return await explain.fetch(kc, cluster.ns, name)
    finally:
        await kc.close()


def _wait_pending(cluster: Cluster, name: str, what: str) -> None:
    """Until pod ``name`` is pending with a reason (``what`` and the scheduler's log if not)."""
    wait_until(
        lambda: pending_reason(cluster.pod(name)),
        timeout=TIMEOUT,
        what=f"{what}\n{cluster.schedulers[-1].log_tail()}",
    )


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
    assert _shape(claim, pod) == SHAPE
    text = "\n".join(asyncio.run(_explain(cluster, "k1")).lines())
    assert "Extended resources by DRA (c0/nvidia.com/gpu=container-0-request-1):" in text, text
    want = (
        f"claim {claim['metadata']['name']} [container-0-request-1: 1 of gpu.nvidia.com]: "
        f"allocated container-0-request-1={node}/{dev[1]}; reserved for k1"
    )
    assert want in text, text
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
    _wait_pending(cluster, "more", "more pending with a reason")
    reason = pending_reason(cluster.pod("more"))
    assert "extended resource nvidia.com/gpu (DeviceClass gpu.nvidia.com)" in reason, reason
    assert "wants 1, 3 devices match, 3 in use" in reason, reason
    assert "-extended-resources" not in reason, reason
    text = "\n".join(asyncio.run(_explain(cluster, "more")).lines())
    assert "extended resource nvidia.com/gpu (DeviceClass gpu.nvidia.com)" in text, text
    # Events go out after the condition, from the reporter's own queue: wait for it.
    wait_until(
        lambda: any(
            "extended resource nvidia.com/gpu (DeviceClass gpu.nvidia.com)" in e.get("message", "")
            for e in cluster.events("more")
        ),
        timeout=TIMEOUT,
        what=f"more's Event naming the resource and class: {cluster.events('more')}",
    )
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
    _wait_pending(cluster, "c", "c pending with a reason")
    reason = pending_reason(cluster.pod("c"))
    assert "extended resource nvidia.com/gpu (DeviceClass gpu.nvidia.com)" in reason, reason
    assert "in use" in reason and "node advertises nvidia.com/gpu (device plugin)" in reason
    assert "; by device plugin: 0/2 nodes are available" in reason, reason
    assert len(_claims(cluster)) == 1


def _left_behind(cluster: Cluster, pod: str, *, device: str = "") -> str:
    """The special claim a kallot killed (-9) mid-bind leaves for pending ``pod``: created
    (owner, annotation, finalizer, spec), and with ``device`` also allocated to it on d0 and
    reserved for the pod (killed after the claim's status write, before the bind)."""
    co = client.CustomObjectsApi(cluster.api)
    p = cluster.pod(pod)
    uid = p["metadata"]["uid"]
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ResourceClaim",
        "metadata": {
            "generateName": f"{pod}-extended-resources-",
            "annotations": {"resource.kubernetes.io/extended-resource-claim": "true"},
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": uid, "controller": True}
            ],
            "finalizers": ["resource.kubernetes.io/delete-protection"],
        },
        "spec": SPEC_ONE,
    }
    made = co.create_namespaced_custom_object(GROUP, VERSION, cluster.ns, "resourceclaims", body)
    assert isinstance(made, dict)  # the client annotates custom objects as object
    name = str(made["metadata"]["name"])
    if device:
        node = f"d0-{cluster.run}"
        made["status"] = {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "container-0-request-1",
                            "driver": "gpu.nvidia.com",
                            "pool": node,
                            "device": device,
                        }
                    ]
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [node]}
                            ]
                        }
                    ]
                },
            },
            "reservedFor": [{"resource": "pods", "name": pod, "uid": uid}],
        }
        co.replace_namespaced_custom_object_status(
            GROUP, VERSION, cluster.ns, "resourceclaims", name, made
        )
    return name


def test_restart_reuses_the_special_claim(cluster: Cluster) -> None:
    """What a kill -9 between the writes leaves, read back by a fresh kallot: d0 has 2 GPUs.
    Pod ``r1``'s claim was created but not allocated: kallot allocates that claim (no second
    one) and binds. Pod ``r2``'s claim was allocated to gpu-1 and reserved for it: kallot
    binds r2 to d0 with that allocation unchanged. Both GPUs are then taken (r1's must be
    gpu-0, since gpu-1 is r2's): pod ``r3`` stays pending, and no claim is made for it."""
    node = f"d0-{cluster.run}"
    cluster.add_nodes([dra_only_node(node)])
    _slices(cluster, node, gpus=2)
    cluster.create_pods([gpu_pod(n, "kallot", {wire.RESOURCE_GPU: "1"}) for n in ("r1", "r2")])
    first = _left_behind(cluster, "r1")
    second = _left_behind(cluster, "r2", device="gpu-1")
    _kallot(cluster)
    _bound(cluster, "r1", "r2")
    c1, c2 = _claim_of(cluster, "r1"), _claim_of(cluster, "r2")
    assert (c1["metadata"]["name"], c2["metadata"]["name"]) == (first, second)
    assert _devices(c1) == [("container-0-request-1", "gpu-0")]
    assert _devices(c2) == [("container-0-request-1", "gpu-1")]
    for pod, name in (("r1", first), ("r2", second)):
        assert (
            cluster.pod(pod)["status"]["extendedResourceClaimStatus"]["resourceClaimName"] == name
        )
    cluster.create_pods([gpu_pod("r3", "kallot", {wire.RESOURCE_GPU: "1"})])
    _wait_pending(cluster, "r3", "r3 pending")
    assert len(_claims(cluster)) == 2


def test_kill_9_during_extended_churn(cluster: Cluster) -> None:
    """kallot is killed (-9) 6 times while pods asking ``nvidia.com/gpu`` (1, or 2 every
    third) are created and some deleted, on 2 DRA-only nodes of 3 GPUs. At the end, from the
    API: no device in two allocations, at most one special claim per pod, none allocated
    without a live pod reserving it, every bound pod's special claim allocated, reserved for it
    and named in its status, every pod bound or pending with a reason."""
    nodes = [f"d{i}-{cluster.run}" for i in range(2)]
    cluster.add_nodes([dra_only_node(n) for n in nodes])
    for n in nodes:
        _slices(cluster, n, gpus=3)
    made = 0
    alive: list[str] = []
    sched = cluster.scheduler(identity="k0")
    for kill in range(6):
        batch = [
            gpu_pod(
                f"x{made + i}", "kallot", {wire.RESOURCE_GPU: "2" if (made + i) % 3 == 0 else "1"}
            )
            for i in range(3)
        ]
        made += len(batch)
        cluster.create_pods(batch)
        alive += [b["metadata"]["name"] for b in batch]
        if kill % 2:
            for name in alive[:2]:
                cluster.delete_pod(name)
            alive = alive[2:]
        names = {b["metadata"]["name"] for b in batch}

        def acting(names: set[str] = names) -> bool:
            return any(
                p["spec"].get("nodeName") or (p.get("status") or {}).get("conditions")
                for p in cluster.pods()
                if p["metadata"]["name"] in names
            )

        wait_until(
            acting,
            timeout=TIMEOUT,
            what=f"kallot acting on batch {kill}\n{sched.log_tail()}",
        )
        sched.kill()
        sched = cluster.scheduler(identity=f"k{kill + 1}")
    sched.wait_ready(timeout=60)

    def orphans() -> list[str]:
        live = {p["metadata"]["uid"] for p in cluster.pods()}
        return [
            c["metadata"]["name"]
            for c in _claims(cluster)
            if (c.get("status") or {}).get("allocation")
            and not {u["uid"] for u in c["status"].get("reservedFor") or []} & live
        ]

    wait_until(
        lambda: cluster.settled() and not orphans(),
        timeout=120,
        what=f"settled, no orphans: {orphans()}\n{sched.log_tail()}",
    )
    # The scheduler runs on: a pending pod may still be placed. Its claim is written before
    # its bind, so reading the pods first makes every bound pod's claim part of the claims
    # read after them (read the other way round, a bind in between finds no claim).
    pods = cluster.pods()
    seen: dict[tuple[str, str, str], str] = {}
    owners: dict[str, list[str]] = {}
    claims = {c["metadata"]["name"]: c for c in _claims(cluster)}
    for c in claims.values():
        for o in c["metadata"].get("ownerReferences") or []:
            owners.setdefault(o["uid"], []).append(c["metadata"]["name"])
        alloc = (c.get("status") or {}).get("allocation")
        for r in (alloc or {}).get("devices", {}).get("results", []):
            key = (r["driver"], r["pool"], r["device"])
            assert key not in seen, f"{key} in {seen[key]} and {c['metadata']['name']}"
            seen[key] = c["metadata"]["name"]
    bound = 0
    for p in pods:
        uid = p["metadata"]["uid"]
        assert len(owners.get(uid, [])) <= 1, owners[uid]
        if not p["spec"].get("nodeName"):
            continue
        bound += 1
        name = p["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
        assert owners[uid] == [name]
        status = claims[name]["status"]
        assert uid in {u["uid"] for u in status["reservedFor"]}
        assert status["allocation"]["nodeSelector"]  # allocated, to the pod's node
    assert bound >= 3


def test_kube_scheduler_special_claims_occupy_devices(cluster: Cluster) -> None:
    """d0 has 2 GPUs. kube-scheduler serves pod ``ks`` (1 GPU) by a special claim; kallot
    then serves ``k`` (1 GPU) with the other GPU (kube-scheduler's special claim is an
    ordinary allocated claim to kallot), and ``k2`` finds none: pending. From the API, no
    device in two claims."""
    node = f"d0-{cluster.run}"
    cluster.add_nodes([dra_only_node(node)])
    _slices(cluster, node, gpus=2)
    cluster.create_pods([gpu_pod("ks", "default-scheduler", {wire.RESOURCE_GPU: "1"})])
    _bound(cluster, "ks")
    (theirs,) = _devices(_claim_of(cluster, "ks"))
    _kallot(cluster)
    cluster.create_pods([gpu_pod("k", "kallot", {wire.RESOURCE_GPU: "1"})])
    _bound(cluster, "k")
    (mine,) = _devices(_claim_of(cluster, "k"))
    assert {theirs[1], mine[1]} == {"gpu-0", "gpu-1"}
    cluster.create_pods([gpu_pod("k2", "kallot", {wire.RESOURCE_GPU: "1"})])
    _wait_pending(cluster, "k2", "k2 pending")
    assert "2 devices match, 2 in use" in pending_reason(cluster.pod("k2"))


def test_a_node_advertising_zero_serves_by_dra(cluster: Cluster) -> None:
    """z0's allocatable says ``nvidia.com/gpu: 0`` and its slices offer 1 DRA GPU:
    kube-scheduler v1.36 serves the resource there by DRA (a zero counts as not advertised):
    its pod ``ks`` gets gpu-0 by a special claim. kallot does the same: its pod ``k`` finds
    the GPU taken (pending, the reason names the resource and class), and once ``ks`` is
    deleted (its claim released) gets gpu-0."""
    node = f"z0-{cluster.run}"
    cluster.add_nodes([gpu_node_body(node, gpus=0)])
    _slices(cluster, node, gpus=1)
    cluster.create_pods([gpu_pod("ks", "default-scheduler", {wire.RESOURCE_GPU: "1"})])
    _bound(cluster, "ks")
    assert _devices(_claim_of(cluster, "ks")) == [("container-0-request-1", "gpu-0")]
    _kallot(cluster)
    cluster.create_pods([gpu_pod("k", "kallot", {wire.RESOURCE_GPU: "1"})])
    _wait_pending(cluster, "k", "k pending")
    reason = pending_reason(cluster.pod("k"))
    assert "extended resource nvidia.com/gpu (DeviceClass gpu.nvidia.com)" in reason, reason
    assert "1 devices match, 1 in use" in reason, reason
    cluster.delete_pod("ks")
    _bound(cluster, "k")
    assert _devices(_claim_of(cluster, "k")) == [("container-0-request-1", "gpu-0")]


def test_api_server_without_the_gate_fails_the_bind_with_a_reason(tmp_path: Path) -> None:
    """kube-apiserver with DRAExtendedResource off drops the pod's
    ``status.extendedResourceClaimStatus`` (and DeviceClasses' ``extendedResourceName``; the
    implicit name still maps to a class): kallot's bind of a pod asking
    ``deviceclass.resource.kubernetes.io/gpu.nvidia.com: 1`` notices, undoes the special claim
    and leaves the pod pending with a reason naming the gate; no claim stays allocated."""
    gates = {**DEFAULT_FEATURE_GATES, "DRAExtendedResource": False}
    with (
        dra_control_plane(scheduler=False, feature_gates=gates) as plane,
        plane.api_client() as api,
    ):
        c = Cluster(plane, api, tmp_path)
        co = client.CustomObjectsApi(api)
        create_nvidia_classes(co)
        node = f"d0-{c.run}"
        c.add_nodes([dra_only_node(node)])
        _slices(c, node, gpus=1)
        implicit = "deviceclass.resource.kubernetes.io/gpu.nvidia.com"
        c.create_pods([gpu_pod("g", "kallot", {implicit: "1"})])
        _kallot(c)

        def failed() -> str:
            text = " ".join(e.get("message", "") for e in c.events("g"))
            return text if "DRAExtendedResource" in text else ""

        wait_until(failed, timeout=TIMEOUT, what=f"the bind failing\n{c.schedulers[-1].log_tail()}")
        assert not c.pod("g")["spec"].get("nodeName")
        c.schedulers[-1].kill()
        allocated = [x for x in _claims(c) if (x.get("status") or {}).get("allocation")]
        assert not allocated, allocated
        c.close()
