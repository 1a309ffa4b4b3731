"""Karpenter (v1.15.0, its KWOK provider, tools/testenv/build-karpenter.sh) acting on what
kallot asks for, on the real control plane with kube-scheduler: kallot's planner sizes a gang's
scale-up, its placeholder pods (kube.autoscale.provision) make Karpenter create exactly those nodes, and
Karpenter's consolidation then removes a node whose pod may move while it leaves alone the node
whose pod carries ``karpenter.sh/do-not-disrupt`` (what kube.autoscale.disruption writes on model servers).

Nothing plays the kubelet: the test reports each new node Ready (``Karpenter.mark_ready``).
Every wait is on state read from the API.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from kallot.config import presets
from kallot.config.autoscale import node_shapes_from_nodepool
from kallot.core import policies
from kallot.core.framework.runner import Framework
from kallot.core.provision.plan import Planner
from kallot.core.workload import DeviceRequest, Job, Task, TopologyConstraint, TopologyMode
from kallot.kube import translate
from kallot.kube.api.client import KubeClient
from kallot.kube.autoscale import provision
from kallot.testing.karpenter import Karpenter
from kallot.testing.karpenter_fleet import CATALOGUE, fresh, nodepool
from kallot.testing.live import wait_until

pytestmark = pytest.mark.controlplane

NS = "default"


def _small_pod(name: str, node: str, *, protected: bool) -> dict[str, Any]:
    ann = {translate.ANN_KARPENTER_DO_NOT_DISRUPT: "true"} if protected else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "annotations": ann},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {"name": "c", "image": provision.PAUSE, "resources": {"requests": {"cpu": "1"}}}
            ],
        },
    }


@pytest.fixture
def karpenter(fleet: Karpenter) -> Iterator[Karpenter]:
    # Karpenter's own consolidation (underused nodes too) for this test.
    fresh(fleet, "WhenEmptyOrUnderutilized", "5s")
    try:
        yield fleet
    finally:  # nothing of this test stays for the next
        fleet.kubectl("delete", "pods", "--all", "-n", NS, "--grace-period=0", "--wait=false")


def test_scale_up_from_the_plan_then_consolidation_spares_the_protected(
    karpenter: Karpenter,
) -> None:
    k = karpenter
    (shape,) = node_shapes_from_nodepool(nodepool(), CATALOGUE)
    job = Job(
        id="train",
        min_available=2,
        topology=TopologyConstraint(mode=TopologyMode.REQUIRED, level="kallot.io/rack"),
    )
    tasks = [
        Task(
            id=f"train-{i}", cpu_milli=8000, mem_mib=65536, gpu=DeviceRequest(count=8), job="train"
        )
        for i in range(2)
    ]
    fw = Framework(presets.PROFILES["kallot"], policies.builtin_registry())
    plan = Planner(fw, [shape]).plan(tasks, {"train": job})
    assert plan.counts() == {shape.name: 2}

    async def ask() -> list[dict[str, Any]]:
        kc = await KubeClient.connect(k.cp.kubeconfig_path)
        try:
            return await provision.ask(
                kc, NS, plan, {shape.name: shape}, {}, provisioner="karpenter"
            )
        finally:
            await kc.close()

    placeholders = [p["metadata"]["name"] for p in asyncio.run(ask())]
    claims = wait_until(
        lambda: len(k.get("nodeclaims")["items"]) >= 2 and k.get("nodeclaims")["items"],
        timeout=120,
        what="two NodeClaims",
    )
    assert len(claims) == 2  # exactly what the plan asked for

    def nodes() -> list[str]:
        return [n["metadata"]["name"] for n in k.get("nodes")["items"]]

    names = wait_until(lambda: len(nodes()) == 2 and nodes(), timeout=120, what="two nodes")
    for n in names:
        node = k.get("node", n)
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
        assert node["metadata"]["labels"]["karpenter.sh/nodepool"] == "gpu"
        k.mark_ready(n)

    def bound() -> dict[str, str]:
        pods = {p: k.get("pod", p, "-n", NS)["spec"].get("nodeName", "") for p in placeholders}
        return pods if all(pods.values()) else {}

    on = wait_until(bound, timeout=120, what="the placeholders bound to the new nodes")
    assert sorted(on.values()) == sorted(names)  # one placeholder per planned node

    # The nodes are there for the gang; now leave a small pod on each: one protected as kallot
    # protects a loading model server, one free to move. Then the placeholders go.
    protected_node, free_node = names
    k.apply(_small_pod("server", protected_node, protected=True))
    k.apply(_small_pod("batch", free_node, protected=False))
    for p in placeholders:
        k.kubectl("delete", "pod", p, "-n", NS, "--wait=false")

    # Karpenter consolidates: one of the two underused nodes goes, never the protected one.
    wait_until(
        lambda: len(nodes()) == 1, timeout=180, what="Karpenter to consolidate one node away"
    )
    assert nodes() == [protected_node]
    server = k.get("pod", "server", "-n", NS)
    assert server["spec"]["nodeName"] == protected_node and not server["metadata"].get(
        "deletionTimestamp"
    )
    reasons = k.kubectl("get", "events", "-A", "-o", "custom-columns=R:.reason,M:.message")
    assert "DisruptionTerminating" in reasons
