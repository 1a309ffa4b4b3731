"""The Karpenter fleet the live autoscaling tests share (``fleet`` in tests/kube/conftest.py):
one control plane with kube-scheduler, Karpenter v1.15.0's KWOK provider on it
(kallot.testing.karpenter), one instance type ``gpu8-h100`` (8 GPUs), its KWOKNodeClass, the
NodePool ``gpu`` and the placeholder PriorityClass the chart ships.

Each test starts from ``fresh``: the NodePool with the disruption policy it needs, and no node
or NodeClaim left by an earlier test (Karpenter removes them once empty, on its own). Nothing
plays the kubelet or the node agent: ``serve`` reports each node Karpenter makes Ready and
publishes its GPU inventory, as they would.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kallot.config.inventory import ANNOTATION as INVENTORY
from kallot.config.inventory import Device, NodeInventory
from kallot.core.resources import GPU_MODELS
from kallot.kube.autoscale import provision
from kallot.testing.controlplane import ControlPlane
from kallot.testing.karpenter import Karpenter
from kallot.testing.live import Cluster, wait_until

ZONE = "topology.kubernetes.io/zone"
POOL_LABEL = "karpenter.sh/nodepool"
INSTANCE_TYPE = "gpu8-h100"
INSTANCE_TYPES = [
    {
        "name": INSTANCE_TYPE,
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
CATALOGUE = {INSTANCE_TYPE: {"cpu": 96, "memoryGiB": 1024, "gpuModel": "H100-80GB", "gpus": 8}}
#: the node shape of kallot's configuration for the NodePool (docs/autoscaling.md)
SHAPE = {
    "name": "gpu8",
    "nodePool": "gpu",
    "instanceType": INSTANCE_TYPE,
    "cpu": 96,
    "memoryGiB": 1024,
    "gpuModel": "H100-80GB",
    "gpus": 8,
    "gpuMode": "mps",
    "labels": {"kallot.io/rack": "r1"},
}


def nodepool(policy: str = "WhenEmpty", after: str = "10s") -> dict[str, Any]:
    """NodePool ``gpu``: ``WhenEmpty`` (Karpenter removes empty nodes only: kallot decides what
    moves) or ``WhenEmptyOrUnderutilized`` (Karpenter's own consolidation)."""
    return {
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
                            "values": [INSTANCE_TYPE],
                        }
                    ],
                    "expireAfter": "Never",
                },
            },
            "disruption": {"consolidationPolicy": policy, "consolidateAfter": after},
        },
    }


@contextmanager
def karpenter_fleet() -> Iterator[Karpenter]:
    """The fleet of the module docstring, its NodePool ``WhenEmpty``."""
    with ControlPlane(scheduler=True) as cp, Karpenter(cp, INSTANCE_TYPES) as k:
        k.apply(
            {
                "apiVersion": "karpenter.kwok.sh/v1alpha1",
                "kind": "KWOKNodeClass",
                "metadata": {"name": "default"},
            }
        )
        k.apply(nodepool())
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


def karpenter_nodes(k: Karpenter) -> list[str]:
    return sorted(
        n["metadata"]["name"]
        for n in k.get("nodes")["items"]
        if POOL_LABEL in n["metadata"].get("labels", {})
    )


def fresh(k: Karpenter, policy: str = "WhenEmpty", after: str = "10s") -> None:
    """The NodePool as the test needs it, and no node or NodeClaim of an earlier test."""
    k.apply(nodepool(policy, after))
    wait_until(
        lambda: not karpenter_nodes(k) and not k.get("nodeclaims")["items"],
        timeout=180,
        what="Karpenter to remove the nodes of earlier tests",
    )


@contextmanager
def fleet_cluster(
    k: Karpenter, log_dir: Path, policy: str = "WhenEmpty", after: str = "10s"
) -> Iterator[Cluster]:
    """One test's ``Cluster`` (its namespace, schedulers, teardown) on the fleet, which is
    ``fresh`` first."""
    fresh(k, policy, after)
    with k.cp.api_client() as api:
        c = Cluster(k.cp, api, log_dir)
        try:
            yield c
        finally:
            c.close()


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
