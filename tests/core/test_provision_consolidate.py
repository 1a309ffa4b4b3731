"""Consolidation (core.provision.consolidate): it empties a node only by moving pods that may
move, places every one of them elsewhere, names the gain, and stays inside its budget."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kallot.core import policies
from kallot.core.decision import DeviceAssignment
from kallot.core.framework.runner import Framework
from kallot.core.provision.consolidate import ConsolidationConfig, consolidate, movable
from kallot.core.provision.shapes import NodeShape
from kallot.core.resources import SharingMode
from kallot.core.snapshot import Allocation, Snapshot, SnapshotBuilder
from kallot.core.workload import DeviceRequest, Job, Task

FW = Framework(policies.PROFILES["kallot"], policies.builtin_registry())
SHAPE = NodeShape(name="n", cpu_milli=16_000, mem_mib=64_000, gpu_model="H100-80GB", gpus=2)
ON = ConsolidationConfig(enabled=True, evictions_per_minute=10, gain_threshold=1)
NOW = 1000.0


def share(tid: str, milli: int, **kw: object) -> Task:
    return Task(id=tid, cpu_milli=1000, mem_mib=1000, gpu=DeviceRequest(milli=milli), **kw)  # type: ignore[arg-type]


def cluster(loads: list[list[tuple[Task, int]]], started: float = 0.0) -> Snapshot:
    """Nodes n0.. of SHAPE; ``loads[n]`` = (task, GPU slot) of its running shares."""
    b = SnapshotBuilder()
    allocs = []
    for n, load in enumerate(loads):
        spec = SHAPE.node(f"n{n}")
        gpus = list(spec.gpus)
        for task, slot in load:
            assert task.gpu is not None
            g = gpus[slot]
            gpus[slot] = dataclasses.replace(
                g, used_milli=g.used_milli + task.gpu.milli, clients=g.clients + 1
            )
            dev = DeviceAssignment(
                slot=slot, uuid=g.uuid, milli=task.gpu.milli, mem_mib=0, mode=SharingMode.MPS
            )
            allocs.append(Allocation(task=task, node_row=n, devices=(dev,), started=started))
        cpu = sum(t.cpu_milli for t, _ in load)
        mem = sum(t.mem_mib for t, _ in load)
        b.add(dataclasses.replace(spec, gpus=gpus, cpu_used=cpu, mem_used=mem, pods_used=len(load)))
    return b.running(allocs).build()


def test_a_nearly_empty_node_is_emptied_onto_another() -> None:
    snap = cluster([[(share("a", 500), 0)], [(share("b", 300), 0)]])
    (move,) = consolidate(FW, snap, ON, now=NOW, budget=5)
    assert move.node == "n1" and move.gain == 2.0
    assert [e.task_id for e in move.evictions] == ["b"]
    assert move.evictions[0].reason == "Consolidation: emptying node n1 frees 2 GPUs"
    assert [(p.task_id, p.node) for p in move.placements] == [("b", "n0")]


def test_off_by_default_and_within_budget() -> None:
    snap = cluster([[(share("a", 500), 0)], [(share("b", 300), 0), (share("c", 100), 1)]])
    assert consolidate(FW, snap, ConsolidationConfig(), now=NOW, budget=5) == ()
    (move,) = consolidate(FW, snap, ON, now=NOW, budget=1)  # n1 needs 2 evictions: n0 instead
    assert move.node == "n0"
    assert consolidate(FW, snap, ON, now=NOW, budget=0) == ()


def test_gain_threshold() -> None:
    snap = cluster([[(share("a", 500), 0)], [(share("b", 300), 0)]])
    assert consolidate(FW, snap, dataclasses.replace(ON, gain_threshold=3), now=NOW, budget=5) == ()


@pytest.mark.parametrize(
    "task, protected, jobs",
    [
        (share("b", 300, do_not_disrupt=True), frozenset(), {}),
        (share("b", 300, min_runtime_s=NOW + 1), frozenset(), {}),
        (share("b", 300), frozenset({"b"}), {}),  # a PDB with no disruption left, a loading server
        (share("b", 300, job="j"), frozenset(), {"j": Job(id="j", min_available=2)}),
    ],
    ids=["do-not-disrupt", "min-runtime", "protected-by-the-shell", "gang-member"],
)
def test_what_must_not_move_stays(
    task: Task, protected: frozenset[str], jobs: dict[str, Job]
) -> None:
    snap = cluster([[(share("a", 900), 0), (share("a2", 900), 1)], [(task, 0)]])
    moves = consolidate(FW, snap, ON, now=NOW, budget=5, jobs=jobs, protected=protected)
    assert all(e.task_id != "b" for m in moves for e in m.evictions)


def test_a_move_that_does_not_fit_is_not_made() -> None:
    snap = cluster([[(share("a", 900), 0), (share("a2", 900), 1)], [(share("b", 300), 0)]])
    # b has no room on n0's busy GPUs, and n0's two 900s do not both fit n1's one free GPU
    assert consolidate(FW, snap, ON, now=NOW, budget=5) == ()


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.lists(
            st.tuples(
                st.sampled_from([100, 300, 500]),
                st.integers(0, 1),
                st.booleans(),
                st.sampled_from([0.0, NOW * 2]),
            ),
            max_size=3,
        ),
        min_size=1,
        max_size=4,
    )
)
def test_moves_evict_only_movable_pods_and_place_all_of_them(
    spec: list[list[tuple[int, int, bool, float]]],
) -> None:
    loads = []
    k = 0
    for node in spec:
        load: list[tuple[Task, int]] = []
        used = [0, 0]
        for milli, slot, dnd, min_run in node:
            if used[slot] + milli > 1000:
                continue
            used[slot] += milli
            load.append((share(f"t{k}", milli, do_not_disrupt=dnd, min_runtime_s=min_run), slot))
            k += 1
        loads.append(load)
    snap = cluster(loads)
    by_id = {a.task.id: a for a in snap.running}
    for m in consolidate(FW, snap, ON, now=NOW, budget=10):
        evicted = {e.task_id for e in m.evictions}
        assert all(movable(by_id[t], NOW, {}) for t in evicted)
        assert {p.task_id for p in m.placements} == evicted
        assert all(p.node != m.node for p in m.placements)
        assert evicted == {a.task.id for a in snap.running if snap.node_names[a.node_row] == m.node}
