"""The DraAllocation plugin in a real session of the core (no API): node choice by the claims,
in-session accounting between pods of one session, a claim shared by two pods, and the
reasons of a pod whose claims fit nowhere (hand-worked expectations)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from kallot.config.dra import claim_from_json, device_class_from_json, slice_from_json
from kallot.config.presets import profile
from kallot.core import k8s
from kallot.core.dra.allocator import Inventory
from kallot.core.dra.model import ResourceClaim, assemble_pools
from kallot.core.dra.pod import PodClaims
from kallot.core.framework.runner import Framework
from kallot.core.policies import builtin_registry
from kallot.core.scheduler import Scheduler
from kallot.core.workload import Task
from kallot.testing.builders import make_node, make_task, snapshot
from kallot.testing.dra import claim, exactly, nvidia_classes, nvidia_node_slices

ROOT = "resource.kubernetes.io/pcieRoot"


def _inventory(slices: list[dict[str, object]]) -> Inventory:
    pools, skipped = assemble_pools([slice_from_json(s) for s in slices])
    assert not skipped
    classes = {c.name: c for c in map(device_class_from_json, nvidia_classes())}
    return Inventory(tuple(pools), classes, ())


def _task(name: str, claims: list[ResourceClaim], inventory: Inventory) -> Task:
    task = make_task(name).cpu(100).obj()
    info = k8s.PodInfo(namespace="default", dra=PodClaims(tuple(claims), inventory))
    return dataclasses.replace(task, k8s=info)


def _run(tasks: list[Task], *names: str):  # type: ignore[no-untyped-def]
    sched = Scheduler(Framework(profile("kallot"), builtin_registry()))
    snap = snapshot(*(make_node(n) for n in names))
    return sched.run_session(snap, tasks, now=0.0, rng=np.random.default_rng(0))


def test_session_counts_earlier_pods_claims_and_shares_a_claim() -> None:
    """a: 4 GPUs on n1 (roots 00: gpu-0,1; 40: gpu-2,3), nothing on n0. Pods in one session:
    p1 wants a PCIe-root pair, p2 another pair, p3 one GPU: p1 and p2 take one root each (the
    second pair sees the first), p3 finds nothing (all 4 taken in this session) and its
    reason names its claim and request. p4 and p5 share claim ``shared`` on n2 (1 GPU): it is
    allocated once (by the first), the second only reserves it, both on n2."""
    inv = _inventory(
        [*nvidia_node_slices("n1", gpus=4, roots=2), *nvidia_node_slices("n2", gpus=1)]
    )
    pair: dict[str, Any] = {"constraints": [{"matchAttribute": ROOT}]}
    on_n1 = "device.attributes['gpu.nvidia.com'].uuid.startsWith('GPU-n1-')"
    c1 = claim_from_json(claim("c1", [exactly("g", "gpu.nvidia.com", count=2)], **pair))
    c2 = claim_from_json(claim("c2", [exactly("g", "gpu.nvidia.com", count=2)], **pair))
    c3 = claim_from_json(claim("c3", [exactly("g", "gpu.nvidia.com", selectors=[on_n1])]))
    shared = claim_from_json(claim("shared", [exactly("g", "gpu.nvidia.com")]))
    tasks = [
        dataclasses.replace(_task("p1", [c1], inv), created=1.0),
        dataclasses.replace(_task("p2", [c2], inv), created=2.0),
        dataclasses.replace(_task("p3", [c3], inv), created=3.0),
        dataclasses.replace(_task("p4", [shared], inv), created=4.0),
        dataclasses.replace(_task("p5", [shared], inv), created=5.0),
    ]
    decision = _run(tasks, "n0", "n1", "n2")
    where = {p.task_id: p.node for p in decision.placements}
    assert where == {"p1": "n1", "p2": "n1", "p4": "n2", "p5": "n2"}, where
    [why] = decision.unschedulable
    assert why.task_id == "p3"
    assert "claim default/c3, request g" in why.diagnosis.message(), why.diagnosis.message()


def test_node_choice_follows_the_dra_policy() -> None:
    """n1 has one GPU in use (gpu-0 by an existing allocation), n2 is idle (both 4 GPUs, two
    roots). A single GPU goes to n1 next to the used one (gpu-1: the started root is filled,
    n2 stays whole), not to whichever node comes first."""
    slices = [*nvidia_node_slices("n2", gpus=4, roots=2), *nvidia_node_slices("n1", gpus=4)]
    inv = _inventory(slices)
    used = claim_from_json(claim("used", [exactly("g", "gpu.nvidia.com")]))
    from kallot.core.dra.allocator import allocate
    from kallot.core.dra.policy import KallotPolicy

    first = allocate([used], "n1", {}, inv, policy=KallotPolicy())
    inv = dataclasses.replace(inv, allocated=tuple(first.allocations.values()))
    one = claim_from_json(claim("one", [exactly("g", "gpu.nvidia.com")]))
    decision = _run([_task("p", [one], inv)], "n2", "n1")
    assert [p.node for p in decision.placements] == ["n1"]


def test_claims_with_an_error_fit_nowhere_and_say_why() -> None:
    inv = _inventory(nvidia_node_slices("n1", gpus=1))
    task = dataclasses.replace(
        make_task("p").cpu(100).obj(),
        k8s=k8s.PodInfo(
            namespace="default",
            dra=PodClaims((), inv, "claim default/c, request gpu: selector 'x ==' broken"),
        ),
    )
    decision = _run([task], "n1")
    [why] = decision.unschedulable
    assert "claim default/c, request gpu: selector 'x ==' broken" in why.diagnosis.message()
    assert all(r.unresolvable for r in why.diagnosis.reasons if r.plugin == "DraAllocation")
