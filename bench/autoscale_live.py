"""Live autoscaling on a small KWOK fleet: ``kallot scheduler`` (subprocess) with Karpenter
scale-up and consolidation on, Karpenter v1.15.0's KWOK provider, kube-scheduler and the
ReplicaSet controller, all real (kallot.testing.karpenter_fleet), against the packing optimum
of the pending work and an integer-counting autoscaler's, in the same run.

    .venv/bin/python bench/autoscale_live.py [--runs 1]

Scale-up: the fleet starts with no node; at once a do-not-disrupt model server of 500 milli
(a bare pod) and three ReplicaSets are created: 12 shares of 500 milli, two 4-GPU pods, one
8-GPU pod (a ReplicaSet's pod that consolidation evicts comes back; a bare pod would not). Measured: the
NodeClaims Karpenter made for kallot's placeholders against ``sim.autoscale.optimum_nodes`` of
the pending work (the packing LP's fewest GPUs over 8 a node) and against the same optimum for
the pods counted as whole GPUs (what an integer-counting autoscaler needs at best), and the
time from the work created to each pod bound (the bind time kallot writes on the pod).

Consolidation: then the work shrinks (the ReplicaSets scale to 4 shares, no 8-GPU pod and one
4-GPU pod; the shares that end are those that leave whole GPUs free, chosen with
``controller.kubernetes.io/pod-deletion-cost``): kallot empties the node of the remaining 4-GPU pod (its replacement goes where the shares
are), Karpenter removes the empty nodes (``WhenEmpty``). Measured: nodes left against the
optimum of the work left, kallot's evictions, protected evictions (the model server's pod
replaced or deleted, or Karpenter disrupting its node: must be 0), and the time to settle.

Nothing plays the kubelet: the bench reports each node Ready and publishes its inventory
(``karpenter_fleet.serve``). Machine: whatever runs it; the numbers in BENCHMARKS.md say which.
"""

from __future__ import annotations

import argparse
import calendar
import json
import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from kubernetes import client

from kallot.config import wire
from kallot.config.autoscale import node_shapes_from_nodepool
from kallot.core.workload import DeviceRequest, Task
from kallot.kube.autoscale import provision
from kallot.sim import autoscale
from kallot.testing.autoscale import config_file, consolidation, replica_set
from kallot.testing.controllers import ControllerManager
from kallot.testing.karpenter import Karpenter
from kallot.testing.karpenter_fleet import (
    CATALOGUE,
    SHAPE,
    fleet_cluster,
    karpenter_fleet,
    karpenter_nodes,
    nodepool,
    serve,
)
from kallot.testing.live import (
    Cluster,
    gpu_usage,
    overcommitted,
    pending_reason,
    pod_body,
    wait_until,
)

GPU = "nvidia.com/gpu"
MILLI = "kallot.io/gpu-milli"
SHARES, SHARE_MILLI, BATCH, BATCH_GPUS, WHOLE_GPUS = 12, 500, 2, 4, 8
SHARES_LEFT = 4
MOVE = re.compile(
    r"(\S+ [0-9:]+),\d+ INFO kallot.kube.autoscale.consolidate consolidate .* pods=(\d+)"
)
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"  # which pods a scale-down removes


def _tasks(shares: int, batch: int, whole: bool) -> list[Task]:
    """The pending work as the core sees it (shares + the model server, batch, whole)."""
    out = [
        Task(id=f"s{i}", gpu=DeviceRequest(count=1, milli=SHARE_MILLI)) for i in range(shares + 1)
    ]
    out += [Task(id=f"b{i}", gpu=DeviceRequest(count=BATCH_GPUS)) for i in range(batch)]
    if whole:
        out.append(Task(id="w", gpu=DeviceRequest(count=WHOLE_GPUS)))
    return out


def _bind_s(pod: dict[str, Any], t0: float) -> float | None:
    ns = (pod["metadata"].get("annotations") or {}).get(wire.ANN_BIND_TIME)
    return int(ns) / 1e9 - t0 if ns and pod["spec"].get("nodeName") else None


def _ending_shares(cluster: Cluster) -> list[str]:
    """The shares that end: those kept are the model server's GPU-mates, then the fullest
    GPUs' (work that ends leaves whole GPUs free, as finished jobs on a packed GPU do)."""
    holders = gpu_usage(cluster.pods()).holders
    server = f"{cluster.ns}/server"  # pod keys are namespace/name
    order = sorted(holders.values(), key=lambda h: (server not in h, -len(h)))
    names = [k.split("/", 1)[1] for h in order for k in h]
    shares = [n for n in dict.fromkeys(names) if n.startswith("shares-")]
    return shares[SHARES_LEFT:]


def one_run(k: Karpenter, log_dir: Path) -> dict[str, Any]:
    (shape,) = node_shapes_from_nodepool(nodepool(), CATALOGUE)
    served: set[str] = set()
    with (
        ControllerManager(k.cp, controllers=("replicaset",)),
        fleet_cluster(k, log_dir, "WhenEmpty", "5s") as cluster,
    ):
        apps = client.AppsV1Api(cluster.api)
        try:
            return _measure(k, cluster, apps, shape, served)
        finally:
            apps.delete_collection_namespaced_replica_set(cluster.ns)


def _measure(
    k: Karpenter, cluster: Cluster, apps: client.AppsV1Api, shape: Any, served: set[str]
) -> dict[str, Any]:
    conf = config_file(
        cluster.log_dir / "c.yaml",
        provisioner="karpenter",
        namespace=cluster.ns,
        shapes=[SHAPE],
        consolidate=consolidation(gain=WHOLE_GPUS),
    )
    sched = cluster.scheduler(extra=[f"--config={conf}"])
    sched.wait_ready(60)
    share = {MILLI: str(SHARE_MILLI)}
    server = pod_body(
        "server",
        resources=share,
        annotations={wire.ANN_KARPENTER_DO_NOT_DISRUPT: "true", wire.ANN_MODEL: "org/m"},
    )
    # Everything but the model server is a ReplicaSet's: a pod consolidation evicts comes back.
    sets = [
        replica_set("shares", share, replicas=SHARES),
        replica_set("whole", {GPU: str(WHOLE_GPUS)}),
        replica_set("batch", {GPU: str(BATCH_GPUS)}, replicas=BATCH),
    ]
    t0 = time.time()
    cluster.create_pods([server])
    for rs in sets:
        apps.create_namespaced_replica_set(cluster.ns, client.V1ReplicaSet.model_validate(rs))

    def live() -> list[dict[str, Any]]:
        return [
            p
            for p in cluster.pods()
            if not p["metadata"].get("deletionTimestamp")
            and not p["metadata"]["name"].startswith("kallot-capacity")
        ]

    def all_bound(n: int) -> list[dict[str, Any]]:
        serve(k, served, cluster.gpu_mem)
        pods = live()
        return pods if len(pods) == n and all(p["spec"].get("nodeName") for p in pods) else []

    try:
        pods = wait_until(
            lambda: all_bound(SHARES + 2 + BATCH), timeout=300, what="every pod bound"
        )
    except AssertionError:
        for p in cluster.pods():  # what is left pending, and why
            print(p["metadata"]["name"], p["spec"].get("nodeName"), pending_reason(p))
        print(karpenter_nodes(k), len(k.get("nodeclaims")["items"]), sched.log_tail(60))
        raise
    waits = sorted(w for p in pods if (w := _bind_s(p, t0)) is not None)
    claims = len(k.get("nodeclaims")["items"])
    nodes_up = karpenter_nodes(k)
    assert not overcommitted(gpu_usage(cluster.pods()), cluster.gpu_mem)
    work = _tasks(SHARES, BATCH, True)
    opt = autoscale.optimum_nodes(work, shape)
    integer = autoscale.optimum_nodes([autoscale.as_integer(t) for t in work], shape)
    server_uid = cluster.pod("server")["metadata"]["uid"]
    server_node = cluster.pod("server")["spec"]["nodeName"]

    # The work shrinks: consolidation's turn.
    t1 = time.time()
    for name in _ending_shares(cluster):  # the ReplicaSet removes these first
        cluster.v1.patch_namespaced_pod(
            name, cluster.ns, {"metadata": {"annotations": {DELETION_COST: "-100"}}}
        )
    for name, n in (("shares", SHARES_LEFT), ("whole", 0), ("batch", 1)):
        apps.patch_namespaced_replica_set(name, cluster.ns, {"spec": {"replicas": n}})
    left = _tasks(SHARES_LEFT, 1, False)
    opt_left = autoscale.optimum_nodes(left, shape)

    def settled() -> list[str]:
        serve(k, served, cluster.gpu_mem)
        nodes = karpenter_nodes(k)
        pods = live()
        bound = len(pods) == SHARES_LEFT + 2 and all(p["spec"].get("nodeName") for p in pods)
        return nodes if bound and len(nodes) <= opt_left else []

    try:
        nodes_left = wait_until(settled, timeout=300, what="the fleet consolidated")
    except AssertionError:
        nodes_left = karpenter_nodes(k)
    settle_s = time.time() - t1
    evictions = sum(sched.metric("kallot_evictions_total").values())
    # Which phase each eviction fell in: the time of the scheduler's log line of its move.
    evictions_up = 0
    for line in sched.log_path.read_text(errors="replace").splitlines():
        m = MOVE.match(line)
        if m and calendar.timegm(time.strptime(m[1], "%Y-%m-%d %H:%M:%S")) < t1:
            evictions_up += int(m[2])
    now = {p["metadata"]["name"]: p for p in cluster.pods()}.get("server")
    protected = int(
        now is None
        or now["metadata"]["uid"] != server_uid
        or bool(now["metadata"].get("deletionTimestamp"))
    )
    terminating = k.kubectl(
        "get", "events", "-A", "--field-selector=reason=DisruptionTerminating", "-o", "json"
    )
    disrupted = {e["involvedObject"]["name"] for e in json.loads(terminating)["items"]}
    protected += int(server_node in disrupted)
    return {
        "claims": claims,
        "nodes_up": len(nodes_up),
        "optimum": opt,
        "integer": integer,
        "wait_p50": statistics.median(waits),
        "wait_max": waits[-1],
        "nodes_left": len(nodes_left),
        "optimum_left": opt_left,
        "evictions_up": evictions_up,
        "evictions": evictions,
        "protected": protected,
        "settle_s": settle_s,
        "placeholders_left": len(
            [
                p
                for p in cluster.pods()
                if provision.PLACEHOLDER_LABEL in p["metadata"].get("labels", {})
            ]
        ),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1)
    args = ap.parse_args()
    results = []
    logs = Path(tempfile.mkdtemp(prefix="kallot-autoscale-live-"))
    print(f"logs: {logs}", flush=True)
    with karpenter_fleet() as k:
        for r in range(args.runs):
            d = logs / f"run{r}"
            d.mkdir()
            results.append(one_run(k, d))
            print(json.dumps(results[-1]), flush=True)
    print()
    print(
        "run  NodeClaims  optimum  ratio  integer  ratio  bound p50/max s  "
        "evictions (scale-up)  nodes left  optimum  protected  settle s"
    )
    for i, m in enumerate(results):
        print(
            f"{i:3d}  {m['claims']:10d}  {m['optimum']:7d}  {m['claims'] / m['optimum']:5.2f}  "
            f"{m['integer']:7d}  {m['claims'] / m['integer']:5.2f}  "
            f"{m['wait_p50']:5.1f} / {m['wait_max']:5.1f}  "
            f"{m['evictions']:9.0f} ({m['evictions_up']:.0f})  "
            f"{m['nodes_left']:10d}  {m['optimum_left']:7d}  "
            f"{m['protected']:9d}  {m['settle_s']:8.1f}"
        )


if __name__ == "__main__":
    main()
