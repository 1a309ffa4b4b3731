"""kube.state.steer: a replacement of an evicted pod is nominated where consolidation's move
planned it, once per eviction, only for the owner's pods, and not past its TTL."""

from __future__ import annotations

from typing import Any

from kallot.core.k8s import PodInfo
from kallot.core.workload import Task
from kallot.kube.state.steer import Steering


def _pod(owner: str) -> dict[str, Any]:
    refs = [{"kind": "ReplicaSet", "name": "rs", "uid": owner, "controller": True}]
    return {"metadata": {"ownerReferences": refs}}


def _task(uid: str) -> Task:
    return Task(id=uid, k8s=PodInfo())


def _nominated(t: Task) -> str:
    assert t.k8s is not None
    return t.k8s.nominated_node


def test_each_eviction_nominates_one_replacement_of_its_owner() -> None:
    now = [0.0]
    s = Steering(ttl_s=10, clock=lambda: now[0])
    s.expect("ns", "rs-1", "a")
    s.expect("ns", "rs-1", "b")
    assert _nominated(s.apply("p0", "ns", _pod("rs-2"), _task("p0"))) == ""  # another owner
    assert _nominated(s.apply("p0", "other", _pod("rs-1"), _task("p0"))) == ""  # namespace
    assert _nominated(s.apply("p1", "ns", _pod("rs-1"), _task("p1"))) == "a"
    assert _nominated(s.apply("p1", "ns", _pod("rs-1"), _task("p1"))) == "a"  # kept
    assert _nominated(s.apply("p2", "ns", _pod("rs-1"), _task("p2"))) == "b"
    assert _nominated(s.apply("p3", "ns", _pod("rs-1"), _task("p3"))) == ""  # none left
    s.forget("p1")
    assert _nominated(s.apply("p1", "ns", _pod("rs-1"), _task("p1"))) == ""
    assert s.steered == 2


def test_cancelled_and_expired_expectations_nominate_nothing() -> None:
    now = [0.0]
    s = Steering(ttl_s=10, clock=lambda: now[0])
    s.expect("ns", "rs", "a")
    s.cancel("ns", "rs", "a")
    assert _nominated(s.apply("p", "ns", _pod("rs"), _task("p"))) == ""
    s.expect("ns", "rs", "a")
    now[0] = 11.0
    assert _nominated(s.apply("p", "ns", _pod("rs"), _task("p"))) == ""
    s.expect("ns", "", "a")  # no owner: nothing to expect
    assert _nominated(s.apply("q", "ns", {"metadata": {}}, _task("q"))) == ""


def test_incoming_names_the_nodes_replacements_are_on_their_way_to() -> None:
    now = [0.0]
    s = Steering(ttl_s=10, clock=lambda: now[0])
    assert s.incoming() == set()
    s.expect("ns", "rs", "a")
    s.expect("ns", "rs", "b")
    assert s.incoming() == {"a", "b"}  # evicted, no new pod yet
    assert _nominated(s.apply("p", "ns", _pod("rs"), _task("p"))) == "a"
    assert s.incoming() == {"a", "b"}  # a's replacement is pending, b's not made yet
    s.forget("p")  # bound
    assert s.incoming() == {"b"}
    now[0] = 11.0
    assert s.incoming() == set()  # b's expectation expired
