"""The live scheduler under failure: kill -9 during churn and restart, leader failover between
two replicas, pods and nodes deleted while binds are in flight, and a watch that falls out of
the server's window (410 Gone) and lists again.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
import urllib.request
from typing import Any

import pytest

from kallot.kube.api.client import KubeClient
from kallot.kube.state.cache import Cache
from kallot.kube.watch.reflector import Reflector
from kallot.testing.controlplane import ControlPlane
from kallot.testing.live import (
    Cluster,
    SchedulerProcess,
    gpu_usage,
    inventory_node_body,
    pod_body,
    wait_until,
)

pytestmark = pytest.mark.controlplane

MIX = [
    {"nvidia.com/gpu": "1"},
    {"nvidia.com/gpu": "2"},
    {"kallot.io/gpu-milli": "300", "kallot.io/gpu-memory": "20Gi"},
    {"kallot.io/gpu-milli": "500", "kallot.io/gpu-memory": "30Gi"},
]


def _settled(cluster: Cluster) -> list[dict[str, Any]]:
    pods = cluster.pods()
    return pods if cluster.settled(pods) else []


def test_kill_9_during_churn_then_restart_loses_nothing(cluster: Cluster) -> None:
    rng = random.Random(11)
    cluster.add_nodes([inventory_node_body(f"{cluster.run}-n{i}", 8) for i in range(10)])
    names = [f"k{i:03d}" for i in range(150)]
    kinds = [rng.choice(MIX) for _ in names]
    deleted: set[str] = set()

    def n_bound() -> int:
        return sum(1 for p in cluster.pods() if p["spec"].get("nodeName"))

    # Three lives: pods arrive one by one while the scheduler runs, and it is SIGKILLed (no
    # shutdown code runs) after a random number of new binds, with binds in flight and pods
    # still arriving; then some bound pods are deleted while no scheduler runs.
    for life in range(3):
        s = cluster.scheduler(f"life{life}")
        s.wait_ready()
        batch = list(zip(names, kinds, strict=True))[life * 50 : (life + 1) * 50]
        feeder = threading.Thread(
            target=lambda b=batch: [cluster.create_pods([pod_body(n, resources=k)]) for n, k in b]
        )
        target = n_bound() + rng.randint(5, 30)
        feeder.start()

        def reached(
            t: int = target, p: SchedulerProcess = s, f: threading.Thread = feeder
        ) -> object:
            p.check_alive()
            return n_bound() >= t or (not f.is_alive() and cluster.settled())  # the cluster is full

        wait_until(
            reached,
            timeout=30,
            what=f"{target} binds in life {life}",
            interval=0.02,
        )
        s.kill()
        feeder.join()
        bound = [p["metadata"]["name"] for p in cluster.pods() if p["spec"].get("nodeName")]
        for name in rng.sample(bound, 5):
            cluster.delete_pod(name)
            deleted.add(name)
        cluster.assert_no_overcommit()
    s = cluster.scheduler("final")
    s.wait_ready()

    def recovered() -> list[dict[str, Any]]:
        # Settled, and the restarted scheduler's accounting (rebuilt from the records on the
        # pods, nothing else survives a kill -9) equals those records.
        pods = _settled(cluster)
        records = sum(gpu_usage(pods).milli.values())
        ok = pods and sum(s.metric("kallot_gpu_allocated_milli").values()) == records
        return pods if ok else []

    pods = wait_until(
        lambda: s.check_alive() and recovered(),
        timeout=60,
        what="every pod bound or pending with a reason after the restarts",
    )
    assert sorted(p["metadata"]["name"] for p in pods) == sorted(set(names) - deleted)
    cluster.assert_no_overcommit(pods)


def _lease_holder(cluster: Cluster) -> str:
    from kubernetes import client

    try:
        lease = client.CoordinationV1Api(cluster.api).read_namespaced_lease(
            cluster.lease, "default"
        )
    except client.ApiException:
        return ""
    assert lease.spec is not None
    return str(lease.spec.holder_identity or "")


def test_two_replicas_leader_killed_hands_over_within_15s(cluster: Cluster) -> None:
    cluster.add_nodes([inventory_node_body(f"{cluster.run}-n{i}", 8) for i in range(2)])
    a = cluster.scheduler("a", leader_elect=True)
    wait_until(lambda: _lease_holder(cluster) == "a", timeout=20, what="a to lead")
    b = cluster.scheduler("b", leader_elect=True)
    b.wait_ready()
    cluster.create_pods([pod_body(f"x{i}", resources={"nvidia.com/gpu": "1"}) for i in range(4)])
    wait_until(
        lambda: all(p["spec"].get("nodeName") for p in cluster.pods()),
        timeout=20,
        what="the leader to bind the first pods",
    )
    assert b.metric("kallot_leader") == {"": 0.0}
    # The Scheduled Events are written after the binds, asynchronously: wait for them before
    # the kill, or a kill -9 between bind and Event loses the Event (not the bind).
    wait_until(
        lambda: (
            {e["involvedObject"]["name"] for e in cluster.events() if e["reason"] == "Scheduled"}
            >= {f"x{i}" for i in range(4)}
        ),
        timeout=20,
        what="the leader's Scheduled Events",
    )
    a.kill()
    killed = time.monotonic()
    cluster.create_pods([pod_body(f"y{i}", resources={"nvidia.com/gpu": "1"}) for i in range(4)])
    wait_until(
        lambda: b.check_alive() and all(p["spec"].get("nodeName") for p in cluster.pods()),
        timeout=20,
        what="b to take over and bind the new pods",
    )
    took = time.monotonic() - killed
    print(f"leader hand-over: {took:.1f}s")
    assert took < 15, f"hand-over took {took:.1f}s"
    assert _lease_holder(cluster) == "b"

    # No double bind: every pod was bound once, by the replica leading at the time. The
    # Scheduled Events follow the binds asynchronously: read them once b's are all there.
    def scheduled_by() -> dict[str, list[str]]:
        by: dict[str, list[str]] = {}
        for e in cluster.events():
            if e["reason"] == "Scheduled":
                by.setdefault(e["involvedObject"]["name"], []).append(e["reportingInstance"])
        return by

    wait_until(
        lambda: set(scheduled_by()) >= {f"y{i}" for i in range(4)},
        timeout=20,
        what="b's Scheduled Events",
    )
    by = scheduled_by()
    assert by == {**{f"x{i}": ["a"] for i in range(4)}, **{f"y{i}": ["b"] for i in range(4)}}
    cluster.assert_no_overcommit()


def test_pods_and_nodes_deleted_mid_bind_leak_nothing(cluster: Cluster) -> None:
    nodes = cluster.add_nodes([inventory_node_body(f"{cluster.run}-n{i}", 8) for i in range(6)])
    s = cluster.scheduler()
    s.wait_ready()
    rng = random.Random(3)
    names = [f"d{i:03d}" for i in range(120)]
    cluster.create_pods([pod_body(n, resources=rng.choice(MIX)) for n in names])
    # Delete right away: some of these are pending, some assumed with a bind in flight, some
    # bound. Two nodes go too.
    for name in names[::2]:
        cluster.delete_pod(name)
    for node in nodes[:2]:
        cluster.delete_node(node)
    gone = set(nodes[:2])

    def consistent() -> bool:
        pods = cluster.pods()
        if not cluster.settled(pods):
            return False
        live = [p for p in pods if p["spec"].get("nodeName") not in gone]
        want: dict[str, int] = {}
        for (node, _), milli in gpu_usage(live).milli.items():
            want[node] = want.get(node, 0) + milli
        got: dict[str, int] = {}
        for labels, value in s.metric("kallot_gpu_allocated_milli").items():
            node = labels.split('node="')[1].split('"')[0]
            got[node] = got.get(node, 0) + int(value)
        return want == got

    wait_until(
        lambda: s.check_alive() and consistent(),
        timeout=30,
        what="the scheduler's allocation per node to equal the records of the pods left",
    )
    pods = cluster.pods()
    assert sorted(p["metadata"]["name"] for p in pods) == names[1::2]
    cluster.assert_no_overcommit(pods)


def _compact_etcd(cp: ControlPlane) -> None:
    """Compact etcd up to its current revision (etcd's JSON gateway): older watch positions
    are gone for good, as after a long disconnect in a real cluster."""
    base = f"{cp.etcd_url}/v3"
    head = json.loads(urllib.request.urlopen(f"{base}/kv/range", data=b'{"key":"AA=="}').read())
    rev = int(head["header"]["revision"])
    req = urllib.request.Request(
        f"{base}/kv/compaction", data=json.dumps({"revision": rev}).encode(), method="POST"
    )
    urllib.request.urlopen(req).read()


async def test_watch_410_gone_lists_again(make_control_plane: Any) -> None:
    # Without the apiserver's watch cache a watch is served by etcd itself, so compacting
    # etcd makes the reflector's next watch position too old: the server answers 410.
    cp = make_control_plane(scheduler=False, apiserver_args=["--watch-cache=false"])
    client = await KubeClient.connect(cp.kubeconfig_path)
    cache = Cache()
    pods = Reflector(
        client,
        "/api/v1/pods",
        name="pods",
        on_replace=cache.replace_pods,
        on_event=cache.apply_pod,
        watch_timeout_s=1,
    )
    task = asyncio.create_task(pods.run())
    try:
        await asyncio.wait_for(pods.synced.wait(), 10)
        ns = "/api/v1/namespaces/default"
        await client.create(f"{ns}/pods", pod_body("before"))
        # Writes the reflector does not watch move etcd's revision past its position.
        for i in range(3):
            await client.create(f"{ns}/configmaps", {"metadata": {"name": f"bump{i}"}})
        await asyncio.to_thread(_compact_etcd, cp)

        async def until(cond: Any, what: str) -> None:
            deadline = time.monotonic() + 20
            while not cond():
                assert time.monotonic() < deadline, f"timed out waiting for {what}"
                await asyncio.sleep(0.05)

        await until(lambda: pods.gone >= 1, "a 410 Gone")
        # The reflector listed again and watches from the new list: later events arrive.
        await client.create(f"{ns}/pods", pod_body("after"))
        await until(lambda: cache.find("default", "after") is not None, "the pod after the 410")
        assert pods.lists >= 2
        assert {e.name for e in cache.pods()} == {"before", "after"}
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await client.close()
