"""The FGD paper's protocol (sim.openb): inflation, per-event series, determinism."""

from __future__ import annotations

import numpy as np
import pytest

from kallot.sim import openb, trace
from kallot.sim.trace import NodeRow, PodRow


@pytest.fixture(scope="module")
def bundled() -> tuple[list[NodeRow], list[PodRow]]:
    return (
        trace.read_nodes(trace.bundled(trace.BUNDLED_NODES)),
        trace.read_pods(trace.bundled(trace.BUNDLED_DEFAULT)),
    )


def small(
    nodes: list[NodeRow], pods: list[PodRow], n_nodes: int = 40, n_pods: int = 300
) -> tuple[list[NodeRow], list[PodRow]]:
    gpu_nodes = [n for n in nodes if n.gpus > 0][:n_nodes]
    return gpu_nodes, pods[:n_pods]


def test_inflation_stops_at_the_target(bundled: tuple[list[NodeRow], list[PodRow]]) -> None:
    nodes, pods = small(*bundled)
    capacity = 1000 * sum(n.gpus for n in nodes)
    order = openb.arrival_order(pods, capacity, np.random.default_rng(7))
    total = sum(p.gpu_milli_total for p in order)
    # Deflated (300 pods ask more than 1.3 x 40 nodes' GPUs) by seeded removal to <= 130%.
    assert total <= 1.3 * capacity
    biggest = max(p.gpu_milli_total for p in pods)
    assert total > 1.3 * capacity - biggest


def test_inflation_appends_resamples(bundled: tuple[list[NodeRow], list[PodRow]]) -> None:
    nodes, pods = bundled[0], bundled[1][:50]
    capacity = 1000 * sum(n.gpus for n in nodes)
    order = openb.arrival_order(pods, capacity, np.random.default_rng(7))
    assert {p.name for p in pods} <= {p.name for p in order}
    tuned = [p for p in order if "-tuned-" in p.name]
    assert len(order) == len(pods) + len(tuned) and tuned
    # tuneUpPods stops when the next resample's per-GPU milli would cross 130%, so the total
    # lands within one pod's total of the target.
    total = sum(p.gpu_milli_total for p in order)
    assert abs(total - 1.3 * capacity) <= max(p.gpu_milli_total for p in pods)


@pytest.mark.parametrize("policy", ["fgd", "kallot", "bestfit", "random"])
def test_series_are_consistent(bundled: tuple[list[NodeRow], list[PodRow]], policy: str) -> None:
    nodes, pods = small(*bundled)
    run = openb.run(nodes, pods, policy=policy, seed=42, workload="small")
    assert np.all(np.diff(run.arrived_milli) >= 0)
    assert np.all(np.diff(run.used_milli) >= 0)  # no departures in this protocol
    assert np.all(run.used_milli <= run.capacity_milli)
    assert np.all(run.used_milli + run.idle_milli == run.capacity_milli)
    assert np.all((run.frag_milli >= -1e-6) & (run.frag_milli <= run.idle_milli + 1e-6))
    # What was allocated is exactly what the placed pods asked for.
    order = openb.arrival_order(pods, run.capacity_milli, np.random.default_rng(42))
    asked = sum(p.gpu_milli_total for p, ok in zip(order, run.placed, strict=True) if ok)
    assert asked == run.used_milli[-1]
    assert 0 <= run.unallocated_at(100) <= 100


def test_same_seed_same_run_other_seed_differs(
    bundled: tuple[list[NodeRow], list[PodRow]],
) -> None:
    nodes, pods = small(*bundled)
    a = openb.run(nodes, pods, policy="kallot", seed=3)
    b = openb.run(nodes, pods, policy="kallot", seed=3)
    c = openb.run(nodes, pods, policy="kallot", seed=4)
    assert np.array_equal(a.placed, b.placed) and np.array_equal(a.frag_milli, b.frag_milli)
    assert not np.array_equal(a.arrived_milli, c.arrived_milli)


def test_arrived_pct_rounds_like_the_paper() -> None:
    run = openb.Run(
        workload="w",
        policy="p",
        seed=0,
        capacity_milli=2000,
        arrived_milli=np.array([995, 1005, 2000]),
        used_milli=np.array([995, 1005, 1500]),
        frag_milli=np.zeros(3),
        idle_milli=np.array([1005, 995, 500]),
        placed=np.ones(3, dtype=np.bool_),
        wall_s=0.0,
        schedule_s=0.0,
    )
    # 995/2000 = 49.75% -> 50, 1005/2000 = 50.25% -> 50, 100%.
    assert list(run.arrived_pct()) == [50, 50, 100]
    assert run.alloc_at(50) == pytest.approx((49.75 + 50.25) / 2)
    assert run.unallocated_at(100) == pytest.approx(25.0)


def test_a_jump_over_x_reads_the_state_before_the_crossing() -> None:
    # Capacity 1000: arrivals 40% -> 96% -> 160% (one big pod jumps over 97..159%).
    run = openb.Run(
        workload="w",
        policy="p",
        seed=0,
        capacity_milli=1000,
        arrived_milli=np.array([400, 960, 1600]),
        used_milli=np.array([400, 900, 900]),
        frag_milli=np.zeros(3),
        idle_milli=np.array([600, 100, 100]),
        placed=np.array([True, True, False]),
        wall_s=0.0,
        schedule_s=0.0,
    )
    assert run.alloc_at(100) == pytest.approx(90.0)  # after the 96% event
    assert np.isnan(run.alloc_at(200))  # never reached
