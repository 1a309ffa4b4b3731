"""Issue 16 on the real control plane: one bad pod never stops scheduling, freed capacity and
gang members are never forgotten, required topology holds under the default policy, and a
standby takes over at once after a clean shutdown.

Times are printed (``pytest -s``) and asserted with generous budgets: the machine running the
tests is shared. The issue's targets: good pod bound within 2 s next to a poison one; a gang
created PodGroup first, members 5 s apart, bound within 2 s of its last member; 8 deletes within
50 ms on a full cluster all reused within 5 s; failover after a clean shutdown within 2 s.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from kubernetes import client

from kallot.config import presets
from kallot.config.inventory import ANNOTATION as INVENTORY_ANNOTATION
from kallot.core import policies
from kallot.core.framework.runner import Framework
from kallot.core.scheduler import Scheduler
from kallot.kube import translate
from kallot.kube.api.client import KubeClient
from kallot.kube.app import Controller, ControllerConfig
from kallot.testing.live import Cluster, inventory_node_body, pending_reason, pod_body, wait_until

pytestmark = pytest.mark.controlplane

CRDS = Path(__file__).resolve().parents[2] / "charts" / "kallot" / "crds"


def _bound_at(cluster: Cluster, names: set[str]) -> dict[str, Any] | None:
    pods = {p["metadata"]["name"]: p for p in cluster.pods()}
    if all(pods.get(n, {}).get("spec", {}).get("nodeName") for n in names):
        return pods
    return None


def _with_islands(body: dict[str, Any], size: int) -> dict[str, Any]:
    """NVLink islands of ``size`` GPUs in the node's inventory annotation."""
    inv = json.loads(body["metadata"]["annotations"][INVENTORY_ANNOTATION])
    for d in inv["devices"]:
        d["island"] = d["index"] // size
    body["metadata"]["annotations"][INVENTORY_ANNOTATION] = json.dumps(inv)
    return body


def test_a_poison_share_pends_with_a_reason_while_a_good_pod_binds(cluster: Cluster) -> None:
    cluster.add_nodes(
        [
            inventory_node_body(f"{cluster.run}-h", 2),
            inventory_node_body(
                f"{cluster.run}-m", 1, model="A100-80GB", mig={0: [("1g.10gb", 0)]}
            ),
        ]
    )
    s = cluster.scheduler()
    s.wait_ready()
    poison = {"kallot.io/gpu-milli": "250", "kallot.io/gpu-memory": "500Gi"}
    cluster.create_pods([pod_body("poison", resources=poison)])
    wait_until(
        lambda: pending_reason(cluster.pod("poison")), timeout=30, what="the poison pod's reason"
    )
    created = time.monotonic()
    cluster.create_pods([pod_body("good", resources={"nvidia.com/gpu": "1"})])
    wait_until(lambda: _bound_at(cluster, {"good"}), timeout=30, what="the good pod", interval=0.05)
    took = time.monotonic() - created
    print(f"good pod bound {took:.2f}s after creation, next to the poison share")
    assert took < 10
    reason = pending_reason(cluster.pod("poison"))
    assert "nodes are available" in reason and "500 GiB" in reason, reason
    assert not cluster.pod("poison")["spec"].get("nodeName")
    assert s.metric("kallot_session_failures_total") == {"": 0.0}
    assert s.metric("kallot_task_faults_total") == {"": 0.0}
    assert s.get("/readyz")[0] == 200
    s.check_alive()
    cluster.assert_no_overcommit()


def test_a_gang_created_podgroup_first_binds_soon_after_its_last_member(
    cluster: Cluster,
) -> None:
    cluster.install_crds([yaml.safe_load(p.read_text()) for p in sorted(CRDS.glob("*.yaml"))])
    cluster.add_nodes([inventory_node_body(f"{cluster.run}-n{i}", 8) for i in range(4)])
    s = cluster.scheduler()
    s.wait_ready()
    for name, size in (("pair", 2), ("trio", 3)):
        cluster.create_pod_group(name, minAvailable=size)
    members = [("pair", 0, "2"), ("trio", 0, "1"), ("pair", 1, "2"), ("trio", 1, "1")]
    members.append(("trio", 2, "1"))
    last = 0.0
    for i, (group, j, gpus) in enumerate(members):
        if i:
            time.sleep(5.0)  # the scenario itself: members arrive 5 s apart
        labels = {translate.LABEL_POD_GROUP: group}
        body = pod_body(f"{group}-{j}", resources={"nvidia.com/gpu": gpus}, labels=labels)
        cluster.create_pods([body])
        last = time.monotonic()
        if i == 2:  # the pair is complete
            wait_until(
                lambda: _bound_at(cluster, {"pair-0", "pair-1"}),
                timeout=30,
                what="the pair",
                interval=0.05,
            )
            print(f"pair bound {time.monotonic() - last:.2f}s after its last member")
            assert time.monotonic() - last < 10
    wait_until(
        lambda: _bound_at(cluster, {"trio-0", "trio-1", "trio-2"}),
        timeout=30,
        what="the trio",
        interval=0.05,
    )
    took = time.monotonic() - last
    print(f"trio bound {took:.2f}s after its last member")
    assert took < 10
    cluster.assert_no_overcommit()


def test_eight_deletes_within_50ms_on_a_full_cluster_are_all_reused(cluster: Cluster) -> None:
    # 6 nodes x 8 GPUs full of 1-GPU pods, 300 more waiting: sessions over the waiting pods
    # take long enough that deletes land while one runs (the lost wake-up of issue 16)
    n_nodes, waiting = 6, 300
    full = n_nodes * 8
    cluster.add_nodes([inventory_node_body(f"{cluster.run}-n{i}", 8) for i in range(n_nodes)])
    s = cluster.scheduler()
    s.wait_ready()
    one = {"nvidia.com/gpu": "1"}
    first = {f"a{i}" for i in range(full)}
    cluster.create_pods([pod_body(name, resources=one) for name in sorted(first)])
    wait_until(lambda: _bound_at(cluster, first), timeout=120, what=f"{full} binds")
    cluster.create_pods([pod_body(f"w{i}", resources=one) for i in range(waiting)])
    wait_until(
        lambda: all(pending_reason(p) for p in cluster.pods() if p["metadata"]["name"][0] == "w"),
        timeout=120,
        what="the waiting pods to be parked",
    )
    gone = [f"a{i}" for i in range(8)]
    threads = [threading.Thread(target=cluster.delete_pod, args=(n,)) for n in gone]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    spread = time.monotonic() - start
    print(f"8 deletes issued within {spread * 1000:.0f} ms")

    def reused() -> bool:
        pods = cluster.pods()
        bound = [p["metadata"]["name"] for p in pods if p["spec"].get("nodeName")]
        return len(bound) == full and not set(gone) & set(bound)

    wait_until(reused, timeout=60, what="the 8 freed GPUs to be reused", interval=0.05)
    took = time.monotonic() - start
    print(f"8 freed GPUs reused {took:.2f}s after the deletes")
    assert took < 15
    cluster.assert_no_overcommit()


def test_required_nvlink_gang_never_lands_without_nvlink_under_the_default_policy(
    cluster: Cluster,
) -> None:
    cluster.install_crds([yaml.safe_load(p.read_text()) for p in sorted(CRDS.glob("*.yaml"))])
    # 'flat': 8 idle A100s without NVLink; 'nv': 8 H100s in two NVLink islands of 4
    cluster.add_nodes(
        [
            inventory_node_body(f"{cluster.run}-flat", 8, model="A100-80GB"),
            _with_islands(inventory_node_body(f"{cluster.run}-nv", 8), 4),
        ]
    )
    s = cluster.scheduler()  # --policy kallot, the default
    s.wait_ready()
    for name in ("g1", "g2"):
        cluster.create_pod_group(name, minAvailable=2)
    ann = {translate.ANN_TOPOLOGY: "required:nvlink"}
    four = {"nvidia.com/gpu": "4"}
    bodies = [
        pod_body(f"{g}-{i}", resources=four, annotations=ann, labels={"kallot.io/pod-group": g})
        for g in ("g1", "g2")
        for i in range(2)
    ]
    cluster.create_pods(bodies)
    # Both gangs are created in the same second: whichever the queue orders first takes both
    # islands; the other must then pend.
    first = wait_until(
        lambda: next((g for g in ("g1", "g2") if _bound_at(cluster, {f"{g}-0", f"{g}-1"})), None),
        timeout=30,
        what="one gang bound",
    )
    other = "g2" if first == "g1" else "g1"
    pods = {p["metadata"]["name"]: p for p in cluster.pods()}
    assert {pods[f"{first}-{i}"]["spec"]["nodeName"] for i in range(2)} == {f"{cluster.run}-nv"}
    records = {
        n: json.loads(pods[n]["metadata"]["annotations"][translate.ANN_DEVICES])
        for n in (f"{first}-0", f"{first}-1")
    }
    islands = [
        sorted(int(d["uuid"].rsplit("-", 1)[1]) // 4 for d in r["devices"])
        for r in records.values()
    ]
    assert sorted(islands) == [[0, 0, 0, 0], [1, 1, 1, 1]]

    # the other gang does not fit any NVLink island now: it pends, and never lands on the
    # flat node
    # Until the whole gang is seen a member may pend for another reason, and the members'
    # conditions are written independently: wait for the topology reason (or a bind).
    def decided() -> list[dict[str, Any]] | None:
        got = [cluster.pod(f"{other}-{i}") for i in range(2)]
        if any(p["spec"].get("nodeName") for p in got):
            return got
        if all("publishes no GPU topology" in pending_reason(p) for p in got):
            return got
        return None

    got = wait_until(lambda: s.check_alive() and decided(), timeout=30, what=f"{other}'s reason")
    assert not any(p["spec"].get("nodeName") for p in got)
    assert "publishes no GPU topology" in pending_reason(got[0])
    cluster.assert_no_overcommit()


def _holder(cluster: Cluster) -> str:
    coord = client.CoordinationV1Api(cluster.api)
    try:
        lease = coord.read_namespaced_lease(cluster.lease, "default")
    except client.ApiException:
        return ""
    assert lease.spec is not None
    return str(lease.spec.holder_identity or "")


def test_a_standby_takes_over_at_once_after_a_clean_shutdown(cluster: Cluster) -> None:
    cluster.add_nodes([inventory_node_body(f"{cluster.run}-n0", 8)])
    a = cluster.scheduler("a", leader_elect=True)
    wait_until(lambda: _holder(cluster) == "a", timeout=30, what="a to lead")
    b = cluster.scheduler("b", leader_elect=True)
    b.wait_ready()
    assert a.terminate() == 0
    stopped = time.monotonic()
    cluster.create_pods([pod_body("x", resources={"nvidia.com/gpu": "1"})])
    wait_until(
        lambda: b.check_alive() and _bound_at(cluster, {"x"}),
        timeout=30,
        what="b to take over and bind",
        interval=0.05,
    )
    took = time.monotonic() - stopped
    print(f"clean hand-over: bound by the standby {took:.2f}s after the leader exited")
    assert _holder(cluster) == "b"
    assert took < 8


def test_a_fresh_replica_replaces_a_long_dead_leader_at_once(cluster: Cluster) -> None:
    cluster.add_nodes([inventory_node_body(f"{cluster.run}-n0", 8)])
    a = cluster.scheduler("a", leader_elect=True)
    wait_until(lambda: _holder(cluster) == "a", timeout=30, what="a to lead")
    a.kill()
    # the Lease (10 s) expires by any clock while no replica runs
    coord = client.CoordinationV1Api(cluster.api)

    def expired() -> bool:
        lease = coord.read_namespaced_lease(cluster.lease, "default")
        spec = lease.spec
        assert spec is not None
        assert spec.renew_time is not None and spec.lease_duration_seconds is not None
        age = time.time() - spec.renew_time.timestamp()
        return age > spec.lease_duration_seconds + 2.0 + 0.5

    wait_until(expired, timeout=30, what="the dead leader's Lease to expire")
    started = time.monotonic()
    b = cluster.scheduler("b", leader_elect=True)
    wait_until(lambda: b.check_alive() and _holder(cluster) == "b", timeout=30, what="b to lead")
    took = time.monotonic() - started
    print(f"fresh replica took over a dead leader's Lease {took:.2f}s after it started")
    assert took < 8  # it does not wait out a full lease duration from its first look


# -- a plugin that raises, in the live controller ---------------------------------------------


class _Faulty:
    """A filter that raises for pods labelled ``poison`` (a label, not the uid: the scheduler may
    see the pod before the API's answer to its create reaches the test)."""

    name = "Faulty"

    def filter(self, cycle: Any, task: Any) -> Any:
        if task.k8s is not None and task.k8s.labels.get("poison") == "1":
            raise ZeroDivisionError("plugin bug")
        return np.ones(cycle.snapshot.n_nodes, dtype=np.bool_)

    def explain(self, cycle: Any, task: Any, rejected: Any) -> tuple[Any, ...]:
        return ()


async def test_a_plugin_fault_costs_one_pod_an_event_and_backoff(cluster: Cluster) -> None:
    await asyncio.to_thread(cluster.add_nodes, [inventory_node_body(f"{cluster.run}-n0", 4)])
    registry = policies.builtin_registry()
    registry.register("Faulty", lambda args: _Faulty())
    base = presets.PROFILES["kallot"]
    profile = dataclasses.replace(base, name="faulty", filter=(*base.filter, "Faulty"))
    scheduler = Scheduler(Framework(profile, registry))
    kc = await KubeClient.connect(cluster.cp.kubeconfig_path)
    config = ControllerConfig(
        identity="in-process", leader_elect=False, metrics_port=0, watch_crds=False
    )
    controller = Controller(kc, scheduler, config)
    run = asyncio.create_task(controller.run())
    try:
        await asyncio.to_thread(
            cluster.create_pods,
            [
                pod_body("poison-0", resources={"nvidia.com/gpu": "1"}, labels={"poison": "1"}),
                pod_body("good-0", resources={"nvidia.com/gpu": "1"}),
            ],
        )

        async def until(predicate: Any, what: str, timeout: float = 30.0) -> Any:
            deadline = time.monotonic() + timeout
            while True:
                value = await asyncio.to_thread(predicate)
                if value:
                    return value
                assert not run.done(), run
                assert time.monotonic() < deadline, f"timed out waiting for {what}"
                await asyncio.sleep(0.1)

        await until(lambda: _bound_at(cluster, {"good-0"}), "the good pod")
        reason = await until(lambda: pending_reason(cluster.pod("poison-0")), "the poison's reason")
        assert "kallot fault while placing this pod: plugin Faulty raised ZeroDivisionError" in (
            reason
        )
        # The Event is created after the condition is PATCHed (kube.ops.reporter): wait for it.
        events = await until(
            lambda: [e for e in cluster.events("poison-0") if e["reason"] == "FailedScheduling"],
            "the poison's FailedScheduling Event",
        )
        assert any("plugin Faulty" in e["message"] for e in events), events
        entry = controller.cache.find(cluster.ns, "poison-0")
        assert entry is not None and entry.reason_kind == "SchedulerError"
        assert entry.faults >= 1 and entry.backoff_until > 0
        assert controller.metrics.task_faults._value.get() >= 1
        assert controller.ready()

        # sessions that raise (not a pod's fault): counted, and /readyz says so after 3
        real = controller.cache.session_input

        def broken(**kwargs: Any) -> Any:
            raise RuntimeError("cache bug")

        controller.cache.session_input = broken  # type: ignore[method-assign]
        await until(lambda: controller.failed_sessions >= 3, "3 failed sessions", timeout=60)
        assert not controller.ready()
        assert controller.metrics.session_failures._value.get() >= 3
        controller.cache.session_input = real  # type: ignore[method-assign]
        await until(lambda: controller.failed_sessions == 0, "a session to succeed", timeout=60)
        assert controller.ready()
    finally:
        controller.stop()
        await asyncio.wait_for(run, 30)
        await kc.close()
