"""Queues belong to namespaces: a Queue's ``spec.namespaces`` says whose pods may submit to it.

The attack (issue 34): Queues are cluster-scoped and a pod's ``kallot.io/queue`` label is the
tenant's own word, so a team-b pod labelled ``team-a`` used to consume team-a's guarantee. Now
such a pod takes nothing and pends with a reason naming the queue and its namespaces; a
Queue without ``spec.namespaces`` is open to every namespace, as before.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kallot.core.errors import ConfigError
from kallot.kube import owners, translate
from kallot.kube.state.cache import QUEUE_ACCESS, Cache
from kallot.testing.live import inventory_node_body, pod_body


def _queue(name: str, **spec: Any) -> dict[str, Any]:
    return {"kind": "Queue", "metadata": {"name": name}, "spec": spec}


def _pod(name: str, namespace: str, queue: str) -> dict[str, Any]:
    body = pod_body(name, resources={"nvidia.com/gpu": "1"}, labels={"kallot.io/queue": queue})
    body["metadata"].update(uid=f"uid-{name}", namespace=namespace, resourceVersion="1")
    return body


def _cache() -> Cache:
    cache = Cache()
    cache.apply_node("ADDED", inventory_node_body("n0", 4))
    cache.replace_queues(
        [
            _queue(
                "team-a", namespaces=["team-a", "team-a-batch"], resources={"gpu": {"quota": 2}}
            ),
            _queue("open", resources={"gpu": {"quota": 1}}),
            _queue("closed", namespaces=[], resources={"gpu": {"quota": 1}}),
        ]
    )
    assert not cache.queue_errors
    return cache


def test_a_pod_may_not_submit_to_another_namespaces_queue() -> None:
    cache = _cache()
    for body in (
        _pod("own", "team-a", "team-a"),
        _pod("batch", "team-a-batch", "team-a"),
        _pod("thief", "team-b", "team-a"),
        _pod("anyone", "team-b", "open"),
        _pod("nobody", "team-a", "closed"),
    ):
        cache.apply_pod("ADDED", copy.deepcopy(body))
    inp = cache.session_input()
    assert {t.id for t in inp.tasks} == {"uid-own", "uid-batch", "uid-anyone"}
    thief = inp.waiting["uid-thief"]
    assert thief.reasons[0].plugin == QUEUE_ACCESS
    assert thief.message() == (
        "namespace team-b may not use Queue team-a (its spec.namespaces: team-a, team-a-batch); "
        "expected a queue that lists the pod's namespace"
    )
    assert "its spec.namespaces: none" in inp.waiting["uid-nobody"].message()


def test_the_namespace_default_queue_label_is_held_to_the_same_rule() -> None:
    cache = _cache()
    cache.owners.apply(
        owners.NAMESPACE,
        "ADDED",
        {"metadata": {"name": "team-b", "labels": {"kallot.io/queue": "team-a"}}},
    )
    body = pod_body("p", resources={"nvidia.com/gpu": "1"})
    body["metadata"].update(uid="uid-p", namespace="team-b", resourceVersion="1")
    cache.apply_pod("ADDED", body)
    inp = cache.session_input()
    assert not inp.tasks and "namespace team-b may not use Queue team-a" in (
        inp.waiting["uid-p"].message()
    )


def test_a_pod_group_naming_another_namespaces_queue_takes_nothing() -> None:
    """A gang's members name no queue; their PodGroup does (``spec.queue``). A team-b
    PodGroup naming team-a's queue is held to the same rule as a label."""
    cache = _cache()
    for ns, queue in (("team-b", "team-a"), ("team-a", "team-a")):
        cache.apply_pod_group(
            "ADDED",
            {
                "kind": "PodGroup",
                "metadata": {"name": "g", "namespace": ns},
                "spec": {"minAvailable": 1, "queue": queue},
            },
        )
        body = pod_body(
            f"m-{ns}", resources={"nvidia.com/gpu": "1"}, labels={"kallot.io/pod-group": "g"}
        )
        body["metadata"].update(uid=f"uid-{ns}", namespace=ns, resourceVersion="1")
        cache.apply_pod("ADDED", body)
    inp = cache.session_input()
    assert {t.id for t in inp.tasks} == {"uid-team-a"}
    assert inp.waiting["uid-team-b"].reasons[0].plugin == QUEUE_ACCESS
    assert "namespace team-b may not use Queue team-a" in inp.waiting["uid-team-b"].message()


def test_the_default_queue_may_be_restricted_too() -> None:
    """A pod naming no queue is charged to the Queue named ``default``: when that Queue lists
    its namespaces, other namespaces' unlabelled pods take nothing from it."""
    cache = _cache()
    cache.replace_queues(
        [_queue("default", namespaces=["team-a"], resources={"gpu": {"quota": 1}})]
    )
    for ns in ("team-a", "team-b"):
        body = pod_body(f"p-{ns}", resources={"nvidia.com/gpu": "1"})
        body["metadata"].update(uid=f"uid-{ns}", namespace=ns, resourceVersion="1")
        cache.apply_pod("ADDED", body)
    inp = cache.session_input()
    assert {t.id for t in inp.tasks} == {"uid-team-a"}
    assert "namespace team-b may not use Queue default" in inp.waiting["uid-team-b"].message()


@pytest.mark.parametrize(
    ("namespaces", "field"),
    [
        pytest.param("team-a", "spec.namespaces", id="not-a-list"),
        pytest.param(["Team_A"], "spec.namespaces[0]", id="not-a-dns-label"),
        pytest.param(["ok", 7], "spec.namespaces[1]", id="not-a-string"),
    ],
)
def test_bad_namespaces_name_the_field(namespaces: object, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        translate.queue_spec(_queue("q", namespaces=namespaces))
    assert f"Queue q: {field}" in str(err.value) and "expected" in str(err.value)
