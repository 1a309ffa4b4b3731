"""Consolidation end to end (kube.autoscale.consolidate) on the real control plane, ``kallot
scheduler`` as a subprocess with ``autoscale.consolidation`` on: node ``a`` holds only pods that
must not move (do-not-disrupt, inside min-runtime, covered by a PodDisruptionBudget, a model
server still loading), node ``w`` only a pod no controller owns (the emptiest node: an eviction
would delete it for good), node ``z`` one pod that may move, node ``y`` is empty. ``a`` uses less
GPU than ``z``, so each round considers it first and must refuse it; then it empties ``z``: one
eviction through the Eviction API, with an Event naming the reason and the GPUs it frees. The
protected pods are never evicted (0 protected evictions, counted from the Events and the pods).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from kubernetes import client

from kallot.kube import translate
from kallot.testing.autoscale import config_file, consolidation, replica_set
from kallot.testing.controlplane import controlplane_bin_dir
from kallot.testing.live import Cluster, inventory_node_body, pod_body, wait_until

pytestmark = pytest.mark.controlplane

POOL = "kallot.io/test-pool"


def _cordon(cluster: Cluster, node: str, on: bool) -> None:
    cluster.v1.patch_node(node, {"spec": {"unschedulable": on}})


def test_consolidation_evicts_only_what_may_move(cluster: Cluster, tmp_path: Path) -> None:
    run = cluster.run
    a, w, y, z = f"a-{run}", f"w-{run}", f"y-{run}", f"z-{run}"
    labels = {POOL: run}
    cluster.add_nodes([inventory_node_body(n, 8, labels=labels) for n in (a, w, y, z)])
    for n in (w, y, z):
        _cordon(cluster, n, True)
    sel = {"nodeSelector": labels}
    share = {"kallot.io/gpu-milli": "100"}
    protected = {
        "dnd": pod_body(
            "dnd", resources=share, annotations={translate.ANN_KARPENTER_DO_NOT_DISRUPT: "true"}
        ),
        "young": pod_body("young", resources=share, annotations={"kallot.io/min-runtime": "1h"}),
        "budgeted": pod_body("budgeted", resources=share, labels={"app": "budgeted"}),
        "loading": pod_body("loading", resources=share, annotations={"kallot.io/model": "org/m"}),
    }
    # Every pod but the orphan has a controller (a ReplicaSet of 0 replicas: nothing here makes
    # pods from it), so only the orphan is protected for having none.
    owner = client.AppsV1Api(cluster.api).create_namespaced_replica_set(
        cluster.ns,
        client.V1ReplicaSet.model_validate(replica_set("owner", share, replicas=0)),
    )
    assert owner.metadata is not None
    owned = [
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "name": "owner",
            "uid": owner.metadata.uid,
            "controller": True,
        }
    ]
    for body in protected.values():
        body["spec"].update(sel)
        body["metadata"]["ownerReferences"] = owned
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "budgeted", "namespace": cluster.ns},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "budgeted"}}},
    }
    kubectl = str(controlplane_bin_dir() / "kubectl")
    subprocess.run(
        [kubectl, "--kubeconfig", str(cluster.cp.kubeconfig_path), "apply", "-f", "-"],
        input=json.dumps(pdb),
        text=True,
        check=True,
        capture_output=True,
    )
    conf = config_file(tmp_path / "c.yaml", consolidate=consolidation(gain=1))
    sched = cluster.scheduler(extra=[f"--config={conf}"])
    sched.wait_ready(60)
    cluster.create_pods(list(protected.values()))

    def nodes_of(names: list[str]) -> dict[str, str]:
        pods = {p["metadata"]["name"]: p["spec"].get("nodeName", "") for p in cluster.pods()}
        out = {n: pods.get(n, "") for n in names}
        return out if all(out.values()) else {}

    on = wait_until(lambda: nodes_of(list(protected)), timeout=60, what="the protected pods bound")
    assert set(on.values()) == {a}
    # Alone on w, the emptiest node: a pod no controller owns, which an eviction would delete.
    _cordon(cluster, a, True)
    _cordon(cluster, w, False)
    orphan = pod_body("orphan", resources=share)
    orphan["spec"].update(sel)
    cluster.create_pods([orphan])
    assert wait_until(lambda: nodes_of(["orphan"]), timeout=60, what="the orphan bound") == {
        "orphan": w
    }
    _cordon(cluster, w, True)
    # The pod that may move: 600m on z (a cordoned meanwhile), more than a's 500m in use.
    _cordon(cluster, z, False)
    mover = pod_body("mover", resources={"kallot.io/gpu-milli": "600"})
    mover["spec"].update(sel)
    mover["metadata"]["ownerReferences"] = owned
    cluster.create_pods([mover])
    assert wait_until(lambda: nodes_of(["mover"]), timeout=60, what="the mover bound") == {
        "mover": z
    }
    for n in (a, w, y):  # room for the mover: z is worth emptying; a and w are not allowed
        _cordon(cluster, n, False)

    def mover_gone() -> bool:
        return all(p["metadata"]["name"] != "mover" for p in cluster.pods())

    wait_until(mover_gone, timeout=60, what="consolidation to evict the mover")
    events = [e for e in cluster.events() if e.get("reason") == "Consolidation"]
    on_pods = [e for e in events if e["involvedObject"]["kind"] == "Pod"]
    assert [e["involvedObject"]["name"] for e in on_pods] == ["mover"], on_pods
    assert f"emptying node {z} frees 8 GPUs" in on_pods[0]["message"]
    pods = {p["metadata"]["name"]: p for p in cluster.pods()}
    for name in protected:  # 0 protected evictions
        assert name in pods and not pods[name]["metadata"].get("deletionTimestamp"), name
        assert pods[name]["spec"]["nodeName"] == a
    assert "orphan" in pods and not pods["orphan"]["metadata"].get("deletionTimestamp")
    assert sched.metric("kallot_evictions_total") == {'{action="consolidate"}': 1.0}
