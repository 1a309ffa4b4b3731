"""kube.autoscale.disruption.plan: which model servers carry karpenter.sh/do-not-disrupt, and why."""

from __future__ import annotations

import datetime as dt
from typing import Any

from kallot.kube.autoscale import disruption
from kallot.kube.autoscale.disruption import MARKER, Patch
from kallot.testing.live import pod_body

NOW = 1_800_000_000.0
DND = "karpenter.sh/do-not-disrupt"


def server(
    name: str,
    *,
    ready_ago: float | None = None,
    model: str | None = "org/m@r1",
    node: str = "n1",
    ann: dict[str, str] | None = None,
    ns: str = "ml",
) -> dict[str, Any]:
    annotations = dict(ann or {})
    if model:
        annotations["kallot.io/model"] = model
    body = pod_body(name, resources={"nvidia.com/gpu": "1"}, annotations=annotations)
    body["metadata"]["namespace"] = ns
    if node:
        body["spec"]["nodeName"] = node
    conditions = []
    if ready_ago is not None:
        stamp = dt.datetime.fromtimestamp(NOW - ready_ago, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        conditions.append({"type": "Ready", "status": "True", "lastTransitionTime": stamp})
    body["status"] = {"phase": "Running", "conditions": conditions}
    return body


def reasons(*pods: dict[str, Any]) -> dict[str, str]:
    return {p.name: p.reason for p in disruption.plan(pods, NOW, grace_s=300)}


def test_loading_grace_and_last_ready_replica_are_protected() -> None:
    got = reasons(
        server("loading"),
        server("fresh", ready_ago=10),
        server("pending", node=""),  # not bound: nothing to guard yet
        server("plain", model=None),  # not a model server
    )
    assert got == {"loading": "loading", "fresh": "grace"}
    assert reasons(server("alone", ready_ago=3600)) == {"alone": "last-ready-replica"}
    # another namespace's replica of the same model does not count
    assert reasons(server("a", ready_ago=3600), server("b", ready_ago=3600, ns="other")) == {
        "a": "last-ready-replica",
        "b": "last-ready-replica",
    }


def test_cleared_only_when_another_replica_is_ready_and_only_if_kallot_set_it() -> None:
    ours = {DND: "true", MARKER: "grace"}
    got = reasons(
        server("a", ready_ago=3600, ann=ours),
        server("b", ready_ago=3600, ann=ours),
        server("c", ready_ago=3600, ann={DND: "true"}),  # a user's: never touched
    )
    assert got == {"a": "", "b": ""}
    # a loading replica does not count as a ready one: the ready one stays protected
    assert reasons(server("a", ready_ago=3600, ann=ours), server("b")) == {
        "a": "last-ready-replica",
        "b": "loading",
    }


def test_nothing_to_do_when_already_right() -> None:
    done = {DND: "true", MARKER: "loading"}
    assert reasons(server("x", ann=done)) == {}
    assert reasons(server("x", ann={DND: "false"})) == {}  # the user said so


def test_patch_bodies() -> None:
    assert Patch("ml", "x", "loading").body() == {
        "metadata": {"annotations": {DND: "true", MARKER: "loading"}}
    }
    assert Patch("ml", "x", "").body() == {"metadata": {"annotations": {DND: None, MARKER: None}}}
