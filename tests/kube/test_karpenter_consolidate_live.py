"""Consolidation with Karpenter end to end: ``kallot scheduler`` (subprocess) with
``autoscale`` (Karpenter scale-up and consolidation on), Karpenter v1.15.0's KWOK provider, the
ReplicaSet controller of kube-controller-manager and kube-scheduler, all real.

Node A (a NodeClaim) holds pods that must not move: do-not-disrupt, inside min-runtime, a
model server still loading, the last Ready replica of another model; and a filler. A
ReplicaSet's two pods then fit no node, so kallot asks Karpenter for node B and binds them
there. The filler goes: A has room. kallot's consolidation empties B (two evictions through the
Eviction API, each with an Event naming the node and the GPUs it frees), the ReplicaSet makes
two new pods, which kallot nominates to A, where the move planned them (kube.state.steer), and
Karpenter removes the empty B (``WhenEmpty``). A and every protected pod stay: 0 protected
evictions, by kallot or Karpenter.

Nothing plays the kubelet or the node agent (kallot.testing.karpenter_fleet ``serve``); the
test sets the Ready condition of the model server that is Ready. Every wait is on API state.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from kallot.config import wire
from kallot.kube import translate
from kallot.testing.autoscale import config_file, consolidation, replica_set
from kallot.testing.controllers import ControllerManager
from kallot.testing.controlplane import BinariesMissingError
from kallot.testing.karpenter import Karpenter
from kallot.testing.karpenter_fleet import SHAPE, fleet_cluster, karpenter_nodes, serve
from kallot.testing.live import Cluster, pod_body, wait_until

pytestmark = pytest.mark.controlplane

GPU = "nvidia.com/gpu"


@pytest.fixture
def cluster(fleet: Karpenter, tmp_path: Path) -> Iterator[Cluster]:
    try:
        kcm = ControllerManager(fleet.cp, controllers=("replicaset",))
    except BinariesMissingError as exc:
        pytest.skip(str(exc))
    with kcm, fleet_cluster(fleet, tmp_path, "WhenEmpty", "5s") as c:
        try:
            yield c
        finally:
            # The ReplicaSet first, or it makes the pods again.
            client.AppsV1Api(c.api).delete_collection_namespaced_replica_set(c.ns)


def _set_ready(cluster: Cluster, name: str, since: float) -> None:
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(since))
    cond = {"type": "Ready", "status": "True", "lastTransitionTime": at}
    cluster.v1.patch_namespaced_pod_status(
        name, cluster.ns, {"status": {"phase": "Running", "conditions": [cond]}}
    )


def test_kallot_empties_a_karpenter_node_and_karpenter_removes_it(
    fleet: Karpenter, cluster: Cluster
) -> None:
    k = fleet
    served: set[str] = set()
    conf = config_file(
        cluster.log_dir / "c.yaml",
        provisioner="karpenter",
        namespace=cluster.ns,
        shapes=[SHAPE],
        consolidate=consolidation(),
    )
    sched = cluster.scheduler(extra=[f"--config={conf}"])
    sched.wait_ready(60)
    one = {GPU: "1"}
    protected = {
        "dnd": pod_body(
            "dnd", resources=one, annotations={translate.ANN_KARPENTER_DO_NOT_DISRUPT: "true"}
        ),
        "young": pod_body("young", resources=one, annotations={"kallot.io/min-runtime": "1h"}),
        "loading": pod_body("loading", resources=one, annotations={"kallot.io/model": "org/m"}),
        "last": pod_body("last", resources=one, annotations={"kallot.io/model": "org/n"}),
    }
    # 4 + 3 GPUs: one node (A), 1 GPU left on it.
    cluster.create_pods([*protected.values(), pod_body("filler", resources={GPU: "3"})])

    def bound(names: list[str]) -> dict[str, str]:
        serve(k, served, cluster.gpu_mem)
        pods = {p["metadata"]["name"]: p["spec"].get("nodeName", "") for p in cluster.pods()}
        out = {n: pods.get(n, "") for n in names}
        return out if all(out.values()) else {}

    first = wait_until(lambda: bound([*protected, "filler"]), timeout=240, what="A's pods bound")
    (a,) = set(first.values())
    assert karpenter_nodes(k) == [a]
    (claim_a,) = [c["metadata"]["name"] for c in k.get("nodeclaims")["items"]]
    _set_ready(cluster, "last", time.time() - 3600)  # Ready for an hour, the only replica
    uids = {n: cluster.pod(n)["metadata"]["uid"] for n in protected}

    # Two pods of 2 GPUs fit no node (A has 1 free): kallot asks for node B.
    apps = client.AppsV1Api(cluster.api)
    apps.create_namespaced_replica_set(
        cluster.ns, client.V1ReplicaSet.model_validate(replica_set("batch", {GPU: "2"}, replicas=2))
    )

    def batch_on() -> dict[str, str]:
        serve(k, served, cluster.gpu_mem)
        pods = [p for p in cluster.pods() if p["metadata"].get("labels", {}).get("app") == "batch"]
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        out = {p["metadata"]["uid"]: p["spec"].get("nodeName", "") for p in live}
        return out if len(out) == 2 and all(out.values()) else {}

    try:
        before = wait_until(batch_on, timeout=240, what="the ReplicaSet's pods bound on a node")
    except AssertionError:
        seen = [(p["metadata"]["name"], p["spec"].get("nodeName")) for p in cluster.pods()]
        print(seen, karpenter_nodes(k), [e.get("message") for e in cluster.events()][-20:])
        for p in cluster.pods():
            if p["metadata"]["name"].startswith("kallot-capacity"):
                print(json.dumps({"spec": p["spec"], "status": p["status"]})[:3000])
        full = k.log_path.read_text(errors="replace").splitlines()
        print("\n".join(ln for ln in full if "ERROR" in ln or "pod" in ln.lower())[-8000:])
        raise
    (b,) = set(before.values())
    assert b != a and karpenter_nodes(k) == sorted([a, b])
    # A holds kallot's pods: marked, so the placeholder asked Karpenter for B instead.
    assert k.get("node", a)["metadata"]["labels"].get(wire.LABEL_CAPACITY_TAKEN) == "true"

    # Room on A: kallot empties B, the replacements go to A, Karpenter removes B.
    cluster.delete_pod("filler")
    wait_until(lambda: karpenter_nodes(k) == [a], timeout=240, what="B emptied and removed")
    after = wait_until(batch_on, timeout=120, what="the replacements bound")
    assert not set(after) & set(before)  # new pods (the ReplicaSet's replacements)
    assert set(after.values()) == {a}  # where the move planned them, not back on B
    assert [c["status"].get("nodeName") for c in k.get("nodeclaims")["items"]] == [a]

    events = [e for e in cluster.events() if e.get("reason") == "Consolidation"]
    on_pods = [e for e in events if e["involvedObject"]["kind"] == "Pod"]
    assert sorted(e["involvedObject"]["uid"] for e in on_pods) == sorted(before), on_pods
    assert all(f"emptying node {b} frees 8 GPUs" in e["message"] for e in on_pods)
    pods = {p["metadata"]["name"]: p for p in cluster.pods()}
    for name, uid in uids.items():  # 0 protected evictions, by kallot or by Karpenter
        assert pods[name]["metadata"]["uid"] == uid, name
        assert not pods[name]["metadata"].get("deletionTimestamp"), name
        assert pods[name]["spec"]["nodeName"] == a, name
    assert sched.metric("kallot_evictions_total") == {'{action="consolidate"}': 2.0}
    log = sched.log_tail(2000)
    assert log.count("replacement nominated") == 2, log[-3000:]
    terminating = k.kubectl(
        "get", "events", "-A", "--field-selector=reason=DisruptionTerminating", "-o", "json"
    )
    names = {e["involvedObject"]["name"] for e in json.loads(terminating)["items"]}
    assert names and not names & {a, claim_a}, names  # B's went, never A's
    print(f"consolidation: {b} emptied (2 evictions, replacements on {a}), removed by Karpenter")
