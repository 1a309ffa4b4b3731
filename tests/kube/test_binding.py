"""The live scheduler binds real pods on a real kube-apiserver: where the core decides, with a
device record that never over-commits a GPU, through churn; bad pods get an Event naming the
field and stay pending while the others are scheduled.
"""

from __future__ import annotations

import json
import random
import time
from typing import Any

import numpy as np
import pytest
from kubernetes import client

from kallot.cli.scheduler import build_scheduler
from kallot.kube.state.cache import Cache
from kallot.testing.live import Cluster, gpu_usage, inventory_node_body, pod_body, wait_until

pytestmark = pytest.mark.controlplane

WHOLE_1 = {"nvidia.com/gpu": "1"}
WHOLE_2 = {"nvidia.com/gpu": "2"}
WHOLE_4 = {"nvidia.com/gpu": "4"}
SHARE_250 = {"kallot.io/gpu-milli": "250", "kallot.io/gpu-memory": "16Gi"}
SHARE_500 = {"kallot.io/gpu-milli": "500", "kallot.io/gpu-memory": "40Gi"}
MIX = [WHOLE_1, WHOLE_2, WHOLE_4, SHARE_250, SHARE_500]


def _bound(cluster: Cluster, names: set[str]) -> dict[str, dict]:  # type: ignore[type-arg]
    pods = {p["metadata"]["name"]: p for p in cluster.pods()}
    if all(pods.get(n, {}).get("spec", {}).get("nodeName") for n in names):
        return pods
    return {}


def test_pods_land_where_the_core_decides(cluster: Cluster) -> None:
    cluster.add_nodes([inventory_node_body(f"{cluster.run}-n{i}", 8) for i in range(4)])
    # 4 nodes x 8 GPUs; 6 x 1 + 4 x 2 + 2 x 4 whole = 22 GPUs, plus 10 shares: everything fits.
    kinds = [WHOLE_1] * 6 + [WHOLE_2] * 4 + [WHOLE_4] * 2 + [SHARE_250] * 6 + [SHARE_500] * 4
    cluster.create_pods([pod_body(f"p{i:02d}", resources=r) for i, r in enumerate(kinds)])

    # What the core decides for this cluster, computed here from the same API objects: the
    # scheduler's first session sees exactly these pods and nodes with the same seed.
    nodes = cluster.v1.list_node(label_selector=f"kallot.test/run={cluster.run}")
    offline = Cache()
    offline.replace_nodes([cluster.api.sanitize_for_serialization(n) for n in nodes.items])  # type: ignore[no-untyped-call]  # the kubernetes ApiClient is untyped here
    offline.replace_pods(cluster.pods())
    inp = offline.session_input(max_tasks=2000)
    _, core = build_scheduler("kallot")
    decision = core.run_session(
        inp.snapshot, list(inp.tasks), now=time.time(), rng=np.random.default_rng(0), jobs=inp.jobs
    )
    expected = {p.task_id: (p.node, sorted(d.uuid for d in p.devices)) for p in decision.placements}
    assert len(expected) == len(kinds)

    s = cluster.scheduler()
    pods = wait_until(
        lambda: s.check_alive() and _bound(cluster, {f"p{i:02d}" for i in range(len(kinds))}),
        timeout=30,
        what="all 22 pods bound",
    )
    cluster.assert_no_overcommit(list(pods.values()))
    got = {}
    usage_by_uid = {}
    for p in pods.values():
        rec = p["metadata"]["annotations"]["kallot.io/devices"]
        usage_by_uid[p["metadata"]["uid"]] = rec
        from kallot.config.device_record import DeviceRecord

        r = DeviceRecord.from_json(rec)
        got[p["metadata"]["uid"]] = (p["spec"]["nodeName"], sorted(d.uuid for d in r.devices))
        want = 1000 * int(
            p["spec"]["containers"][0]["resources"]["limits"].get("nvidia.com/gpu", 0)
        )
        if want:  # whole GPUs: as many exclusive devices as asked
            assert [d.milli for d in r.devices] == [1000] * (want // 1000)
            assert {d.mode for d in r.devices} == {"exclusive"}
    assert got == expected


def test_churn_of_500_pods_never_overcommits(cluster: Cluster) -> None:
    rng = random.Random(7)
    cluster.add_nodes([inventory_node_body(f"{cluster.run}-n{i}", 8) for i in range(8)])
    s = cluster.scheduler()
    s.wait_ready()
    created = 0
    live: list[str] = []
    ever_bound: set[str] = set()
    # 10 waves of 50 pods (whole, multi-GPU and shares) on 64 GPUs: the cluster fills, some
    # pods wait, and between waves a random third of the bound pods is deleted, which frees
    # GPUs for the waiting ones.
    for wave in range(10):
        bodies = [pod_body(f"c{created + i:03d}", resources=rng.choice(MIX)) for i in range(50)]
        created += 50
        cluster.create_pods(bodies)
        live += [b["metadata"]["name"] for b in bodies]
        pods = wait_until(
            lambda: s.check_alive() and (ps := cluster.pods()) and cluster.settled(ps) and ps,
            timeout=60,
            what=f"wave {wave} settled (each pod bound or pending with a reason)",
        )
        cluster.assert_no_overcommit(pods)
        bound = [p["metadata"]["name"] for p in pods if p["spec"].get("nodeName")]
        ever_bound.update(bound)
        for name in rng.sample(bound, len(bound) // 3):
            cluster.delete_pod(name)
            live.remove(name)
    pods = wait_until(
        lambda: (ps := cluster.pods()) and cluster.settled(ps) and ps,
        timeout=60,
        what="the cluster settled after the last deletions",
    )
    assert created == 500
    assert sorted(p["metadata"]["name"] for p in pods) == sorted(live)  # nothing lost
    # The cluster was really used: 64 GPUs hold about 40 pods of this mix at once, and the
    # deletions let the waiting ones in wave after wave.
    assert len(ever_bound) > 200, len(ever_bound)
    cluster.assert_no_overcommit(pods)

    # The scheduler's own accounting agrees with the records of the pods that are left:
    # nothing deleted during the churn still holds a GPU in its cache.
    def agree() -> bool:
        records = sum(gpu_usage(cluster.pods()).milli.values())
        return sum(s.metric("kallot_gpu_allocated_milli").values()) == records

    wait_until(agree, timeout=10, what="the allocation metric to equal the device records")


BAD = {
    # name: (resources, annotations, field the Event must name)
    "bad-annotation": (SHARE_250, {"kallot.io/sharing": "sometimes"}, "kallot.io/sharing"),
    "impossible-share": ({"kallot.io/gpu-milli": "1500"}, {}, "kallot.io/gpu-milli"),
    "unknown-mig": ({"nvidia.com/mig-9g.99gb": "1"}, {}, "nvidia.com/mig-9g.99gb"),
    "memory-without-share": ({"kallot.io/gpu-memory": "8Gi"}, {}, "kallot.io/gpu-memory"),
}


def test_bad_requests_get_an_event_and_stay_pending(cluster: Cluster) -> None:
    cluster.add_nodes([inventory_node_body(f"{cluster.run}-n0", 4)])
    s = cluster.scheduler()
    cluster.create_pods(
        [pod_body(n, resources=r, annotations=a) for n, (r, a, _) in BAD.items()]
        + [pod_body("good-whole", resources=WHOLE_1), pod_body("good-share", resources=SHARE_250)]
    )
    wait_until(
        lambda: s.check_alive() and _bound(cluster, {"good-whole", "good-share"}),
        timeout=30,
        what="the good pods bound next to the bad ones",
    )
    for name, (_, _, field) in BAD.items():

        def invalid(n: str = name) -> list[dict[str, Any]]:
            return [e for e in cluster.events(n) if e["reason"] == "InvalidRequest"]

        events = wait_until(
            invalid,
            timeout=15,
            what=f"an InvalidRequest event on {name}",
        )
        assert field in events[0]["message"], events[0]["message"]
        assert events[0]["type"] == "Warning"
        pod = cluster.pod(name)
        assert not pod["spec"].get("nodeName")
        cond = next(c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled")
        assert cond["status"] == "False" and field in cond["message"]
    # A fixed annotation is read again and the pod is scheduled; the scheduler never stopped.
    cluster.v1.patch_namespaced_pod(
        "bad-annotation", cluster.ns, {"metadata": {"annotations": {"kallot.io/sharing": "mps"}}}
    )
    wait_until(
        lambda: s.check_alive() and _bound(cluster, {"bad-annotation"}),
        timeout=30,
        what="the fixed pod bound",
    )
    cluster.assert_no_overcommit()


def test_unschedulable_pod_gets_the_diagnosis_in_plain_words(cluster: Cluster) -> None:
    cluster.add_nodes(
        [inventory_node_body(f"{cluster.run}-h{i}", 2) for i in range(2)]
        + [inventory_node_body(f"{cluster.run}-a0", 8, model="A100-40GB")]
    )
    s = cluster.scheduler()
    cluster.create_pods(
        [
            pod_body(
                "wants-h100x4", resources=WHOLE_4, annotations={"kallot.io/gpu-model": "H100-80GB"}
            )
        ]
    )
    pod = wait_until(
        lambda: s.check_alive() and cluster.settled(ps := cluster.pods()) and ps[0],
        timeout=30,
        what="a PodScheduled=False condition",
    )
    cond = next(c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled")
    # 3 nodes: the A100 node fails the model, the two 2-GPU H100 nodes the count.
    assert cond["reason"] == "Unschedulable"
    assert cond["message"].startswith("0/3 nodes are available"), cond["message"]
    assert "2 nodes" in cond["message"] and "1 node" in cond["message"], cond["message"]
    # The reporter PATCHes the condition first and creates the Event after it: wait for it.
    events = wait_until(
        lambda: (
            s.check_alive()
            and [e for e in cluster.events("wants-h100x4") if e["reason"] == "FailedScheduling"]
        ),
        timeout=15,
        what="the FailedScheduling Event",
    )
    assert events[0]["message"] == cond["message"]


def test_other_schedulers_pods_hold_their_gpus_and_mig_pods_get_their_instances(
    cluster: Cluster,
) -> None:
    # n-mig: GPU 0 split into two 3g.40gb instances (starts 0 and 4), GPU 1 whole.
    # n-full: 2 GPUs, both held by a pod another scheduler bound (no device record).
    cluster.add_nodes(
        [
            inventory_node_body(f"{cluster.run}-mig", 2, mig={0: [("3g.40gb", 0), ("3g.40gb", 4)]}),
            inventory_node_body(f"{cluster.run}-full", 2),
        ]
    )
    (foreign,) = cluster.create_pods(
        [pod_body("foreign", resources={"nvidia.com/gpu": "2"}, scheduler="default-scheduler")]
    )
    cluster.v1.create_namespaced_binding(
        cluster.ns,
        client.V1Binding.model_validate(
            {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": "foreign", "uid": foreign["metadata"]["uid"]},
                "target": {"apiVersion": "v1", "kind": "Node", "name": f"{cluster.run}-full"},
            }
        ),
        _preload_content=False,
    )
    s = cluster.scheduler()
    cluster.create_pods(
        [pod_body(f"mig{i}", resources={"nvidia.com/mig-3g.40gb": "1"}) for i in range(3)]
        + [pod_body("whole", resources={"nvidia.com/gpu": "2"})]
    )
    pods = wait_until(
        lambda: s.check_alive() and cluster.settled(ps := cluster.pods()) and ps,
        timeout=30,
        what="decisions for the MIG and whole-GPU pods",
    )
    by_name = {p["metadata"]["name"]: p for p in pods}
    # The shell hands the node's (static) MIG layout to the core and MigFit places MIG pods:
    # two of the three get the two 3g.40gb instances of GPU 0, one each; the third waits with
    # the core's reason.
    bound = [n for n in ("mig0", "mig1", "mig2") if by_name[n]["spec"].get("nodeName")]
    assert len(bound) == 2
    assert {by_name[n]["spec"]["nodeName"] for n in bound} == {f"{cluster.run}-mig"}
    records = [
        json.loads(by_name[n]["metadata"]["annotations"]["kallot.io/devices"]) for n in bound
    ]
    got = sorted(
        (d["index"], d["mig"]["profile"], d["mig"]["start"]) for r in records for d in r["devices"]
    )
    assert got == [(0, "3g.40gb", 0), (0, "3g.40gb", 4)]
    (waiting,) = {"mig0", "mig1", "mig2"} - set(bound)
    cond = next(c for c in by_name[waiting]["status"]["conditions"] if c["type"] == "PodScheduled")
    assert "no idle MIG instance 3g.40gb" in cond["message"]
    # 2 whole GPUs: the MIG node has one free whole GPU, the other node's two are held by the
    # foreign pod, so the pod waits until that pod goes.
    assert not by_name["whole"]["spec"].get("nodeName")
    cluster.delete_pod("foreign")
    wait_until(
        lambda: s.check_alive() and _bound(cluster, {"whole"}),
        timeout=30,
        what="the whole-GPU pod bound once the other scheduler's pod is gone",
    )
    assert cluster.pod("whole")["spec"]["nodeName"] == f"{cluster.run}-full"
    cluster.assert_no_overcommit()


def test_untrusted_share_is_bound_to_an_existing_mig_instance(cluster: Cluster) -> None:
    # One H100 node: GPU 0 split into two 3g.40gb instances (a static layout, as the live shell
    # reports it), GPU 1 in MPS. 30 GiB + 100 milli: the smallest H100 instance that holds it is a
    # 3g.40gb (40448 MiB; 1g/2g.20gb hold 20096). The untrusted share can only run on MIG; the
    # share that lists its modes without mig stays on the MPS GPU (a share without
    # kallot.io/sharing accepts MIG too, and the core would choose between the two).
    node = f"{cluster.run}-mixed"
    cluster.add_nodes([inventory_node_body(node, 2, mig={0: [("3g.40gb", 0), ("3g.40gb", 4)]})])
    s = cluster.scheduler()
    share = {"kallot.io/gpu-milli": "100", "kallot.io/gpu-memory": "30Gi"}
    cluster.create_pods(
        [
            pod_body("tenant", resources=share, annotations={"kallot.io/isolation": "untrusted"}),
            pod_body(
                "internal", resources=share, annotations={"kallot.io/sharing": "mps,time-slicing"}
            ),
        ]
    )
    pods = wait_until(
        lambda: s.check_alive() and _bound(cluster, {"tenant", "internal"}),
        timeout=30,
        what="the untrusted share on a MIG instance and the other on MPS",
    )
    rec = json.loads(pods["tenant"]["metadata"]["annotations"]["kallot.io/devices"])
    (dev,) = rec["devices"]
    assert pods["tenant"]["spec"]["nodeName"] == node
    assert dev["index"] == 0 and dev["mig"]["profile"] == "3g.40gb" and dev["mode"] == "mig"
    assert dev["mig"]["start"] in (0, 4)
    rec = json.loads(pods["internal"]["metadata"]["annotations"]["kallot.io/devices"])
    (dev,) = rec["devices"]
    assert dev["index"] == 1 and dev.get("mig") is None and dev["mode"] == "mps"
    cluster.assert_no_overcommit()


def test_bad_node_inventory_gets_an_event_and_no_pods(cluster: Cluster) -> None:
    bad = inventory_node_body(f"{cluster.run}-bad", 2)
    bad["metadata"]["annotations"]["kallot.io/gpu-inventory"] = '{"devices": [{"index": 0}]}'
    cluster.add_nodes([bad, inventory_node_body(f"{cluster.run}-ok", 1)])
    s = cluster.scheduler()
    cluster.create_pods([pod_body(f"p{i}", resources=WHOLE_1) for i in range(2)])
    wait_until(lambda: s.check_alive() and cluster.settled(), timeout=30, what="decisions")
    nodes = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in cluster.pods()}
    assert sorted(v or "" for v in nodes.values()) == ["", f"{cluster.run}-ok"]  # one fits, on ok

    def node_event() -> list[dict[str, Any]]:
        resp = cluster.v1.list_namespaced_event(
            "default",
            field_selector=f"involvedObject.name={cluster.run}-bad",
            _preload_content=False,
        )
        return [e for e in json.loads(resp.data)["items"] if e["reason"] == "InvalidGPUInventory"]  # type: ignore[attr-defined]  # _preload_content=False: the raw urllib3 response

    (event,) = wait_until(node_event, timeout=15, what="an InvalidGPUInventory event")
    assert "kallot.io/gpu-inventory" in event["message"] and "uuid" in event["message"]
