"""Framework basics: filters AND, diagnosis wording, tie-break, gangs, statement rollback."""

from __future__ import annotations

import numpy as np
import pytest

from kallot.core import policies
from kallot.core.framework.runner import Framework
from kallot.core.scheduler import Scheduler
from kallot.core.session.session import Session
from kallot.core.workload import Job
from kallot.testing.builders import make_node, make_task, snapshot


def scheduler() -> Scheduler:
    return Scheduler(Framework(policies.PROFILES["first-fit"], policies.builtin_registry()))


def test_share_lands_on_gpu_with_room_and_is_charged_proportional_memory() -> None:
    snap = snapshot(
        make_node("a").gpus(1, used_milli=[800]), make_node("b").gpus(1, used_milli=[400])
    )
    d = scheduler().run_session(
        snap, [make_task("t").gpu(milli=500).obj()], now=0, rng=np.random.default_rng(0)
    )
    (p,) = d.placements
    assert p.node == "b"
    # H100-80GB: 81559 MiB; half of it, rounded down: 81559 * 500 // 1000 = 40779
    assert (p.devices[0].milli, p.devices[0].mem_mib) == (500, 40779)


@pytest.mark.parametrize(
    ("task", "expected"),
    [
        pytest.param(
            make_task("t").gpu(count=8).obj(),
            "0/3 nodes are available: 1 node: fewer than 8 GPUs on the node; "
            "1 node: fewer than 8 idle GPUs (most idle on one node: 4); 1 node: no GPUs",
            id="eight whole GPUs",
        ),
        pytest.param(
            make_task("t").gpu(models=["T4"]).obj(),
            "0/3 nodes are available: 2 nodes: GPU model not in [T4]; 1 node: no GPUs",
            id="wrong model",
        ),
        pytest.param(
            make_task("t").cpu(100_000).obj(),
            "0/3 nodes are available: 3 nodes: insufficient cpu: need 100000m, largest free is "
            "64000m",
            id="cpu",
        ),
    ],
)
def test_diagnosis_names_reasons_with_counts(task, expected) -> None:  # type: ignore[no-untyped-def]
    snap = snapshot(
        make_node("a").gpus(2),
        make_node("b").gpus(8, used_milli=[1000, 1000, 300, 300]),
        make_node("c"),
    )
    d = scheduler().run_session(snap, [task], now=0, rng=np.random.default_rng(0))
    assert not d.placements
    assert d.unschedulable[0].diagnosis.message() == expected


def test_ties_follow_seeded_node_order_and_are_deterministic() -> None:
    snap = snapshot(*(make_node(f"n{i}").gpus(1) for i in range(20)))
    tasks = [make_task(f"t{i}").gpu(milli=100).created(i).obj() for i in range(5)]
    runs = [
        [
            p.node
            for p in scheduler()
            .run_session(snap, tasks, now=0, rng=np.random.default_rng(s))
            .placements
        ]
        for s in (7, 7, 8)
    ]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_gang_is_all_or_nothing() -> None:
    snap = snapshot(make_node("a").gpus(4), make_node("b").gpus(1))
    jobs = {"g": Job(id="g", min_available=3)}
    gang = [make_task(f"g{i}").gpu(count=2).job("g").created(i).obj() for i in range(3)]
    d = scheduler().run_session(snap, gang, now=0, rng=np.random.default_rng(0), jobs=jobs)
    assert not d.placements
    assert {u.task_id for u in d.unschedulable} == {"g0", "g1", "g2"}
    assert "only 2 of 3" in d.unschedulable[0].diagnosis.message()


def test_statement_rollback_restores_scratch_bit_for_bit() -> None:
    snap = snapshot(make_node("a").gpus(4, used_milli=[300]), make_node("b").gpus(2))
    fw = Framework(policies.PROFILES["first-fit"], policies.builtin_registry())
    session = Session(fw, snap, now=0, rng=np.random.default_rng(0), jobs={})
    before = {
        k: getattr(session.scratch, k).copy()
        for k in (
            "gpu_used_milli",
            "gpu_used_mem",
            "gpu_clients",
            "node_cpu_used",
            "node_pods_used",
            "node_shapes",
        )
    }
    cp = session.statement.checkpoint()
    for i in range(4):
        session.place(make_task(f"t{i}").cpu(10).gpu(milli=250 * (i + 1) % 1000 or 1000).obj())
    session.statement.rollback(cp)
    for k, v in before.items():
        assert np.array_equal(getattr(session.scratch, k), v), k
