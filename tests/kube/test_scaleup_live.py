"""Autoscaling end to end on the real control plane: ``kallot scheduler`` (subprocess) with
``autoscale`` configured, Karpenter v1.15.0's KWOK provider and kube-scheduler.

GPU pods pending for lack of capacity -> the scheduler's planner -> one placeholder pod per
planned node -> Karpenter creates exactly those nodes -> kallot binds the pods there -> the
placeholders are gone. Runs on the shared Karpenter fleet (``fleet``,
kallot.testing.karpenter_fleet). (Consolidation end to end: tests/kube/test_consolidate_live.py,
with Karpenter: tests/kube/test_karpenter_consolidate_live.py.)

Nothing plays the kubelet or the node agent: the test reports each node Karpenter makes Ready
and publishes its GPU inventory (``serve``), as they would. Every wait is on API state.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kallot.kube.autoscale import provision
from kallot.testing.autoscale import config_file
from kallot.testing.karpenter import Karpenter
from kallot.testing.karpenter_fleet import SHAPE, fleet_cluster, karpenter_nodes, serve
from kallot.testing.live import Cluster, gpu_usage, overcommitted, pod_body, wait_until

pytestmark = pytest.mark.controlplane


@pytest.fixture
def cluster(fleet: Karpenter, tmp_path: Path) -> Iterator[Cluster]:
    # Karpenter removes empty nodes only: kallot decides what moves.
    with fleet_cluster(fleet, tmp_path, "WhenEmpty", "10s") as c:
        yield c


def test_pending_gpu_pods_get_the_nodes_kallot_planned(fleet: Karpenter, cluster: Cluster) -> None:
    k = fleet
    served: set[str] = set()
    conf = config_file(
        cluster.log_dir / "c.yaml", provisioner="karpenter", namespace=cluster.ns, shapes=[SHAPE]
    )
    sched = cluster.scheduler(extra=[f"--config={conf}"])
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
    nodes = karpenter_nodes(k)
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
