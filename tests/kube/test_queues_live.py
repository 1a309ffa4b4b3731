"""Team queues in the live scheduler: Queue objects turn on the core's queue actions. A queue
never goes past its hard limit; a queue that lent its guarantee gets it back by eviction
(through the Eviction API, with a Preempted Event on the victim) and its pod is then bound on the
freed GPU; a Queue tree that does not validate is reported on the Queue and the previous tree
stays in force.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from kallot.testing.live import Cluster, inventory_node_body, pending_reason, pod_body, wait_until

pytestmark = pytest.mark.controlplane

CRDS = Path(__file__).resolve().parents[2] / "charts" / "kallot" / "crds"
GROUP, VERSION = "kallot.io", "v1alpha1"


@pytest.fixture
def queues(cluster: Cluster) -> Iterator[Any]:
    """Creates cluster-scoped Queues for one test and deletes them afterwards, so the next
    test's scheduler runs without queues."""
    cluster.install_crds([yaml.safe_load(p.read_text()) for p in sorted(CRDS.glob("*.yaml"))])
    api = client.CustomObjectsApi(cluster.api)
    made: list[str] = []

    def create(name: str, **spec: Any) -> str:
        api.create_cluster_custom_object(
            GROUP,
            VERSION,
            "queues",
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "Queue",
                "metadata": {"name": name},
                "spec": spec,
            },
        )
        made.append(name)
        return name

    def delete(name: str) -> None:
        api.delete_cluster_custom_object(GROUP, VERSION, "queues", name)
        made.remove(name)

    create.delete = delete  # type: ignore[attr-defined]
    try:
        yield create
    finally:
        for name in made:
            api.delete_cluster_custom_object(GROUP, VERSION, "queues", name)


def _team(cluster: Cluster, queue: str) -> dict[str, dict[str, Any]]:
    return {
        p["metadata"]["name"]: p
        for p in cluster.pods()
        if p["metadata"].get("labels", {}).get("kallot.io/queue") == queue
    }


def _bound(pods: dict[str, dict[str, Any]]) -> set[str]:
    return {n for n, p in pods.items() if p["spec"].get("nodeName")}


def test_limit_holds_and_a_lent_guarantee_is_reclaimed(cluster: Cluster, queues: Any) -> None:
    a = queues(f"{cluster.run}-a", resources={"gpu": {"quota": 2, "limit": 3}})
    b = queues(f"{cluster.run}-b", resources={"gpu": {"quota": 2}})
    cluster.add_nodes([inventory_node_body(f"{cluster.run}-n0", 4)])
    s = cluster.scheduler()
    gpu = {"nvidia.com/gpu": "1"}
    cluster.create_pods(
        [pod_body(f"a{i}", resources=gpu, labels={"kallot.io/queue": a}) for i in range(4)]
    )
    # 4 GPUs, team a asks 4: its limit of 3 stops the fourth even though a GPU is idle.
    team_a = wait_until(
        lambda: (
            s.check_alive()
            and (
                cluster.settled(list(t.values())) and t
                if len(_bound(t := _team(cluster, a))) == 3
                else None
            )
        ),
        timeout=30,
        what="three of team a's pods bound and the fourth decided",
    )
    (waiting,) = set(team_a) - _bound(team_a)
    assert f"queue {a}: hard limit on gpu" in pending_reason(team_a[waiting])

    # Team b is guaranteed 2 GPUs: one is idle, the other is lent to team a and comes back.
    cluster.create_pods(
        [pod_body(f"b{i}", resources=gpu, labels={"kallot.io/queue": b}) for i in range(2)]
    )
    team_b = wait_until(
        lambda: s.check_alive() and len(_bound(t := _team(cluster, b))) == 2 and t,
        timeout=60,
        what="both of team b's pods bound",
    )
    team_a = _team(cluster, a)
    assert len(_bound(team_a)) == 2, "team a keeps exactly its guarantee"
    evicted = {f"a{i}" for i in range(4)} - set(team_a)
    assert len(evicted) == 1, f"one of team a's pods evicted, got {evicted}"
    (victim,) = evicted
    assert victim != waiting, "the victim was running, not the pod the limit held back"
    events = wait_until(
        lambda: [e for e in cluster.events(victim) if e["reason"] == "Preempted"],
        timeout=30,
        what="a Preempted Event on the victim",
    )
    assert "reclaim" in events[0]["message"]
    assert cluster.pod(waiting)["spec"].get("nodeName") is None
    cluster.assert_no_overcommit(list(team_a.values()) + list(team_b.values()))
    assert s.metric("kallot_evictions_total") == {'{action="reclaim"}': 1.0}


def test_a_queue_tree_that_does_not_validate_is_reported_and_the_last_one_kept(
    cluster: Cluster, queues: Any
) -> None:
    a = queues(f"{cluster.run}-a", resources={"gpu": {"quota": 1, "limit": 1}})
    cluster.add_nodes([inventory_node_body(f"{cluster.run}-n0", 4)])
    s = cluster.scheduler()
    gpu = {"nvidia.com/gpu": "1"}
    team = {"kallot.io/queue": a}
    cluster.create_pods([pod_body(f"a{i}", resources=gpu, labels=team) for i in range(2)])
    pods = wait_until(
        lambda: s.check_alive() and cluster.settled(ps := cluster.pods()) and ps,
        timeout=30,
        what="team a's first pods decided",
    )
    assert len([p for p in pods if p["spec"].get("nodeName")]) == 1  # the tree is in force

    bad = queues(f"{cluster.run}-bad", parent=f"{cluster.run}-missing")
    core = client.CoreV1Api(cluster.api)

    def queue_events() -> list[dict[str, Any]]:
        resp = core.list_namespaced_event(
            "default",
            field_selector=f"involvedObject.kind=Queue,involvedObject.name={bad}",
            _preload_content=False,
        )
        return [e for e in json.loads(resp.data)["items"] if e["reason"] == "InvalidQueue"]  # type: ignore[attr-defined]  # _preload_content=False: the raw urllib3 response

    events = wait_until(queue_events, timeout=30, what="an InvalidQueue Event on the bad Queue")
    assert f"{cluster.run}-missing" in events[0]["message"]
    # Still the last good tree: without it the new pod would take one of the 3 idle GPUs.
    cluster.create_pods([pod_body("a2", resources=gpu, labels=team)])
    late = wait_until(
        lambda: s.check_alive() and cluster.settled([p := cluster.pod("a2")]) and p,
        timeout=30,
        what="the new pod decided",
    )
    assert late["spec"].get("nodeName") is None
    assert f"queue {a}: hard limit on gpu" in pending_reason(late)


def test_a_per_model_limit_holds(cluster: Cluster, queues: Any) -> None:
    # Team a may use any number of GPUs but at most one H100: with an H100 node and an L4 node
    # of 2 idle GPUs each, its two H100-only pods get one H100, and an unconstrained pod an L4.
    a = queues(f"{cluster.run}-a", resources={"models": {"H100-80GB": {"limit": 1}}})
    cluster.add_nodes(
        [
            inventory_node_body(f"{cluster.run}-h100", 2),
            inventory_node_body(f"{cluster.run}-l4", 2, model="L4"),
        ]
    )
    s = cluster.scheduler()
    team = {"kallot.io/queue": a}
    h100 = {"kallot.io/gpu-model": "H100-80GB"}
    gpu = {"nvidia.com/gpu": "1"}
    cluster.create_pods(
        [pod_body(f"h{i}", resources=gpu, labels=team, annotations=h100) for i in range(2)]
        + [pod_body("any", resources=gpu, labels=team)]
    )
    pods = wait_until(
        lambda: s.check_alive() and cluster.settled(ps := cluster.pods()) and ps,
        timeout=30,
        what="team a's pods decided",
    )
    nodes = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in pods}
    assert sorted(n for k, n in nodes.items() if k.startswith("h") and n) == [f"{cluster.run}-h100"]
    (held,) = [k for k, n in nodes.items() if k.startswith("h") and not n]
    assert f"queue {a}: hard limit on gpu/H100-80GB" in pending_reason(cluster.pod(held))
    assert nodes["any"] is not None


def test_queue_and_pod_group_status_are_written(cluster: Cluster, queues: Any) -> None:
    """The leader writes status: a Queue's allocated GPUs and pending pods include its children's,
    guaranteed is its quota; a PodGroup reports its bound and waiting members and its phase."""
    parent = queues(f"{cluster.run}-p", resources={"gpu": {"quota": 4}})
    child = queues(f"{cluster.run}-c", parent=parent, resources={"gpu": {"quota": "1.5"}})
    api = client.CustomObjectsApi(cluster.api)
    api.create_namespaced_custom_object(
        GROUP,
        VERSION,
        cluster.ns,
        "podgroups",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "PodGroup",
            "metadata": {"name": "pair"},
            "spec": {"minAvailable": 2, "queue": child},
        },
    )
    cluster.add_nodes([inventory_node_body(f"{cluster.run}-n0", 4)])
    s = cluster.scheduler()
    team = {"kallot.io/queue": child}
    pair = {**team, "kallot.io/pod-group": "pair"}
    cluster.create_pods(
        [pod_body(f"m{i}", resources={"nvidia.com/gpu": "1"}, labels=pair) for i in range(2)]
        + [pod_body("big", resources={"nvidia.com/gpu": "8"}, labels=team)]
    )

    def status(plural: str, name: str) -> dict[str, Any]:
        if plural == "queues":
            obj = api.get_cluster_custom_object(GROUP, VERSION, plural, name)
        else:
            obj = api.get_namespaced_custom_object(GROUP, VERSION, cluster.ns, plural, name)
        assert isinstance(obj, dict)  # the client annotates custom objects as object
        return dict(obj.get("status") or {})

    want_child = {
        "allocatedMilli": 2000,
        "allocated": "2",
        "pending": 1,
        "guaranteed": "1.5",
        "phase": "Active",
        "message": "",
    }
    want_parent = {**want_child, "guaranteed": "4"}
    # One round PATCHes the Queues one after another: read both until both are written.
    wait_until(
        lambda: (
            s.check_alive()
            and (status("queues", child), status("queues", parent)) == (want_child, want_parent)
        ),
        timeout=60,
        what=f"Queue {child} status {want_child} and Queue {parent} status {want_parent}",
    )
    group = wait_until(
        lambda: s.check_alive() and (g := status("podgroups", "pair")).get("scheduled") == 2 and g,
        timeout=60,
        what="PodGroup pair status with both members bound",
    )
    assert group == {"phase": "Scheduled", "scheduled": 2, "pending": 0, "message": ""}
    assert {p["metadata"]["name"] for p in cluster.pods() if p["spec"].get("nodeName")} == {
        "m0",
        "m1",
    }


def test_a_queue_refuses_other_namespaces_and_explain_says_why(
    cluster: Cluster, queues: Any
) -> None:
    """Queues belong to namespaces (docs/security.md): a pod of a namespace the Queue does not
    list takes nothing, pends with QueueAccess, and ``kallot explain`` says why; a pod of a
    listed namespace is bound."""
    mine = queues(f"{cluster.run}-mine", namespaces=[cluster.ns], resources={"gpu": {"quota": 1}})
    theirs = queues(
        f"{cluster.run}-theirs", namespaces=["someone-else"], resources={"gpu": {"quota": 4}}
    )
    cluster.add_nodes([inventory_node_body(f"{cluster.run}-n0", 4)])
    s = cluster.scheduler()
    gpu = {"nvidia.com/gpu": "1"}
    cluster.create_pods(
        [
            pod_body("own", resources=gpu, labels={"kallot.io/queue": mine}),
            pod_body("thief", resources=gpu, labels={"kallot.io/queue": theirs}),
        ]
    )
    pods = wait_until(
        lambda: (
            s.check_alive()
            and (p := {x["metadata"]["name"]: x for x in cluster.pods()})
            and p["own"]["spec"].get("nodeName")
            and "may not use Queue" in pending_reason(p["thief"])
            and p
        ),
        timeout=60,
        what="own bound and thief refused its queue",
    )
    assert not pods["thief"]["spec"].get("nodeName")
    expected = (
        f"namespace {cluster.ns} may not use Queue {theirs} (its spec.namespaces: someone-else)"
    )
    assert expected in pending_reason(pods["thief"])
    env = {**os.environ, "KUBECONFIG": str(cluster.cp.kubeconfig_path), "COLUMNS": "250"}
    out = subprocess.run(
        [sys.executable, "-m", "kallot.cli.main", "explain", "thief", "-n", cluster.ns],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert expected in " ".join(out.stdout.split())
