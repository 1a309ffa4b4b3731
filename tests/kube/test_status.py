"""Queue and PodGroup status as the leader computes it (kube.ops.status) from a cache fed the API's
objects: a parent Queue counts its children's GPUs and pending pods, guaranteed is the quota, a
Queue or PodGroup that does not validate says so; a gang is Pending until minAvailable members
are bound. (The writes themselves: tests/kube/test_queues_live.py on the real API server.)
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from kallot.cli.scheduler import build_scheduler
from kallot.config import device_record
from kallot.kube import translate
from kallot.kube.ops.status import pod_group_statuses, queue_statuses
from kallot.kube.state.cache import Cache
from kallot.testing.live import inventory_node_body, pod_body

_, CORE = build_scheduler("kallot")


def _queue(name: str, **spec: Any) -> dict[str, Any]:
    return {"kind": "Queue", "metadata": {"name": name}, "spec": spec}


def _group(name: str, min_available: int) -> dict[str, Any]:
    return {
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"minAvailable": min_available},
    }


def _pod(name: str, gpus: int, labels: dict[str, str]) -> dict[str, Any]:
    body = pod_body(name, resources={"nvidia.com/gpu": str(gpus)}, labels=labels)
    body["metadata"].update(uid=f"uid-{name}", namespace="ns", resourceVersion="1")
    body["spec"]["containers"][0]["resources"]["requests"] = dict(
        body["spec"]["containers"][0]["resources"]["limits"]
    )
    return body


def _schedule_and_bind(cache: Cache, pods: dict[str, dict[str, Any]]) -> None:
    """One session; every placement bound as the API would report it back."""
    inp = cache.session_input()
    decision = CORE.run_session(
        inp.snapshot, list(inp.tasks), now=0.0, rng=np.random.default_rng(0), jobs=inp.jobs
    )
    for p in decision.placements:
        entry = cache.assume(p)
        assert entry is not None
        body = copy.deepcopy(pods[entry.name])
        body["spec"]["nodeName"] = p.node
        record = translate.record_annotations(device_record.DeviceRecord.of(p), 0)
        body["metadata"]["annotations"].update(record)
        body["metadata"]["resourceVersion"] = "2"
        cache.apply_pod("MODIFIED", body)
    for u in decision.unschedulable:
        cache.park(u.task_id, u.diagnosis)


def test_statuses_roll_up_queues_and_report_gangs_and_invalid_objects() -> None:
    cache = Cache()
    cache.apply_node("ADDED", inventory_node_body("n0", 4))
    cache.replace_queues(
        [
            _queue("p", resources={"gpu": {"quota": 4}}),
            _queue("c", parent="p", resources={"gpu": {"quota": "1.5"}}),
            _queue("idle", resources={"gpu": {"quota": 1}}),
            _queue("broken", resources={"gpu": {"quota": "lots"}}),
        ]
    )
    assert "broken" in cache.queue_errors
    cache.replace_pod_groups([_group("pair", 2), _group("trio", 3), _group("bad", 0)])
    team = {"kallot.io/queue": "c"}
    pods = {
        "m0": _pod("m0", 1, {**team, "kallot.io/pod-group": "pair"}),
        "m1": _pod("m1", 1, {**team, "kallot.io/pod-group": "pair"}),
        "t0": _pod("t0", 1, {"kallot.io/pod-group": "trio"}),
        "big": _pod("big", 8, team),
    }
    for body in pods.values():
        cache.apply_pod("ADDED", copy.deepcopy(body))
    _schedule_and_bind(cache, pods)

    queues = queue_statuses(cache)
    assert queues["c"] == {
        "allocatedMilli": 2000,
        "allocated": "2",
        "pending": 1,
        "guaranteed": "1.5",
        "phase": "Active",
        "message": "",
    }
    assert queues["p"] == {**queues["c"], "guaranteed": "4"}
    assert queues["idle"] == {**queues["c"], "allocatedMilli": 0, "allocated": "0"} | {
        "pending": 0,
        "guaranteed": "1",
    }
    assert queues["broken"]["phase"] == "Invalid"
    assert "lots" in queues["broken"]["message"]

    groups = pod_group_statuses(cache)
    assert groups["ns/pair"] == {"phase": "Scheduled", "scheduled": 2, "pending": 0, "message": ""}
    trio = groups["ns/trio"]
    assert (trio["phase"], trio["scheduled"], trio["pending"]) == ("Pending", 0, 1)
    assert "trio" in trio["message"], trio
    assert groups["ns/bad"]["phase"] == "Failed"
    assert "minAvailable" in groups["ns/bad"]["message"]
