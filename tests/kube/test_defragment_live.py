"""Defragmentation end to end (kube.autoscale.consolidate, core.provision.consolidate.defragment) on the
real control plane, ``kallot scheduler`` as a subprocess with ``autoscale.consolidation`` on and
kube-controller-manager's ReplicaSet controller.

Nodes ``x`` and ``y`` have one GPU each. ``x`` holds ``mover`` (a ReplicaSet's pod, 600 milli
of the GPU), ``y`` a do-not-disrupt pod of 300: 400 and 700 milli free. A pod asking 800 fits
no GPU. kallot evicts ``mover`` (one Event naming the reason, the GPU it frees, the pending pod
and the gain), the pending pod gets ``x``'s GPU, and the ReplicaSet's new pod is nominated to
``y``, where the move planned it (kube.state.steer). ``gainThreshold`` 2 keeps it a
defragmentation: no node of one GPU is worth emptying.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from kallot.kube import translate
from kallot.testing.autoscale import config_file, consolidation, replica_set
from kallot.testing.controllers import ControllerManager
from kallot.testing.controlplane import BinariesMissingError, ControlPlane
from kallot.testing.live import Cluster, inventory_node_body, pod_body, wait_until

pytestmark = pytest.mark.controlplane

POOL = "kallot.io/test-pool"
MILLI = "kallot.io/gpu-milli"


@pytest.fixture(scope="module")
def replicasets(kube_cp: ControlPlane) -> Iterator[None]:
    try:
        kcm = ControllerManager(kube_cp, controllers=("replicaset",))
    except BinariesMissingError as exc:
        pytest.skip(str(exc))
    with kcm:
        yield


def test_a_pending_pod_gets_room_when_a_share_moves(
    cluster: Cluster, replicasets: None, tmp_path: Path
) -> None:
    run = cluster.run
    x, y = f"x-{run}", f"y-{run}"
    labels = {POOL: run}
    cluster.add_nodes([inventory_node_body(n, 1, labels=labels) for n in (x, y)])
    cordon = {
        n: lambda on, n=n: cluster.v1.patch_node(n, {"spec": {"unschedulable": on}}) for n in (x, y)
    }
    apps = client.AppsV1Api(cluster.api)
    # gainThreshold 2: no node of one GPU is worth emptying, so this is a defragmentation.
    conf = config_file(tmp_path / "c.yaml", consolidate=consolidation(gain=2))
    sched = cluster.scheduler(extra=[f"--config={conf}"])
    sched.wait_ready(60)
    try:
        cordon[x](True)
        stay = pod_body(
            "stay",
            resources={MILLI: "300"},
            annotations={translate.ANN_KARPENTER_DO_NOT_DISRUPT: "true"},
        )
        stay["spec"]["nodeSelector"] = labels
        cluster.create_pods([stay])

        def pods_on() -> dict[str, tuple[str, str]]:
            return {
                p["metadata"]["name"]: (p["metadata"]["uid"], p["spec"].get("nodeName", ""))
                for p in cluster.pods()
                if not p["metadata"].get("deletionTimestamp")
            }

        wait_until(lambda: pods_on().get("stay", ("", ""))[1] == y, timeout=60, what="stay on y")
        cordon[x](False)
        cordon[y](True)
        apps.create_namespaced_replica_set(
            cluster.ns,
            client.V1ReplicaSet.model_validate(
                replica_set("mover", {MILLI: "600"}, node_selector=labels)
            ),
        )

        def mover() -> tuple[str, str] | None:
            on = [v for n, v in pods_on().items() if n.startswith("mover-") and v[1]]
            return on[0] if len(on) == 1 else None

        first = wait_until(mover, timeout=60, what="the mover bound")
        assert first[1] == x
        cordon[y](False)
        big = pod_body("big", resources={MILLI: "800"})
        big["spec"]["nodeSelector"] = labels
        cluster.create_pods([big])

        wait_until(lambda: pods_on().get("big", ("", ""))[1] == x, timeout=60, what="big on x")
        second = wait_until(
            lambda: (m := mover()) is not None and m[0] != first[0] and m,
            timeout=60,
            what="the mover's replacement bound",
        )
        assert second[1] == y  # where the move planned it
        assert pods_on()["stay"][1] == y  # never moved
        events = [e for e in cluster.events() if e.get("reason") == "Consolidation"]
        on_pods = [e for e in events if e["involvedObject"]["kind"] == "Pod"]
        assert [e["involvedObject"]["uid"] for e in on_pods] == [first[0]], on_pods
        text = on_pods[0]["message"]
        assert f"freeing GPU 0 of node {x} lets pending {cluster.ns}/big fit" in text, text
        assert "(0.8 GPUs)" in text, text
        assert sched.metric("kallot_evictions_total") == {'{action="consolidate"}': 1.0}
        assert "replacement nominated" in sched.log_tail(400)
    finally:
        apps.delete_collection_namespaced_replica_set(cluster.ns)
