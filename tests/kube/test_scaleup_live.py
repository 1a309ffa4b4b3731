"""Autoscaling end to end on the real control plane: ``kallot scheduler`` (subprocess) with
``autoscale`` configured, Karpenter v1.15.0's KWOK provider and kube-scheduler.

GPU pods pending for lack of capacity -> the scheduler's planner -> one placeholder pod per
planned node -> Karpenter creates exactly those nodes -> kallot binds the pods there -> the
placeholders are gone. (Consolidation end to end: tests/kube/test_consolidate_live.py.)

Nothing plays the kubelet or the node agent: the test reports each node Karpenter makes Ready
and publishes its GPU inventory (``serve``), as they would. Every wait is on API state.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kallot.config.inventory import ANNOTATION as INVENTORY
from kallot.config.inventory import Device, NodeInventory
from kallot.core.resources import GPU_MODELS
from kallot.kube.autoscale import provision
from kallot.testing.controlplane import ControlPlane
from kallot.testing.karpenter import Karpenter
from kallot.testing.live import Cluster, gpu_usage, overcommitted, pod_body, wait_until

pytestmark = pytest.mark.controlplane

ZONE = "topology.kubernetes.io/zone"
POOL_LABEL = "karpenter.sh/nodepool"
INSTANCE_TYPES = [
    {
        "name": "gpu8-h100",
        "architecture": "amd64",
        "operatingSystems": ["linux"],
        "resources": {"cpu": "96", "memory": "1024Gi", "pods": "110", "nvidia.com/gpu": "8"},
        "offerings": [
            {
                "Price": 98.3,
                "Available": True,
                "Requirements": [
                    {
                        "key": "karpenter.sh/capacity-type",
                        "operator": "In",
                        "values": ["on-demand"],
                    },
                    {"key": ZONE, "operator": "In", "values": ["zone-a"]},
                ],
            }
        ],
    }
]
NODEPOOL: dict[str, Any] = {
    "apiVersion": "karpenter.sh/v1",
    "kind": "NodePool",
    "metadata": {"name": "gpu"},
    "spec": {
        "template": {
            "metadata": {"labels": {"kallot.io/rack": "r1"}},
            "spec": {
                "nodeClassRef": {
                    "group": "karpenter.kwok.sh",
                    "kind": "KWOKNodeClass",
                    "name": "default",
                },
                "requirements": [
                    {
                        "key": "node.kubernetes.io/instance-type",
                        "operator": "In",
                        "values": ["gpu8-h100"],
                    }
                ],
                "expireAfter": "Never",
            },
        },
        # Karpenter removes empty nodes only: kallot decides what moves.
        "disruption": {"consolidationPolicy": "WhenEmpty", "consolidateAfter": "10s"},
    },
}
SHAPE = {
    "name": "gpu8",
    "nodePool": "gpu",
    "instanceType": "gpu8-h100",
    "cpu": 96,
    "memoryGiB": 1024,
    "gpuModel": "H100-80GB",
    "gpus": 8,
    "gpuMode": "mps",
    "labels": {"kallot.io/rack": "r1"},
}


@pytest.fixture(scope="module")
def fleet() -> Iterator[Karpenter]:
    with ControlPlane(scheduler=True) as cp, Karpenter(cp, INSTANCE_TYPES) as k:
        k.apply(
            {
                "apiVersion": "karpenter.kwok.sh/v1alpha1",
                "kind": "KWOKNodeClass",
                "metadata": {"name": "default"},
            }
        )
        k.apply(NODEPOOL)
        # What the chart ships (charts/kallot/templates/priorityclass.yaml).
        k.apply(
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": provision.PLACEHOLDER_PRIORITY_CLASS},
                "value": -10,
                "preemptionPolicy": "Never",
                "description": "kallot's capacity placeholders: every real pod preempts them",
            }
        )
        yield k


@pytest.fixture
def cluster(fleet: Karpenter, tmp_path: Path) -> Iterator[Cluster]:
    with fleet.cp.api_client() as api:
        c = Cluster(fleet.cp, api, tmp_path)
        try:
            yield c
        finally:
            c.close()


def _config(path: Path, ns: str) -> Path:
    doc = {
        "apiVersion": "kallot.io/v1alpha1",
        "kind": "KallotSchedulerConfiguration",
        "autoscale": {
            "provisioner": "karpenter",
            "placeholderNamespace": ns,
            "nodeShapes": [SHAPE],
        },
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def serve(k: Karpenter, served: set[str], gpu_mem: dict[tuple[str, str], int]) -> None:
    """Play the kubelet and the node agent on every node Karpenter made: Ready, and the GPU
    inventory the agent publishes (8 H100s, MPS)."""
    for node in k.get("nodes")["items"]:
        name = node["metadata"]["name"]
        if name in served or POOL_LABEL not in node["metadata"].get("labels", {}):
            continue
        mem = GPU_MODELS["H100-80GB"].memory_mib
        inv = NodeInventory(
            devices=tuple(
                Device(index=i, uuid=f"GPU-{name}-{i}", model="H100-80GB", mem_mib=mem)
                for i in range(8)
            )
        )
        patch = {"metadata": {"annotations": {INVENTORY: inv.to_json()}}}
        k.kubectl("patch", "node", name, "--type=merge", "-p", json.dumps(patch))
        k.mark_ready(name)
        served.add(name)
        gpu_mem.update({(name, d.uuid): d.mem_mib for d in inv.devices})


def _karpenter_nodes(k: Karpenter) -> list[str]:
    return sorted(
        n["metadata"]["name"]
        for n in k.get("nodes")["items"]
        if POOL_LABEL in n["metadata"].get("labels", {})
    )


def test_pending_gpu_pods_get_the_nodes_kallot_planned(fleet: Karpenter, cluster: Cluster) -> None:
    k = fleet
    served: set[str] = set()
    sched = cluster.scheduler(extra=[f"--config={_config(cluster.log_dir / 'c.yaml', cluster.ns)}"])
    sched.wait_ready(60)
    # 12 half-GPU shares (6 GPUs: one node) and two 8-GPU pods (a node each): kallot plans 3
    # nodes; an integer-counting autoscaler would count 12 + 16 = 28 GPUs, 4 nodes.
    shares = [pod_body(f"share-{i}", resources={"kallot.io/gpu-milli": "500"}) for i in range(12)]
    whole = [pod_body(f"whole-{i}", resources={"nvidia.com/gpu": "8"}) for i in range(2)]
    start = time.monotonic()
    cluster.create_pods(shares + whole)

    def placed() -> dict[str, str]:
        serve(k, served, cluster.gpu_mem)
        pods = {p["metadata"]["name"]: p["spec"].get("nodeName", "") for p in cluster.pods()}
        mine = {n: v for n, v in pods.items() if not n.startswith("kallot-capacity")}
        return mine if len(mine) == 14 and all(mine.values()) else {}

    on = wait_until(placed, timeout=240, what="every pod bound to a node Karpenter made")
    took = time.monotonic() - start
    nodes = _karpenter_nodes(k)
    claims = k.get("nodeclaims")["items"]
    assert len(claims) == 3, [c["metadata"]["name"] for c in claims]  # the plan, no more
    assert len(nodes) == 3 and set(on.values()) <= set(nodes)
    assert len({on[f"share-{i}"] for i in range(12)}) == 1  # packed per GPU, one node
    assert len({on["whole-0"], on["whole-1"]} - {on["share-0"]}) == 2
    assert not overcommitted(gpu_usage(cluster.pods()), cluster.gpu_mem)

    def no_placeholders() -> bool:
        sel = provision.PLACEHOLDER_LABEL
        out = k.kubectl("get", "pods", "-n", cluster.ns, "-l", sel, "-o", "name")
        return not out.strip()

    wait_until(no_placeholders, timeout=60, what="the placeholders deleted")
    print(f"scale-up: 14 pods pending -> bound on {len(nodes)} new nodes in {took:.1f}s")
    # Karpenter never acted on kallot's own pods (they are nominated while capacity comes).
    log = k.logs()
    assert "share-" not in log and "whole-" not in log, log[-2000:]
