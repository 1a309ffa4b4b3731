"""Queues: tree validation, entitlement arithmetic, fair-order allocation, reclaim, preemption,
and the properties of issue 7 (hypothesis): hard limits never exceeded, do-not-disrupt pods never
evicted, gangs evicted whole or not at all, a guarantee obtainable within one session, share-aware
victims free exactly the GPU the preemptor then gets."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from kallot.config import presets
from kallot.core import policies
from kallot.core.actions import queue as actions
from kallot.core.actions import queue_session
from kallot.core.decision import Decision, DeviceAssignment, Eviction
from kallot.core.errors import ConfigError
from kallot.core.framework.runner import Framework
from kallot.core.plugins.quota import Quota
from kallot.core.queueing import fair_share, victims
from kallot.core.queueing.queue_tree import GPU, Queue, QueueResource, QueueTree
from kallot.core.resources import GPU_MODELS, MILLI, SharingMode
from kallot.core.scheduler import Scheduler
from kallot.core.session.session import Session
from kallot.core.snapshot import Allocation, GpuSpec, NodeSpec, Snapshot, SnapshotBuilder
from kallot.core.status import Diagnosis
from kallot.core.workload import DeviceRequest, Job, Task

H100 = "H100-80GB"
MEM = GPU_MODELS[H100].memory_mib


def tree(guar_a: int, guar_b: int, *, limit_b: int | None = None, dnd: bool = False) -> QueueTree:
    """Two departments, one team each: dept-a/team-a and dept-b/team-b (GPU amounts in milli)."""
    del dnd

    def res(g: int, limit: int | None = None) -> dict[str, QueueResource]:
        return {GPU: QueueResource(guaranteed=g, limit=limit)}

    return QueueTree(
        queues=(
            Queue(name="dept-a", resources=res(guar_a)),
            Queue(name="dept-b", resources=res(guar_b, limit_b)),
            Queue(name="a", parent="dept-a", resources=res(guar_a)),
            Queue(name="b", parent="dept-b", resources=res(guar_b, limit_b)),
        )
    )


def gpu_task(
    tid: str,
    queue: str,
    *,
    priority: int = 0,
    job: str = "",
    dnd: bool = False,
    count: int = 1,
    milli: int = MILLI,
    min_runtime_s: float = 0.0,
) -> Task:
    return Task(
        id=tid,
        queue=queue,
        priority=priority,
        job=job,
        do_not_disrupt=dnd,
        min_runtime_s=min_runtime_s,
        gpu=DeviceRequest(count=count, milli=milli),
    )


def cluster(nodes: int, gpus: int, running: Sequence[tuple[int, int, Task]]) -> Snapshot:
    """``nodes`` nodes of ``gpus`` H100s; ``running`` = (node, slot, task) with a whole GPU each."""
    busy = {(n, g) for n, g, _ in running}
    specs = [
        NodeSpec(
            name=f"n{n}",
            cpu_milli=64_000,
            mem_mib=256 * 1024,
            gpus=[
                GpuSpec(
                    model=H100,
                    mem_mib=MEM,
                    uuid=f"GPU-n{n}-{g}",
                    mode=SharingMode.MPS,
                    used_milli=MILLI if (n, g) in busy else 0,
                    used_mem=MEM if (n, g) in busy else 0,
                    clients=1 if (n, g) in busy else 0,
                )
                for g in range(gpus)
            ],
        )
        for n in range(nodes)
    ]
    allocs = [
        Allocation(
            task=t,
            node_row=n,
            devices=(
                DeviceAssignment(
                    slot=g,
                    uuid=f"GPU-n{n}-{g}",
                    milli=MILLI,
                    mem_mib=MEM,
                    mode=SharingMode.EXCLUSIVE,
                ),
            ),
            started=0.0,
        )
        for n, g, t in running
    ]
    return SnapshotBuilder().extend(specs).running(allocs).build()


def run(
    t: QueueTree, snap: Snapshot, pending: Sequence[Task], jobs: dict[str, Job] | None = None
) -> Decision:
    fw = Framework(presets.PROFILES["first-fit"], policies.builtin_registry())
    sched = Scheduler(fw, actions.queue_actions(t))
    return sched.run_session(snap, pending, now=3600.0, rng=np.random.default_rng(0), jobs=jobs)


def usage_after(
    t: QueueTree, snap: Snapshot, pending: Sequence[Task], d: Decision
) -> dict[str, int]:
    """GPU milli per leaf queue after applying the decision."""
    evicted = {e.task_id for e in d.evictions}
    out = {"a": 0, "b": 0}
    for alloc in snap.running:
        if alloc.task.id not in evicted:
            out[alloc.task.queue] += sum(x.milli for x in alloc.devices)
    by_id = {p.id: p for p in pending}
    for p in d.placements:
        out[by_id[p.task_id].queue] += sum(min(x.milli, MILLI) for x in p.devices)
    return out


def test_tree_rejects_children_guaranteed_more_than_parent() -> None:
    with pytest.raises(ConfigError, match=r"queues\[dept\]\.resources\[gpu\]\.guaranteed"):
        QueueTree(
            queues=(
                Queue(name="dept", resources={GPU: QueueResource(guaranteed=1000)}),
                Queue(name="t", parent="dept", resources={GPU: QueueResource(guaranteed=2000)}),
            )
        )


@pytest.mark.parametrize(
    ("demand_a", "demand_b", "expected"),
    [
        # 8 GPUs; guarantees 2 and 2; weights 1 and 1. Both ask 8: 2 + 2 guaranteed, the 4 left
        # split by weight 1:1 -> 4 and 4.
        pytest.param(8000, 8000, (4000, 4000), id="both saturate: equal split"),
        # a asks 1: it gets 1 (never more than demand); b gets its 2 plus the 5 left -> 7.
        pytest.param(1000, 8000, (1000, 7000), id="idle guarantee is lent"),
        # a asks 3, b asks 3: both fully served, 2 GPUs unclaimed.
        pytest.param(3000, 3000, (3000, 3000), id="undersubscribed"),
    ],
)
def test_entitlement_split(demand_a: int, demand_b: int, expected: tuple[int, int]) -> None:
    t = tree(2000, 2000)
    cap = np.zeros(len(t.axes))
    cap[t.axis[GPU]] = 8000
    demand = np.zeros((4, len(t.axes)))
    demand[t.index["a"], t.axis[GPU]] = demand_a
    demand[t.index["b"], t.axis[GPU]] = demand_b
    ent = fair_share.entitlement(t, cap, demand)
    assert (int(ent[t.index["a"], t.axis[GPU]]), int(ent[t.index["b"], t.axis[GPU]])) == expected


def test_reclaim_takes_back_borrowed_gpus_for_the_owner() -> None:
    # 1 node x 4 GPUs, all held by b (guaranteed 2, so 2 are borrowed). a (guaranteed 2) asks 2.
    running = [(0, g, gpu_task(f"b{g}", "b")) for g in range(4)]
    snap = cluster(1, 4, running)
    pending = [gpu_task("a0", "a"), gpu_task("a1", "a")]
    d = run(tree(2000, 2000), snap, pending)
    assert sorted(p.task_id for p in d.placements) == ["a0", "a1"]
    assert len(d.evictions) == 2
    assert all(e.reason.startswith("reclaim") for e in d.evictions)
    # b keeps exactly its guarantee.
    assert usage_after(tree(2000, 2000), snap, pending, d) == {"a": 2000, "b": 2000}


def test_no_reclaim_beyond_the_guarantee_or_entitlement() -> None:
    # b holds 4 of 4 with guarantee 4; a has no guarantee: a may not take anything back.
    running = [(0, g, gpu_task(f"b{g}", "b")) for g in range(4)]
    d = run(tree(0, 4000), cluster(1, 4, running), [gpu_task("a0", "a")])
    assert d.evictions == ()
    assert [u.task_id for u in d.unschedulable] == ["a0"]


def test_do_not_disrupt_pods_within_their_guarantee_are_never_victims() -> None:
    # b is guaranteed 2 GPUs and holds 4: its two do-not-disrupt pods keep their shield, the
    # two plain ones give a its 2 GPUs back.
    running = [(0, g, gpu_task(f"b{g}", "b", dnd=g < 2)) for g in range(4)]
    d = run(tree(2000, 2000), cluster(1, 4, running), [gpu_task(f"a{i}", "a") for i in range(2)])
    assert {e.task_id for e in d.evictions} == {"b2", "b3"}


def test_preempt_within_queue_by_priority_evicts_lowest_priority() -> None:
    # a owns all 2 GPUs; a high-priority task of a evicts the priority-1 task, not priority-5.
    running = [(0, 0, gpu_task("low", "a", priority=1)), (0, 1, gpu_task("mid", "a", priority=5))]
    d = run(tree(2000, 0), cluster(1, 2, running), [gpu_task("high", "a", priority=10)])
    assert [e.task_id for e in d.evictions] == ["low"]
    assert [p.task_id for p in d.placements] == ["high"]


def test_gang_victim_is_evicted_whole() -> None:
    # b runs a 2-task gang across two nodes (one GPU each) plus nothing else; a needs 1 GPU.
    running = [(0, 0, gpu_task("g0", "b", job="gang")), (1, 0, gpu_task("g1", "b", job="gang"))]
    jobs = {"gang": Job(id="gang", min_available=2, queue="b")}
    d = run(tree(1000, 0), cluster(2, 1, running), [gpu_task("a0", "a")], jobs)
    assert sorted(e.task_id for e in d.evictions) == ["g0", "g1"]
    assert [p.task_id for p in d.placements] == ["a0"]


def test_share_aware_eviction_frees_the_gpu_the_share_needs() -> None:
    # GPU 0 holds two 400-milli shares of b, GPU 1 one 900-milli share of b. A 500-milli share
    # for a fits once one 400 share goes (400 + 500 <= 1000): evict one task, not the 900 one.
    snap_nodes = [
        NodeSpec(
            name="n0",
            cpu_milli=64_000,
            mem_mib=256 * 1024,
            gpus=[
                GpuSpec(
                    model=H100,
                    mem_mib=MEM,
                    uuid="G0",
                    used_milli=800,
                    used_mem=2 * (400 * MEM // 1000),
                    clients=2,
                ),
                GpuSpec(
                    model=H100,
                    mem_mib=MEM,
                    uuid="G1",
                    used_milli=900,
                    used_mem=900 * MEM // 1000,
                    clients=1,
                ),
            ],
        )
    ]

    def share(tid: str, slot: int, milli: int) -> Allocation:
        return Allocation(
            task=gpu_task(tid, "b", milli=milli),
            node_row=0,
            devices=(
                DeviceAssignment(
                    slot=slot,
                    uuid=f"G{slot}",
                    milli=milli,
                    mem_mib=milli * MEM // 1000,
                    mode=SharingMode.MPS,
                ),
            ),
        )

    snap = (
        SnapshotBuilder()
        .extend(snap_nodes)
        .running([share("s1", 0, 400), share("s2", 0, 400), share("big", 1, 900)])
        .build()
    )
    d = run(tree(1000, 0), snap, [gpu_task("a0", "a", milli=500)])
    assert len(d.evictions) == 1 and d.evictions[0].task_id in {"s1", "s2"}
    assert d.placements[0].devices[0].slot == 0


@pytest.mark.parametrize(
    ("limit_gpus", "placed"),
    [
        # a 3-task gang (one GPU each) on an idle 4-GPU node: a limit of 3 GPUs admits all 3;
        pytest.param(3, 3, id="gang within limit: placed whole"),
        # a limit of 2 would be broken by the third member: the whole gang is rolled back.
        pytest.param(2, 0, id="gang over limit: nothing placed"),
    ],
)
def test_gang_is_placed_by_core_gang_within_the_hard_limit(limit_gpus: int, placed: int) -> None:
    jobs = {"g": Job(id="g", min_available=3, queue="b")}
    # Tasks name no queue: they are charged to the gang's (the PodGroup's) queue.
    pending = [gpu_task(f"g{i}", "", job="g") for i in range(3)]
    d = run(tree(0, 0, limit_b=limit_gpus * MILLI), cluster(1, 4, []), pending, jobs)
    assert len(d.placements) == placed
    assert len(d.unschedulable) == 3 - placed


def test_hard_limit_stops_borrowing() -> None:
    # b (no guarantee, limit 2 GPUs) asks for 4 on an idle 4-GPU node: only 2 are placed.
    pending = [gpu_task(f"b{i}", "b") for i in range(4)]
    d = run(tree(0, 0, limit_b=2000), cluster(1, 4, []), pending)
    assert len(d.placements) == 2
    assert all("hard limit on gpu" in u.diagnosis.message() for u in d.unschedulable)


# ---- properties -------------------------------------------------------------------------------

scenario = st.fixed_dictionaries(
    {
        "nodes": st.integers(1, 3),
        "gpus": st.integers(1, 4),
        "guar_a": st.integers(0, 4),
        "guar_b": st.integers(0, 4),
        "fill": st.floats(0, 1),
        "dnd": st.lists(st.booleans(), min_size=12, max_size=12),
        # running tasks that started 1 h before the session but ask for 2 h minimum runtime
        "young": st.lists(st.booleans(), min_size=12, max_size=12),
        "gang": st.lists(st.integers(0, 3), min_size=12, max_size=12),
        "pending_a": st.integers(0, 6),
        "pending_b": st.integers(0, 3),
        "limit_b": st.one_of(st.none(), st.integers(0, 12)),
    }
)


def build(sc: dict) -> tuple[QueueTree, Snapshot, list[Task], dict[str, Job]]:  # type: ignore[type-arg]
    total = sc["nodes"] * sc["gpus"]
    guar_a = min(sc["guar_a"], total)
    limit_b = None if sc["limit_b"] is None else sc["limit_b"] * MILLI
    guar_b = min(sc["guar_b"], total - guar_a, limit_b // MILLI if limit_b is not None else 12)
    t = tree(guar_a * MILLI, guar_b * MILLI, limit_b=limit_b)
    slots = [(n, g) for n in range(sc["nodes"]) for g in range(sc["gpus"])]
    used = slots[: round(sc["fill"] * len(slots))]
    if limit_b is not None:
        used = used[: sc["limit_b"]]
    running = []
    for i, (n, g) in enumerate(used):
        gang = sc["gang"][i]
        task = gpu_task(
            f"b{i}",
            "b",
            dnd=sc["dnd"][i],
            job=f"j{gang}" if gang else "",
            min_runtime_s=7200.0 if sc["young"][i] else 0.0,
        )
        running.append((n, g, task))
    jobs = {f"j{k}": Job(id=f"j{k}", min_available=2, queue="b") for k in (1, 2, 3)}
    pending = [gpu_task(f"pa{i}", "a") for i in range(sc["pending_a"])]
    pending += [gpu_task(f"pb{i}", "b") for i in range(sc["pending_b"])]
    return t, cluster(sc["nodes"], sc["gpus"], running), pending, jobs


@settings(max_examples=150, deadline=None)
@given(scenario)
def test_properties_limits_dnd_gangs(sc: dict) -> None:  # type: ignore[type-arg]
    t, snap, pending, jobs = build(sc)
    d = run(t, snap, pending, jobs)
    by_id = {a.task.id: a.task for a in snap.running}
    evicted = {e.task_id for e in d.evictions}
    # do-not-disrupt pods within b's guarantee (the oldest first: all started together, so by
    # id) are never victims, nor pods inside their minimum runtime (run 1 h of 2)
    guar_b = int(t.guaranteed[t.index["b"], t.axis[GPU]]) // MILLI
    dnd = sorted(tid for tid, task in by_id.items() if task.do_not_disrupt)
    assert not set(dnd[:guar_b]) & evicted
    assert not any(by_id[e].min_runtime_s > 3600.0 for e in evicted)
    # gangs evicted whole or not at all
    for job in jobs:
        members = {tid for tid, task in by_id.items() if task.job == job}
        assert members <= evicted or not (members & evicted)
    # hard limits never exceeded (b's limit; a has none)
    usage = usage_after(t, snap, pending, d)
    if sc["limit_b"] is not None:
        assert usage["b"] <= sc["limit_b"] * MILLI
    # no GPU over-committed
    per_gpu: dict[tuple[str, int], int] = {}
    for alloc in snap.running:
        if alloc.task.id not in evicted:
            for x in alloc.devices:
                per_gpu[(snap.node_names[alloc.node_row], x.slot)] = (
                    per_gpu.get((snap.node_names[alloc.node_row], x.slot), 0) + x.milli
                )
    for p in d.placements:
        for x in p.devices:
            per_gpu[(p.node, x.slot)] = per_gpu.get((p.node, x.slot), 0) + x.milli
    assert all(v <= MILLI for v in per_gpu.values())


@settings(max_examples=150, deadline=None)
@given(scenario)
def test_property_guarantee_obtainable_in_one_session(sc: dict) -> None:  # type: ignore[type-arg]
    # Domain where the claim is exact: one-GPU tasks on identical GPUs, no protected work, a's
    # pending work fits its guarantee. Then a holds min(guarantee, demand) after one session.
    sc = {**sc, "dnd": [False] * 12, "young": [False] * 12, "gang": [0] * 12, "limit_b": None}
    t, snap, pending, jobs = build(sc)
    d = run(t, snap, pending, jobs)
    guar_a = min(sc["guar_a"], sc["nodes"] * sc["gpus"])
    assert usage_after(t, snap, pending, d)["a"] >= min(guar_a, sc["pending_a"]) * MILLI


def test_mig_plan_evicts_the_holder_of_the_needed_profile() -> None:
    # One A100 in MIG mode with a 1g.10gb instance (start 0, held by cheap "small") and a
    # 3g.40gb instance (start 4, held by "big"). A 3g.40gb request must free the 3g one even
    # though "small" is cheaper: MIG instances are not fungible.
    from kallot.core.decision import MigInstance
    from kallot.core.queueing import victims
    from kallot.core.snapshot import MigLayout, Scratch

    mem = GPU_MODELS["A100-80GB"].memory_mib
    layout = MigLayout(
        profiles=("1g.10gb", "3g.40gb"),
        node=np.array([0, 0], np.int32),
        slot=np.array([0, 0], np.int32),
        profile=np.array([0, 1], np.int32),
        start=np.array([0, 4], np.int32),
        used=np.array([True, True]),
    )
    node = NodeSpec(
        name="n0",
        cpu_milli=64_000,
        mem_mib=256 * 1024,
        gpus=[GpuSpec(model="A100-80GB", mem_mib=mem, mode=SharingMode.MIG, clients=2)],
    )

    def holder(tid: str, profile: str, start: int, priority: int) -> Allocation:
        inst = MigInstance(profile=profile, start=start)
        dev = DeviceAssignment(
            slot=0, uuid="GPU-n0-0", milli=0, mem_mib=0, mode=SharingMode.MIG, mig=inst
        )
        return Allocation(task=gpu_task(tid, "b", priority=priority), node_row=0, devices=(dev,))

    allocs = [holder("small", "1g.10gb", 0, 0), holder("big", "3g.40gb", 4, 5)]
    snap = SnapshotBuilder().add(node).mig(layout).running(allocs).build()
    cands = victims.units(list(snap.running), {}, 0.0, lambda m: True)
    task = Task(id="p", gpu=DeviceRequest(count=1, mig_profile="3g.40gb"))
    plan = victims.plan_on_node(snap, Scratch.of(snap), task, 0, cands)
    assert plan is not None
    assert [u.name for u in plan.units] == ["big"]
    # The what-if: with "big" evicted, the core places the preemptor on the freed 3g@4 (MigFit),
    # and with nothing evicted it does not fit.
    fw = Framework(presets.PROFILES["first-fit"], policies.builtin_registry())
    session = Session(fw, snap, now=0, rng=np.random.default_rng(0), jobs={})
    assert queue_session.place_on(session, task, 0) is None
    big = next(a for a in snap.running if a.task.id == "big")
    session.statement.evict(big, Eviction(task_id="big", node="n0", reason="test", for_task="p"))
    placed = queue_session.place_on(session, task, 0)
    assert placed is not None and placed.devices[0].mig == MigInstance(profile="3g.40gb", start=4)


def test_mig_request_is_charged_by_its_slices_not_a_whole_gpu() -> None:
    from kallot.core.queueing.charge import Charger
    from kallot.core.queueing.queue_tree import GPU_MEMORY

    mem = GPU_MODELS["A100-80GB"].memory_mib
    node = NodeSpec(
        name="n0",
        cpu_milli=64_000,
        mem_mib=256 * 1024,
        gpus=[GpuSpec(model="A100-80GB", mem_mib=mem, mode=SharingMode.MIG)],
    )
    snap = SnapshotBuilder().add(node).build()
    t = tree(0, 1000)
    charger = Charger(t, snap)
    est = charger.estimate(Task(id="m", gpu=DeviceRequest(mig_profile="3g.40gb")))
    # 3g: 3 * 1000 // 7 = 428 milli; 4 of 8 memory slices of 81920 MiB = 40960 MiB
    assert est[t.axis[GPU]] == 428
    assert est[t.axis[GPU_MEMORY]] == mem * 4 // 8
    # '1g.10gb' is 1 slice on an A100-80GB but 2 on an A100-40GB: the estimate takes the fewer
    est = charger.estimate(Task(id="s", gpu=DeviceRequest(mig_profile="1g.10gb")))
    assert est[t.axis[GPU]] == 142 and est[t.axis[GPU_MEMORY]] == mem // 8


def test_do_not_disrupt_work_never_borrows() -> None:
    # b is guaranteed 1 GPU; on an idle 4-GPU node two ordinary tasks borrow past it, but of two
    # protected tasks only one is placed: capacity they borrowed could never be reclaimed.
    plain = [gpu_task(f"p{i}", "b") for i in range(2)]
    d = run(tree(0, 1000), cluster(1, 4, []), plain)
    assert len(d.placements) == 2
    protected = [gpu_task(f"d{i}", "b", dnd=True) for i in range(2)]
    d = run(tree(0, 1000), cluster(1, 4, []), protected)
    assert len(d.placements) == 1
    assert "quota on gpu" in d.unschedulable[0].diagnosis.message()


shares_scenario = st.fixed_dictionaries(
    {
        # per GPU (2 nodes x 2 GPUs): the milli of b's shares on it (sum <= 1000)
        "shares": st.lists(
            st.lists(st.sampled_from([200, 300, 400, 500]), min_size=2, max_size=4),
            min_size=4,
            max_size=4,
        ),
        "priorities": st.lists(st.integers(0, 3), min_size=16, max_size=16),
        "want": st.sampled_from([300, 500, 700, 1000]),
    }
)


@settings(max_examples=150, deadline=None)
@given(shares_scenario)
def test_property_share_aware_victims_free_the_preemptors_gpu(sc: dict) -> None:  # type: ignore[type-arg]
    # b (no guarantee) holds GPU shares on 2 nodes x 2 H100s; a (guaranteed everything) asks
    # for one share of ``want`` milli. Whatever the reclaim evicts must be on the very GPU the
    # preemptor then gets (evicting elsewhere frees nothing it can use), only if it did not fit
    # before, and after the evictions that GPU is not over-committed.
    held: dict[tuple[int, int], list[int]] = {}
    for i, shares in enumerate(sc["shares"]):
        kept: list[int] = []
        for m in shares:
            if sum(kept) + m <= MILLI:
                kept.append(m)
        held[(i // 2, i % 2)] = kept
    nodes, allocs, k = [], [], 0
    for n in range(2):
        gpus = []
        for g in range(2):
            gpus.append(
                GpuSpec(
                    model=H100,
                    mem_mib=MEM,
                    uuid=f"G{n}{g}",
                    used_milli=sum(held[(n, g)]),
                    used_mem=sum(m * MEM // 1000 for m in held[(n, g)]),
                    clients=len(held[(n, g)]),
                )
            )
            for m in held[(n, g)]:
                task = gpu_task(f"s{k}", "b", milli=m, priority=sc["priorities"][k])
                dev = DeviceAssignment(
                    slot=g, uuid=f"G{n}{g}", milli=m, mem_mib=m * MEM // 1000, mode=SharingMode.MPS
                )
                allocs.append(Allocation(task=task, node_row=n, devices=(dev,)))
                k += 1
        nodes.append(NodeSpec(name=f"n{n}", cpu_milli=64_000, mem_mib=256 * 1024, gpus=gpus))
    snap = SnapshotBuilder().extend(nodes).running(allocs).build()
    d = run(tree(4 * MILLI, 0), snap, [gpu_task("a0", "a", milli=sc["want"])])
    free_before = {ng: MILLI - sum(ms) for ng, ms in held.items()}
    if any(f >= sc["want"] for f in free_before.values()):
        assert not d.evictions  # it fits somewhere as is: nobody is evicted for it
    event(f"evictions: {bool(d.evictions)}")
    if not d.evictions:
        return
    # evictions are committed only together with the preemptor's placement
    assert [p.task_id for p in d.placements] == ["a0"]
    place = d.placements[0]
    slot = (int(place.node[1:]), place.devices[0].slot)
    where = {a.task.id: (a.node_row, a.devices[0].slot) for a in snap.running}
    milli = {a.task.id: a.devices[0].milli for a in snap.running}
    evicted = {e.task_id for e in d.evictions}
    assert all(e.for_task == "a0" for e in d.evictions)
    assert {where[t] for t in evicted} == {slot}
    left = sum(milli[t] for t, ng in where.items() if ng == slot and t not in evicted)
    assert left + sc["want"] <= MILLI


def test_a_statement_rollback_undoes_the_quota_charges_with_the_placements() -> None:
    # One transaction log: the Quota plugin's Ledger logs its undo steps in the Statement, so
    # rolling back to a checkpoint restores the queues' usage exactly as it restores the Scratch.
    t = tree(0, 2000)
    snap = cluster(1, 4, [(0, 0, gpu_task("r", "b"))])
    fw = Framework(presets.PROFILES["first-fit"], policies.builtin_registry())
    session = Session(fw, snap, now=0, rng=np.random.default_rng(0), jobs={})
    st = queue_session.queue_state(session, t, Quota(t))
    b = t.index["b"]
    start = st.ledger.usage.copy()
    assert start[b, t.axis[GPU]] == 1000  # the running task
    cp = session.statement.checkpoint()
    for i in range(2):
        placed = queue_session.place_with_quota(session, st, b, gpu_task(f"p{i}", "b"))
        assert not isinstance(placed, Diagnosis)
    assert st.ledger.usage[b, t.axis[GPU]] == 3000
    # b is guaranteed 2 GPUs and now holds 3 (borrowed): a do-not-disrupt task may not borrow,
    # so the plugin refuses it (its quota), and the refused placement leaves no charge behind.
    refused = queue_session.place_with_quota(session, st, b, gpu_task("d", "b", dnd=True))
    assert isinstance(refused, Diagnosis) and "quota on gpu" in refused.message()
    assert st.ledger.usage[b, t.axis[GPU]] == 3000
    session.statement.rollback(cp)
    assert np.array_equal(st.ledger.usage, start)
    assert session.statement.placements() == []


def test_min_runtime_shields_a_borrower_at_most_the_configured_cap() -> None:
    """A borrower asking 50 minutes of min-runtime is reclaimable after the operator's cap
    (actions.maxMinRuntimeSeconds, here 10 minutes), not before: the lender's guarantee comes
    back within the cap, whatever the borrower asked."""
    t = tree(MILLI, 0)
    borrower = gpu_task("b0", "b", min_runtime_s=3000.0)
    snap = cluster(1, 1, [(0, 0, borrower)])
    pending = [gpu_task("a0", "a")]

    def evicted(now: float, cap: float) -> set[str]:
        sched = Scheduler(
            Framework(presets.PROFILES["first-fit"], policies.builtin_registry()),
            actions.queue_actions(t, max_min_runtime_s=cap),
        )
        d = sched.run_session(snap, pending, now=now, rng=np.random.default_rng(0), jobs={})
        return {e.task_id for e in d.evictions}

    assert evicted(599.0, 600.0) == set()
    assert evicted(601.0, 600.0) == {"b0"}
    assert evicted(601.0, math.inf) == set()  # no cap: its own 50 minutes hold


def test_model_names_do_not_keep_a_borrowed_guarantee() -> None:
    """The attack: team b borrows team a's guarantee with pods that each name a distinct model
    (so each is "the last replica" of its model) and a huge model size (so each is "loading"
    for hours). Reclaim still gives team a its guarantee back (once the loading bound, the
    operator's cap, has passed); preemption within a queue keeps honouring last replicas."""
    from kallot.core.models import ModelRef

    t = tree(2 * MILLI, 0)
    borrowers = [
        dataclasses.replace(
            gpu_task(f"b{i}", "b"), model=ModelRef(id=f"evil/model-{i}", size_bytes=10**15)
        )
        for i in range(2)
    ]
    snap = cluster(1, 2, [(0, i, b) for i, b in enumerate(borrowers)])
    pending = [gpu_task("a0", "a"), gpu_task("a1", "a")]

    def evicted(now: float, cap: float) -> set[str]:
        sched = Scheduler(
            Framework(presets.PROFILES["first-fit"], policies.builtin_registry()),
            actions.queue_actions(t, max_min_runtime_s=cap),
        )
        d = sched.run_session(snap, pending, now=now, rng=np.random.default_rng(0), jobs={})
        return {e.task_id for e in d.evictions}

    assert evicted(3599.0, 3600.0) == set()  # still "loading", within the cap
    assert evicted(3601.0, 3600.0) == {"b0", "b1"}  # the guarantee comes back
    servers = victims.units(list(snap.running), {}, 3601.0, lambda m: True, 3600.0)
    assert servers == []  # preemption's candidates: each is its model's last replica


def test_do_not_disrupt_added_after_the_bind_does_not_keep_a_borrowed_guarantee() -> None:
    """The attack: team b borrows team a's guarantee with ordinary pods, then annotates them
    do-not-disrupt after the bind (the tenant may; kallot's own model-server guard does too).
    Reclaim takes back what lies beyond b's guarantee (the youngest first); b's do-not-disrupt
    pods within its guarantee keep their shield, and preemption honours every one."""
    t = tree(2 * MILLI, MILLI)
    running = [
        (0, i, dataclasses.replace(gpu_task(f"b{i}", "b"), do_not_disrupt=True)) for i in range(3)
    ]
    snap = cluster(1, 3, running)
    snap = dataclasses.replace(
        snap,
        running=tuple(dataclasses.replace(a, started=float(i)) for i, a in enumerate(snap.running)),
    )
    pending = [gpu_task("a0", "a"), gpu_task("a1", "a")]
    fw = Framework(presets.PROFILES["first-fit"], policies.builtin_registry())
    d = Scheduler(fw, actions.queue_actions(t)).run_session(
        snap, pending, now=3600.0, rng=np.random.default_rng(0), jobs={}
    )
    assert {e.task_id for e in d.evictions} == {"b1", "b2"}  # b keeps b0, its guarantee
    assert {p.task_id for p in d.placements} == {"a0", "a1"}
