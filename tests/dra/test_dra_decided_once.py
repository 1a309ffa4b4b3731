"""Decided once (issue 36 item 3, issue 37 item 1), hypothesis: random DRA nodes and pods go
through the live shell's DRA state (``DraCache.attach``), a real core session (the ``kallot``
profile, DraAllocation's filter, score and Reserve) and the shell's Reserve
(``DraCache.reserve``), then the bind path's claim writes (``kube.bind.claims.prebind``) into
an in-memory claim store; the allocation each claim's ``status.allocation`` holds afterwards,
read back as the scheduler reads claims, is the one the Decision carries (device, share id,
consumed capacity), and the shell ran no allocator of its own."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kallot.config.dra import claim_from_json
from kallot.config.presets import profile
from kallot.core import k8s
from kallot.core.dra.pod import PodClaimRef
from kallot.core.framework.runner import Framework
from kallot.core.plugins import dra_fit
from kallot.core.policies import builtin_registry
from kallot.core.scheduler import Scheduler
from kallot.kube.api.client import ApiError
from kallot.kube.bind import claims as dra_claims
from kallot.kube.dra.cache import DraCache
from kallot.testing.builders import make_node, make_task, snapshot
from kallot.testing.dra import claim, exactly, nvidia_classes, nvidia_node_slices


class ClaimStore:
    """The API's claims for the bind path's writes: get, replace (resourceVersion checked),
    list. Only what ``kube.bind.claims`` calls."""

    def __init__(self, objs: list[dict[str, Any]]) -> None:
        self.objs = {
            dra_claims.claim_path(o["metadata"]["namespace"], o["metadata"]["name"]): o
            for o in map(copy.deepcopy, objs)
        }
        for o in self.objs.values():
            o["metadata"]["resourceVersion"] = "1"

    async def get(self, path: str) -> dict[str, Any]:
        if path not in self.objs:
            raise ApiError("GET", path, 404, "not found")
        return copy.deepcopy(self.objs[path])

    async def replace(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        key = path.removesuffix("/status")
        have = self.objs[key]
        if body["metadata"].get("resourceVersion") != have["metadata"]["resourceVersion"]:
            raise ApiError("PUT", path, 409, "conflict")
        new = copy.deepcopy(dict(body))
        new["metadata"]["resourceVersion"] = str(int(have["metadata"]["resourceVersion"]) + 1)
        self.objs[key] = new
        return copy.deepcopy(new)

    async def list_all(self, path: str) -> tuple[list[dict[str, Any]], str]:
        del path
        return [copy.deepcopy(o) for o in self.objs.values()], "1"


@st.composite
def clusters(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[Any]]:
    nodes = draw(st.integers(1, 3))
    slices = []
    for n in range(nodes):
        gpus = draw(st.integers(0, 3))
        shared = draw(st.integers(0, 2))
        if gpus + shared == 0:
            gpus = 1
        slices += nvidia_node_slices(f"n{n}", gpus=gpus, roots=1, shared=shared)
    objs = []
    for c in range(draw(st.integers(1, 6))):
        if draw(st.booleans()):
            memory = draw(st.sampled_from(["10Gi", "20Gi", "40Gi"]))
            req = exactly("g", "gpu.nvidia.com", capacity={"requests": {"memory": memory}})
        else:
            req = exactly("g", "gpu.nvidia.com", count=draw(st.integers(1, 2)))
        objs.append(claim(f"c{c}", [req]))
    pods = []
    for p in range(draw(st.integers(1, 6))):
        names = draw(st.lists(st.sampled_from([o["metadata"]["name"] for o in objs]),
                              min_size=1, max_size=2, unique=True))  # fmt: skip
        pods.append((f"p{p}", names))
    return slices, objs, pods


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters())
def test_the_bound_allocation_is_the_scored_one(
    case: tuple[list[dict[str, Any]], list[dict[str, Any]], list[Any]],
) -> None:
    slices, objs, pods = case
    dra = DraCache()
    dra.replace_classes(nvidia_classes())
    dra.replace_slices(slices)
    dra.replace_claims(objs)
    tasks = [
        dataclasses.replace(
            make_task(name).cpu(100).obj(),
            k8s=k8s.PodInfo(
                namespace="default", resource_claims=tuple(PodClaimRef(c, c) for c in names)
            ),
        )
        for name, names in pods
    ]
    by_id = {t.id: t for t in tasks}
    nodes = sorted({s["spec"]["nodeName"] for s in slices})
    sched = Scheduler(Framework(profile("kallot"), builtin_registry()))
    decision = sched.run_session(
        snapshot(*(make_node(n) for n in nodes)),
        dra.attach(tasks),
        now=0.0,
        rng=np.random.default_rng(0),
    )
    # The shell's Reserve and bind must not run the allocator: fail loudly if they do.
    calls = 0
    real = dra_fit.allocate_on

    def counting(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        return real(*args, **kwargs)

    dra_fit.allocate_on = counting
    store = ClaimStore(objs)
    decided: dict[str, Any] = {}
    try:
        for p in decision.placements:
            assert p.claims is not None
            plan, why = dra.reserve(p.task_id, by_id[p.task_id], p)
            assert plan is not None, why
            assert plan.allocations == p.claims.allocations
            assert plan.reserve == p.claims.reserve
            decided.update(p.claims.allocations)
            problem = asyncio.run(
                dra_claims.prebind(
                    store,  # type: ignore[arg-type]
                    dra,
                    plan,
                    namespace="default",
                    name=p.task_id,
                    uid=p.task_id,
                )
            )
            assert not problem, problem
            for obj in store.objs.values():  # the watch shows the writes
                dra.apply_claim("MODIFIED", obj)
    finally:
        dra_fit.allocate_on = real
    assert calls == 0
    for key, alloc in decided.items():
        ns, name = key.split("/")
        written = claim_from_json(store.objs[dra_claims.claim_path(ns, name)])
        assert written.allocation is not None
        assert [(r.device_id, r.share_id, dict(r.consumed)) for r in written.allocation.results] == [
            (r.device_id, r.share_id, dict(r.consumed)) for r in alloc.results
        ]  # fmt: skip
    # Every placed pod is reserved on each of its claims, and nothing unplaced is.
    placed = {p.task_id for p in decision.placements}
    for obj in store.objs.values():
        holders = {r["uid"] for r in (obj.get("status") or {}).get("reservedFor") or []}
        assert holders <= placed
