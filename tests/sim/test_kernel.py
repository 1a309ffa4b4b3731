"""The simulation kernel (sim.kernel): the clock's event order, and the cluster's usage checked
against the core's own Statement (an independent writer of the same arrays) and its Snapshots."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kallot.config import presets
from kallot.core import policies
from kallot.core.decision import Decision, Eviction, MigInstance, MigReconfiguration
from kallot.core.errors import InvariantViolation
from kallot.core.framework.runner import Framework
from kallot.core.resources import SharingMode
from kallot.core.scheduler import Scheduler
from kallot.core.session.statement import Statement
from kallot.core.snapshot import GpuSpec, NodeSpec, Scratch, Snapshot, SnapshotBuilder
from kallot.core.workload import Task
from kallot.sim import kernel
from kallot.testing.builders import make_task


def test_clock_orders_by_time_then_priority_then_push_order() -> None:
    clock: kernel.Clock[str] = kernel.Clock()
    clock.push(2.0, "late")
    clock.push(1.0, "tick", priority=2)
    clock.push(1.0, "arrive-a", priority=1)
    clock.push(1.0, "depart", priority=0)
    clock.push(1.0, "arrive-b", priority=1)
    assert clock.next_time() == 1.0
    assert clock.batch() == ["depart", "arrive-a", "arrive-b", "tick"]
    assert clock.now == 1.0
    assert len(clock) == 1
    assert clock.pop() == "late" and clock.now == 2.0
    assert not clock and clock.next_time() == float("inf")


def test_clock_refuses_an_event_in_the_past() -> None:
    clock: kernel.Clock[str] = kernel.Clock()
    clock.push(5.0, "x")
    clock.pop()
    with pytest.raises(InvariantViolation, match="before now"):
        clock.push(4.0, "y")


def _usage_arrays(s: Snapshot) -> dict[str, list[object]]:
    assert s.node_shapes is not None
    return {
        "cpu": s.node_cpu_used.tolist(),
        "mem": s.node_mem_used.tolist(),
        "pods": s.node_pods_used.tolist(),
        "milli": s.gpu_used_milli.tolist(),
        "gmem": s.gpu_used_mem.tolist(),
        "clients": s.gpu_clients.tolist(),
        "shapes": s.node_shapes.tolist(),
        "mig": s.mig.used.tolist(),
    }


def _scratch_arrays(x: Scratch) -> dict[str, list[object]]:
    return {
        "cpu": x.node_cpu_used.tolist(),
        "mem": x.node_mem_used.tolist(),
        "pods": x.node_pods_used.tolist(),
        "milli": x.gpu_used_milli.tolist(),
        "gmem": x.gpu_used_mem.tolist(),
        "clients": x.gpu_clients.tolist(),
        "shapes": x.node_shapes.tolist(),
        "mig": x.mig_used.tolist(),
    }


def _mig_node(name: str) -> NodeSpec:
    # A100-80GB with a static layout of two 3g.40gb instances, one already held.
    gpu = GpuSpec(
        model="A100-80GB",
        mem_mib=81920,
        mode=SharingMode.MIG,
        mig=(("3g.40gb", 0, True), ("3g.40gb", 4, False)),
    )
    return NodeSpec(name=name, cpu_milli=64_000, mem_mib=262_144, gpus=[gpu])


def _gpu(used: int = 0) -> GpuSpec:
    return GpuSpec(model="H100-80GB", mem_mib=81920, used_milli=used, clients=int(used > 0))


def _cluster() -> Snapshot:
    """Two GPU nodes (one GPU with background use), a CPU-only node and a MIG node."""
    return (
        SnapshotBuilder()
        .add(NodeSpec(name="a", cpu_milli=64_000, mem_mib=262_144, gpus=[_gpu(300), *[_gpu()] * 3]))
        .add(NodeSpec(name="b", cpu_milli=64_000, mem_mib=262_144, gpus=[_gpu(), _gpu()]))
        .add(NodeSpec(name="c", cpu_milli=8_000, mem_mib=65_536, gpus=[]))
        .add(_mig_node("m"))
        .build()
    )


TASKS = [
    make_task("share").cpu(2000).gpu(milli=400).obj(),
    make_task("whole2").cpu(4000).mem(1024).gpu(2).obj(),
    make_task("cpu-only").cpu(1000).obj(),
    make_task("mig").cpu(500).gpu(mig_profile="3g.40gb").obj(),
    make_task("share2").cpu(500).gpu(milli=250).obj(),
]


def _decide(base: Snapshot, tasks: list[Task]) -> Decision:
    fw = Framework(presets.PROFILES["kallot"], policies.builtin_registry())
    return Scheduler(fw, explain=False).run_session(
        base, tasks, now=0.0, rng=np.random.default_rng(0)
    )


def test_cluster_charges_what_a_statement_writes_mig_included() -> None:
    base = _cluster()
    decision = _decide(base, TASKS)
    assert {p.task_id for p in decision.placements} == {t.id for t in TASKS}
    by_id = {t.id: t for t in TASKS}
    cluster = kernel.Cluster(base)
    assert _usage_arrays(cluster.snapshot()) == _usage_arrays(base)
    applied = cluster.apply(decision, by_id, now=5.0)
    oracle = Scratch.of(base)
    statement = Statement(base, oracle)
    for p in decision.placements:
        statement.allocate(p, by_id[p.task_id])
    snap = cluster.snapshot(generation=3)
    assert _usage_arrays(snap) == _scratch_arrays(oracle)
    assert snap.mig.used.tolist() == [True, True]  # the MIG task holds the free instance
    assert snap.generation == 3 and not snap.node_cpu_used.flags.writeable
    assert [a.task.id for a in applied.placed] == [p.task_id for p in decision.placements]
    assert {a.task.id for a in snap.running} == set(by_id)
    assert all(a.started == 5.0 for a in snap.running)
    assert kernel.Cluster(base, show_running=False).snapshot().running == ()
    assert cluster.used_milli() == int(oracle.gpu_used_milli.sum())


@settings(max_examples=40, deadline=None)
@given(st.permutations(range(len(TASKS))), st.integers(0, len(TASKS)))
def test_release_undoes_exactly_in_any_order(order: list[int], keep: int) -> None:
    base = _cluster()
    decision = _decide(base, TASKS)
    by_id = {t.id: t for t in TASKS}
    cluster = kernel.Cluster(base)
    cluster.apply(decision, by_id, now=0.0)
    oracle = Scratch.of(base)
    statement = Statement(base, oracle)
    for p in decision.placements:
        statement.allocate(p, by_id[p.task_id])
    for k in order[keep:]:
        alloc = cluster.release(TASKS[k].id)
        statement.evict(alloc, Eviction(task_id=alloc.task.id, node="", reason="completed"))
        assert _usage_arrays(cluster.snapshot()) == _scratch_arrays(oracle)
    assert {a.task.id for a in cluster.snapshot().running} == {TASKS[k].id for k in order[:keep]}
    for k in order[:keep]:
        cluster.release(TASKS[k].id)
    assert _usage_arrays(cluster.snapshot()) == _usage_arrays(base)


def test_evictions_before_placements_and_double_placement_refused() -> None:
    base = _cluster()
    by_id = {t.id: t for t in TASKS}
    first = _decide(base, TASKS[:1])
    cluster = kernel.Cluster(base)
    cluster.apply(first, by_id, now=0.0)
    again = Decision(
        placements=first.placements,
        evictions=(Eviction(task_id="share", node="a", reason="preempted"),),
    )
    applied = cluster.apply(again, by_id, now=1.0)  # evicted, then started again
    assert [a.started for a in applied.evicted] == [0.0]
    assert [a.started for a in applied.placed] == [1.0]
    with pytest.raises(InvariantViolation, match="while it runs"):
        cluster.place(first.placements[0], by_id["share"], now=2.0)


def _live_mig(x: Scratch) -> set[tuple[int, int, str, int, bool]]:
    return {
        (
            int(x.mig_node[r]),
            int(x.mig_slot[r]),
            x.mig_profiles[int(x.mig_profile[r])],
            int(x.mig_start[r]),
            bool(x.mig_used[r]),
        )
        for r in range(x.mig_node.size)
        if x.mig_alive[r]
    }


def test_mig_reconfigurations_change_the_layout_as_a_statement_does() -> None:
    dynamic = GpuSpec(model="A100-80GB", mem_mib=81920, mode=SharingMode.MIG, mig_dynamic=True)
    base = (
        SnapshotBuilder()
        .add(_mig_node("m"))
        .add(NodeSpec(name="d", cpu_milli=64_000, mem_mib=262_144, gpus=[dynamic]))
        .build()
    )
    cluster = kernel.Cluster(base)
    tasks = [
        make_task(f"t{i}").cpu(100).gpu(mig_profile=p).obj()
        for i, p in enumerate(["3g.40gb", "2g.20gb", "1g.10gb"])
    ]
    by_id = {t.id: t for t in tasks}
    reconfigured = 0
    for t in tasks:  # one session each, on the cluster's latest Snapshot
        snap = cluster.snapshot()
        decision = _decide(snap, [t])
        assert [p.task_id for p in decision.placements] == [t.id]
        oracle = Scratch.of(snap)
        statement = Statement(snap, oracle)
        for rec in decision.reconfigurations:
            statement.reconfigure(snap.node_row(rec.node), rec)
        statement.allocate(decision.placements[0], t)
        cluster.apply(decision, by_id, now=0.0)
        after = cluster.snapshot()
        assert _live_mig(Scratch.of(after)) == _live_mig(oracle)
        assert _usage_arrays(after) | {"mig": []} == _scratch_arrays(oracle) | {"mig": []}
        reconfigured += len(decision.reconfigurations)
    assert reconfigured >= 2  # the dynamic GPU had no instance: at least two were created
    for t in tasks:
        cluster.release(t.id)
    final = cluster.snapshot().mig
    held = [(int(final.node[r]), int(final.start[r])) for r in np.flatnonzero(final.used)]
    assert held == [(0, 0)]  # only the background's instance on m


def test_a_reconfiguration_may_not_destroy_a_held_instance() -> None:
    base = SnapshotBuilder().add(_mig_node("m")).build()
    held = MigInstance(profile="3g.40gb", start=0)  # held by the background (used=True)
    change = MigReconfiguration(node="m", slot=0, uuid="GPU-m-0", destroy=(held,), create=())
    with pytest.raises(InvariantViolation, match="held"):
        kernel.Cluster(base).apply(Decision(reconfigurations=(change,)), {}, now=0.0)
