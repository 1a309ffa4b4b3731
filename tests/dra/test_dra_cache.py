"""The live scheduler's DRA state without an API server: a pod's claims from
``spec.resourceClaims`` / ``status.resourceClaimStatuses``, what occupies devices (allocations
on claims and in flight), reserving a placed pod's decided allocation, and in-flight allocations across
a full re-list."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest

from kallot.config.dra import allocation_status
from kallot.core import k8s
from kallot.core.decision import ClaimDecision, Placement
from kallot.core.dra.pod import PodClaimRef
from kallot.core.errors import ConfigError
from kallot.core.plugins.dra_fit import allocate_on, by_node, node_inventory
from kallot.kube.api.k8s_fields import resource_claims
from kallot.kube.dra import explain as dra_explain
from kallot.kube.dra.cache import DraCache, DraPlan
from kallot.testing.builders import make_task
from kallot.testing.dra import claim, exactly, nvidia_classes, nvidia_node_slices


def _pod(
    refs: list[dict[str, str]], statuses: list[dict[str, str]] | None = None
) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "default"},
        "spec": {"resourceClaims": refs},
        "status": {"resourceClaimStatuses": statuses or []},
    }


def test_pod_claim_refs_from_spec_and_status() -> None:
    pod = _pod(
        [
            {"name": "a", "resourceClaimName": "shared"},
            {"name": "b", "resourceClaimTemplateName": "tpl"},
            {"name": "c", "resourceClaimTemplateName": "tpl"},
        ],
        [{"name": "b", "resourceClaimName": "p-b-x7k2"}],
    )
    assert resource_claims(pod) == (
        PodClaimRef("a", "shared"),
        PodClaimRef("b", "p-b-x7k2", "tpl"),
        PodClaimRef("c", "", "tpl"),
    )
    with pytest.raises(ConfigError, match=r"spec.resourceClaims\[0\]"):
        resource_claims(
            _pod([{"name": "a", "resourceClaimName": "x", "resourceClaimTemplateName": "y"}])
        )


def _cache() -> DraCache:
    c = DraCache()
    c.replace_classes(nvidia_classes())
    c.replace_slices(nvidia_node_slices("n1", gpus=2, roots=1))
    return c


def _task(*refs: PodClaimRef) -> Any:
    return dataclasses.replace(
        make_task("p").obj(), k8s=k8s.PodInfo(namespace="default", resource_claims=refs)
    )


def _decide(c: DraCache, uid: str, task: Any, node: str) -> tuple[DraPlan | None, str]:
    """A session's decision for the pod on ``node`` (DraAllocation's Reserve: kallot's policy
    on the session's input) and the shell's Reserve of it (``DraCache.reserve``)."""
    [attached] = c.attach([task])
    assert attached.k8s is not None
    dra = attached.k8s.dra
    assert dra is not None
    if dra.error:
        return None, dra.error
    out = allocate_on(dra, node, {}, node_inventory(by_node(dra.inventory), node), (), {})
    if not out.ok:
        return None, dra.say(out.reason)
    decided = ClaimDecision(allocations=dict(out.allocations), reserve=out.reserve_only)
    return c.reserve(uid, task, Placement(task_id=uid, node=node, node_row=0, claims=decided))


def test_waiting_missing_and_planned_claims() -> None:
    c = _cache()
    waiting = c.pod_claims("default", (PodClaimRef("gpu", "", "tpl"),))
    assert "waiting for its ResourceClaim from template tpl" in waiting.error
    missing = c.pod_claims("default", (PodClaimRef("gpu", "nope"),))
    assert missing.error == "claim default/nope: ResourceClaim not found"

    c.replace_claims([claim("one", [exactly("gpu", "gpu.nvidia.com")])])
    plan, why = _decide(c, "uid-1", _task(PodClaimRef("gpu", "one")), "n1")
    assert plan is not None and not why
    [alloc] = plan.allocations.values()
    assert c.assumed == {"default/one": alloc}  # in flight: it occupies its GPU
    assert alloc in c.inventory().allocated
    # A second pod of the same claim only reserves it (allocated, in flight).
    plan2, _ = _decide(c, "uid-2", _task(PodClaimRef("gpu", "one")), "n1")
    assert plan2 is not None and plan2.reserve == ("default/one",) and not plan2.allocations
    # A pod of another claim gets the other GPU.
    c.apply_claim("ADDED", claim("two", [exactly("gpu", "gpu.nvidia.com")]))
    plan3, _ = _decide(c, "uid-3", _task(PodClaimRef("gpu", "two")), "n1")
    assert plan3 is not None
    assert {r.device for r in plan3.allocations["default/two"].results} != {
        r.device for r in alloc.results
    }
    # A third claim finds no GPU: the reason names it.
    c.apply_claim("ADDED", claim("three", [exactly("gpu", "gpu.nvidia.com")]))
    none, why = _decide(c, "uid-4", _task(PodClaimRef("gpu", "three")), "n1")
    assert none is None and "claim default/three" in why


def test_in_flight_allocations_until_the_watch_or_two_lists() -> None:
    c = _cache()
    body = claim("one", [exactly("gpu", "gpu.nvidia.com")])
    c.replace_claims([body])
    plan, _ = _decide(c, "uid-1", _task(PodClaimRef("gpu", "one")), "n1")
    assert plan is not None
    c.drop("uid-1", allocations=False)  # bound: the allocation stays in flight
    c.replace_claims([body])  # a list from before the write: kept
    assert "default/one" in c.assumed
    c.replace_claims([body])  # still unallocated at the next list: given back meanwhile
    assert "default/one" not in c.assumed
    # The watch showing the allocation ends the in-flight entry at once.
    plan, _ = _decide(c, "uid-1", _task(PodClaimRef("gpu", "one")), "n1")
    assert plan is not None
    seen = copy.deepcopy(body)
    seen["status"] = {"allocation": allocation_status(plan.allocations["default/one"])}
    c.apply_claim("MODIFIED", seen)
    assert not c.assumed
    assert len(c.inventory().allocated) == 1


def test_explain_lines_for_claims() -> None:
    pod = _pod([{"name": "gpu", "resourceClaimName": "one"}])
    obj = claim("one", [exactly("gpu", "gpu.nvidia.com", count=2)])
    assert dra_explain.claim_lines(pod, [obj]) == [
        "ResourceClaims:",
        "  gpu: claim one [gpu: 2 of gpu.nvidia.com]: not allocated",
    ]


def test_selectors_that_do_not_compile_name_the_claim_request_and_expression() -> None:
    """A claim kallot cannot compile (the API server would refuse this one, but its CEL and
    kallot's may differ) and a class whose selector does not compile: the pod's claims carry
    the error (the session's DraAllocation rejects every node with it, unresolvable), one
    line naming the claim, the request and the expression."""
    c = _cache()
    c.apply_claim(
        "ADDED", claim("bad", [exactly("gpu", "gpu.nvidia.com", selectors=["device.driver =="])])
    )
    got = c.pod_claims("default", (PodClaimRef("gpu", "bad"),))
    assert got.error.startswith("claim default/bad, request gpu: "), got.error
    assert "'device.driver =='" in got.error
    broken = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "broken"},
        "spec": {"selectors": [{"cel": {"expression": "device.attributes["}}]},
    }
    c.apply_class("ADDED", broken)
    c.apply_claim("ADDED", claim("uses-broken", [exactly("gpu", "broken")]))
    got = c.pod_claims("default", (PodClaimRef("gpu", "uses-broken"),))
    assert got.error.startswith("claim default/uses-broken, request gpu: DeviceClass broken")
    assert "device.attributes[" in got.error


def test_a_generated_claim_is_found_before_the_pod_status_names_it() -> None:
    """The resourceclaim controller creates the claim (ownerReference to the pod, annotation
    resource.kubernetes.io/pod-claim-name) and only then writes the pod's
    status.resourceClaimStatuses: the claim is the pod's as soon as it exists (its creation,
    not the pod's later update, is what wakes the pod)."""
    c = _cache()
    ref = PodClaimRef("gpu", "", "tpl")
    assert c.pod_claims("default", (ref,), "pod-uid").error
    body = claim("p-gpu-abcde", [exactly("gpu", "gpu.nvidia.com")])
    body["metadata"]["annotations"] = {"resource.kubernetes.io/pod-claim-name": "gpu"}
    body["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "pod-uid", "controller": True}
    ]
    c.apply_claim("ADDED", body)
    got = c.pod_claims("default", (ref,), "pod-uid")
    assert not got.error and [x.name for x in got.claims] == ["p-gpu-abcde"]
    assert c.pod_claims("default", (ref,), "another-pod").error  # not that pod's
    c.apply_claim("DELETED", body)
    assert c.pod_claims("default", (ref,), "pod-uid").error


def test_plans_count_every_allocation_in_flight_and_pools_added_later() -> None:
    # Each decision must see every allocation in flight, and a slice that arrives later.
    c = _cache()  # n1: two GPUs
    c.replace_claims([claim(f"c{i}", [exactly("gpu", "gpu.nvidia.com")]) for i in range(4)])
    devices = set()
    for i in range(2):
        plan, why = _decide(c, f"uid-{i}", _task(PodClaimRef("gpu", f"c{i}")), "n1")
        assert plan is not None, why
        devices |= {r.device for r in plan.allocations[f"default/c{i}"].results}
    assert len(devices) == 2
    full, why = _decide(c, "uid-2", _task(PodClaimRef("gpu", "c2")), "n1")
    assert full is None and "claim default/c2" in why
    none, why = _decide(c, "uid-2", _task(PodClaimRef("gpu", "c2")), "n2")
    assert none is None and "no device on node n2" in why
    for body in nvidia_node_slices("n2", gpus=2, roots=1):
        c.apply_slice("ADDED", body)
    got = []
    for i in (2, 3):
        plan, why = _decide(c, f"uid-{i}", _task(PodClaimRef("gpu", f"c{i}")), "n2")
        assert plan is not None, why
        [alloc] = plan.allocations.values()
        assert alloc.node_selector is not None
        got.append(tuple(r.device_id for r in alloc.results))
    assert len(set(got)) == 2 and all(d[1] != "n1" for ds in got for d in ds)


def test_reserve_refuses_a_decision_whose_device_was_taken_meanwhile() -> None:
    """The session decided gpu-X for claim one; before the shell's Reserve another scheduler's
    allocation of that device shows in the watch: the decision is refused (decided again next
    session), not re-decided here. A device freed meanwhile leaves a decision valid."""
    c = _cache()  # n1: two GPUs
    c.replace_claims([claim(n, [exactly("gpu", "gpu.nvidia.com")]) for n in ("one", "other")])
    task = _task(PodClaimRef("gpu", "one"))
    [attached] = c.attach([task])
    assert attached.k8s is not None and attached.k8s.dra is not None
    dra = attached.k8s.dra
    out = allocate_on(dra, "n1", {}, node_inventory(by_node(dra.inventory), "n1"), (), {})
    decided = ClaimDecision(allocations=dict(out.allocations), reserve=out.reserve_only)
    placement = Placement(task_id="uid-1", node="n1", node_row=0, claims=decided)
    taken = claim("other", [exactly("gpu", "gpu.nvidia.com")])
    taken["status"] = {"allocation": allocation_status(out.allocations["default/one"])}
    c.apply_claim("MODIFIED", taken)
    plan, why = c.reserve("uid-1", task, placement)
    assert plan is None and "taken since the session decided" in why, why
    c.apply_claim("MODIFIED", claim("other", [exactly("gpu", "gpu.nvidia.com")]))  # freed
    plan, why = c.reserve("uid-1", task, placement)
    assert plan is not None and plan.allocations == decided.allocations, why
