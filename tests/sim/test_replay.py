"""Replay mode (sim.replay): pods hold devices for their run time; the queue waits for room."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kallot.core.errors import KallotError
from kallot.sim import replay
from kallot.sim.trace import NodeRow, PodRow

ONE_GPU = [NodeRow("n0", cpu_milli=32000, memory_mib=65536, gpus=1, model="T4")]


def pod(name: str, milli: int, created: float, deleted: float, count: int = 1) -> PodRow:
    return PodRow(
        name=name,
        cpu_milli=1000,
        memory_mib=1024,
        num_gpu=count,
        gpu_milli=milli,
        creation_time=created,
        deletion_time=deleted,
        scheduled_time=created,
    )


def run(pods: list[PodRow], nodes: list[NodeRow] = ONE_GPU, **kw: Any) -> replay.ReplayResult:
    return replay.replay(nodes, pods, policy="kallot", seed=1, node_fraction=1.0, **kw)


def test_second_whole_gpu_waits_for_the_first_to_leave() -> None:
    # a holds the only GPU from t=0 to t=100; b arrives at t=10 and runs 40 s, so it starts at
    # t=100 (delay 90) and leaves at t=140.
    r = run([pod("a", 1000, 0, 100), pod("b", 1000, 10, 50)])
    assert list(r.delays) == [0.0, 90.0]
    assert r.unplaced == 0
    assert r.times[-1] == 140.0 and r.used_milli[-1] == 0
    assert r.used_milli.max() == 1000


def test_shares_run_side_by_side() -> None:
    r = run([pod("a", 500, 0, 100), pod("b", 500, 10, 50)])
    assert list(r.delays) == [0.0, 0.0]
    assert r.used_milli.max() == 1000


def test_pod_that_fits_nowhere_stays_unplaced() -> None:
    r = run([pod("big", 1000, 0, 10, count=2), pod("a", 1000, 1, 5)])
    assert r.unplaced == 1 and list(r.delays) == [0.0]


def test_allocation_never_exceeds_capacity_and_speedup_compresses_arrivals() -> None:
    rng = np.random.default_rng(0)
    pods = [
        pod(f"p{i}", int(rng.choice([250, 500, 1000])), float(t), float(t + rng.integers(5, 50)))
        for i, t in enumerate(np.sort(rng.integers(0, 400, size=60)))
    ]
    nodes = [NodeRow(f"n{i}", 64000, 262144, 2, "T4") for i in range(2)]
    slow = run(pods, nodes)
    fast = run(pods, nodes, speedup=4.0)
    for r in (slow, fast):
        assert r.used_milli.max() <= r.capacity_milli == 4000
        assert np.all(r.delays >= 0)
        assert r.unplaced == 0
    assert fast.arrival_end == pytest.approx(slow.arrival_end / 4)
    assert fast.delay_percentiles()["p90"] >= slow.delay_percentiles()["p90"]


def test_offered_load_counts_run_time_inside_the_window() -> None:
    # Window 0..100 s; a runs 100 s of it on one of 2 GPUs (capacity 2000 milli): load 0.5.
    pods = [pod("a", 1000, 0, 200), pod("b", 1000, 100, 101)]
    assert replay.offered_load(pods, 2000, 1.0) == pytest.approx((1000 * 100 + 0) / (2000 * 100))


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        pytest.param({"speedup": 0.5}, "replay speedup", id="speedup"),
        pytest.param({"node_fraction": 0.0}, "replay node fraction", id="fraction"),
    ],
)
def test_bad_settings_name_the_field(kw: dict[str, float], field: str) -> None:
    args: dict[str, Any] = {"node_fraction": 1.0, **kw}
    with pytest.raises(KallotError, match=field):
        replay.replay(ONE_GPU, [pod("a", 1000, 0, 1)], policy="kallot", seed=1, **args)
