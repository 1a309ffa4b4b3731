"""Kubernetes constraints end to end: the live scheduler (a subprocess) on a real kube-apiserver
honours a GPU node's taint, spreads a serving Deployment's replicas with anti-affinity, and
puts a pod with a node-bound volume on that node (or leaves it pending with the reason); a
WaitForFirstConsumer claim learns its node before the pod is bound."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from kallot.kube.state.volumes import ANN_BIND_COMPLETED, ANN_SELECTED_NODE
from kallot.testing.live import Cluster, inventory_node_body, pending_reason, pod_body, wait_until

pytestmark = pytest.mark.controlplane

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
TOLERATE_GPU = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def test_gpu_taint_admits_only_tolerating_pods(cluster: Cluster) -> None:
    gpu, cpu = f"{cluster.run}-gpu", f"{cluster.run}-cpu"
    tainted = inventory_node_body(gpu, 4)
    tainted["spec"] = {"taints": [GPU_TAINT]}
    cluster.add_nodes([tainted, inventory_node_body(cpu, 0)])
    pods = []
    for i in range(3):
        p = pod_body(f"tolerant-{i}", resources={"nvidia.com/gpu": "1"})
        p["spec"]["tolerations"] = [TOLERATE_GPU]
        pods.append(p)
    pods += [pod_body(f"gpu-plain-{i}", resources={"nvidia.com/gpu": "1"}) for i in range(2)]
    pods += [pod_body(f"cpu-{i}") for i in range(4)]
    cluster.create_pods(pods)
    s = cluster.scheduler()
    wait_until(lambda: s.check_alive() and cluster.settled(), timeout=60, what="pods settled")
    by_name = {p["metadata"]["name"]: p for p in cluster.pods()}
    for name, p in by_name.items():
        node = p["spec"].get("nodeName", "")
        tolerates = bool(p["spec"].get("tolerations") and name.startswith("tolerant"))
        if node == gpu:
            assert tolerates, f"{name} landed on the tainted GPU node without a toleration"
    assert all(by_name[f"tolerant-{i}"]["spec"].get("nodeName") == gpu for i in range(3))
    assert all(by_name[f"cpu-{i}"]["spec"].get("nodeName") == cpu for i in range(4))
    for i in range(2):
        p = by_name[f"gpu-plain-{i}"]
        assert not p["spec"].get("nodeName")
        assert "untolerated taint nvidia.com/gpu=present:NoSchedule" in pending_reason(p)
    cluster.assert_no_overcommit()


def _replicas(template: dict[str, Any], name: str, count: int) -> list[dict[str, Any]]:
    """The pods a ReplicaSet controller stamps from a Deployment's template (the test control
    plane runs no controller-manager, so the test does that part)."""
    out = []
    for i in range(count):
        pod = {"apiVersion": "v1", "kind": "Pod", **copy.deepcopy(template)}
        pod["metadata"] = {**pod.get("metadata", {}), "name": f"{name}-{i}"}
        out.append(pod)
    return out


def test_anti_affinity_spreads_a_serving_deployment(cluster: Cluster) -> None:
    nodes = [f"{cluster.run}-n{i}" for i in range(4)]
    cluster.add_nodes([inventory_node_body(n, 2) for n in nodes])
    labels = {"app": f"llm-{cluster.run}"}
    template = {
        "metadata": {"labels": labels},
        "spec": {
            "schedulerName": "kallot",
            "terminationGracePeriodSeconds": 0,
            "affinity": {
                "podAntiAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "labelSelector": {"matchLabels": labels},
                            "topologyKey": "kubernetes.io/hostname",
                        }
                    ]
                }
            },
            "containers": [
                {
                    "name": "server",
                    "image": "kallot.io/test:none",
                    "resources": {
                        "limits": {"cpu": "100m", "memory": "128Mi", "nvidia.com/gpu": "1"}
                    },
                }
            ],
        },
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "llm", "labels": labels},
        "spec": {"replicas": 5, "selector": {"matchLabels": labels}, "template": template},
    }
    client.AppsV1Api(cluster.api).create_namespaced_deployment(
        cluster.ns, client.V1Deployment.model_validate(deployment)
    )
    cluster.create_pods(_replicas(template, "llm", 5))  # all five pending in one session
    s = cluster.scheduler()
    wait_until(lambda: s.check_alive() and cluster.settled(), timeout=60, what="replicas settled")
    placed = [p["spec"].get("nodeName") for p in cluster.pods() if p["spec"].get("nodeName")]
    assert sorted(placed) == sorted(nodes), "one replica per node, every node used"
    pending = [p for p in cluster.pods() if not p["spec"].get("nodeName")]
    assert len(pending) == 1
    assert "anti-affinity" in pending_reason(pending[0])
    cluster.assert_no_overcommit()


@pytest.fixture
def storage(cluster: Cluster) -> Iterator[dict[str, list[str]]]:
    made: dict[str, list[str]] = {"pv": [], "sc": []}
    yield made
    v1 = cluster.v1
    for pvc in v1.list_namespaced_persistent_volume_claim(cluster.ns).items:
        assert pvc.metadata is not None and pvc.metadata.name is not None
        v1.patch_namespaced_persistent_volume_claim(
            pvc.metadata.name, cluster.ns, {"metadata": {"finalizers": None}}
        )
        v1.delete_namespaced_persistent_volume_claim(pvc.metadata.name, cluster.ns)
    for name in made["pv"]:
        v1.patch_persistent_volume(name, {"metadata": {"finalizers": None}})
        v1.delete_persistent_volume(name)
    for name in made["sc"]:
        client.StorageV1Api(cluster.api).delete_storage_class(name)


def _local_pv(name: str, node: str, cls: str, claim: tuple[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": cls,
            "hostPath": {"path": "/tmp"},
            "claimRef": {"namespace": claim[0], "name": claim[1]},
            "nodeAffinity": {
                "required": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": "kubernetes.io/hostname",
                                    "operator": "In",
                                    "values": [node],
                                }
                            ]
                        }
                    ]
                }
            },
        },
    }


def _claim(name: str, cls: str, volume: str = "") -> dict[str, Any]:
    spec: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "1Gi"}},
        "storageClassName": cls,
    }
    meta: dict[str, Any] = {"name": name}
    if volume:
        spec["volumeName"] = volume
        meta["annotations"] = {ANN_BIND_COMPLETED: "yes"}
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta, "spec": spec}


def _with_claim(pod: dict[str, Any], claim: str) -> dict[str, Any]:
    pod["spec"]["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]
    return pod


def test_node_bound_volume_decides_the_node(
    cluster: Cluster, storage: dict[str, list[str]]
) -> None:
    nodes = [f"{cluster.run}-n{i}" for i in range(3)]
    bodies = [inventory_node_body(n, 1) for n in nodes]
    bodies[2] = inventory_node_body(nodes[2], 1, cpu_milli=50)  # no room for a 100m pod
    cluster.add_nodes(bodies)
    cls = f"local-{cluster.run}"
    for i, node in ((1, nodes[1]), (2, nodes[2])):
        pv = _local_pv(f"{cluster.run}-pv{i}", node, cls, (cluster.ns, f"data{i}"))
        cluster.v1.create_persistent_volume(client.V1PersistentVolume.model_validate(pv))
        storage["pv"].append(pv["metadata"]["name"])
        cluster.v1.create_namespaced_persistent_volume_claim(
            cluster.ns,
            client.V1PersistentVolumeClaim.model_validate(
                _claim(f"data{i}", cls, pv["metadata"]["name"])
            ),
        )
    cluster.create_pods(
        [
            _with_claim(pod_body("on-volume"), "data1"),
            _with_claim(pod_body("full-node"), "data2"),
            _with_claim(pod_body("no-claim"), "missing"),
        ]
    )
    s = cluster.scheduler()
    wait_until(lambda: s.check_alive() and cluster.settled(), timeout=60, what="pods settled")
    assert cluster.pod("on-volume")["spec"].get("nodeName") == nodes[1]
    full = cluster.pod("full-node")
    assert not full["spec"].get("nodeName")
    assert "volume node affinity conflict" in pending_reason(full)
    missing = cluster.pod("no-claim")
    assert 'persistentvolumeclaim "missing" not found' in pending_reason(missing)
    # The claim appears: the pod is retried and scheduled without a restart.
    pv = _local_pv(f"{cluster.run}-pv3", nodes[0], cls, (cluster.ns, "missing"))
    cluster.v1.create_persistent_volume(client.V1PersistentVolume.model_validate(pv))
    storage["pv"].append(pv["metadata"]["name"])
    cluster.v1.create_namespaced_persistent_volume_claim(
        cluster.ns,
        client.V1PersistentVolumeClaim.model_validate(
            _claim("missing", cls, pv["metadata"]["name"])
        ),
    )
    bound = wait_until(
        lambda: s.check_alive() and cluster.pod("no-claim")["spec"].get("nodeName"),
        timeout=90,
        what="the pod whose claim appeared to be bound",
    )
    assert bound == nodes[0]


def test_wait_for_first_consumer_claim_gets_the_selected_node(
    cluster: Cluster, storage: dict[str, list[str]]
) -> None:
    nodes = [f"{cluster.run}-n{i}" for i in range(3)]
    cluster.add_nodes(
        [
            inventory_node_body(n, 1, labels={"topology.kubernetes.io/zone": f"z{i}"})
            for i, n in enumerate(nodes)
        ]
    )
    cls = f"wffc-{cluster.run}"
    client.StorageV1Api(cluster.api).create_storage_class(
        client.V1StorageClass.model_validate(
            {
                "metadata": {"name": cls},
                "provisioner": "csi.example.com",
                "volumeBindingMode": "WaitForFirstConsumer",
                "allowedTopologies": [
                    {
                        "matchLabelExpressions": [
                            {"key": "topology.kubernetes.io/zone", "values": ["z2"]}
                        ]
                    }
                ],
            }
        )
    )
    storage["sc"].append(cls)
    cluster.v1.create_namespaced_persistent_volume_claim(
        cluster.ns, client.V1PersistentVolumeClaim.model_validate(_claim("scratch", cls))
    )
    cluster.create_pods([_with_claim(pod_body("consumer"), "scratch")])
    s = cluster.scheduler()
    node = wait_until(
        lambda: s.check_alive() and cluster.pod("consumer")["spec"].get("nodeName"),
        timeout=60,
        what="the consumer to be bound",
    )
    assert node == nodes[2]
    claim = cluster.v1.read_namespaced_persistent_volume_claim("scratch", cluster.ns)
    assert claim.metadata is not None
    assert (claim.metadata.annotations or {}).get(ANN_SELECTED_NODE) == nodes[2]


def test_wait_for_first_consumer_static_volume_gets_the_claim(
    cluster: Cluster, storage: dict[str, list[str]]
) -> None:
    nodes = [f"{cluster.run}-n{i}" for i in range(3)]
    cluster.add_nodes([inventory_node_body(n, 1) for n in nodes])
    cls = f"local-wffc-{cluster.run}"
    client.StorageV1Api(cluster.api).create_storage_class(
        client.V1StorageClass.model_validate(
            {
                "metadata": {"name": cls},
                "provisioner": "kubernetes.io/no-provisioner",
                "volumeBindingMode": "WaitForFirstConsumer",
            }
        )
    )
    storage["sc"].append(cls)
    pv = _local_pv(f"{cluster.run}-pv", nodes[1], cls, ("", ""))
    del pv["spec"]["claimRef"]  # available to any claim of the class
    cluster.v1.create_persistent_volume(client.V1PersistentVolume.model_validate(pv))
    storage["pv"].append(pv["metadata"]["name"])
    cluster.v1.create_namespaced_persistent_volume_claim(
        cluster.ns, client.V1PersistentVolumeClaim.model_validate(_claim("local", cls))
    )
    cluster.create_pods([_with_claim(pod_body("consumer"), "local")])
    s = cluster.scheduler()
    node = wait_until(
        lambda: s.check_alive() and cluster.pod("consumer")["spec"].get("nodeName"),
        timeout=60,
        what="the consumer to be bound",
    )
    assert node == nodes[1]
    got = cluster.v1.read_persistent_volume(pv["metadata"]["name"])
    assert got.spec is not None
    assert got.spec.claim_ref is not None
    assert (got.spec.claim_ref.namespace, got.spec.claim_ref.name) == (cluster.ns, "local")
