"""sim.training: the generator's distribution, the all-reduce cost arithmetic, and a small
blind-vs-kallot comparison (all gangs all-or-nothing after every session)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kallot.core import topology
from kallot.core.decision import DeviceAssignment, Placement
from kallot.core.errors import ConfigError
from kallot.core.resources import SharingMode
from kallot.core.workload import TopologyMode
from kallot.sim import training


def test_generator_follows_the_documented_bounds_and_is_seeded() -> None:
    jobs = training.generate(400, 352, seed=3)
    assert jobs == training.generate(400, 352, seed=3)
    assert jobs != training.generate(400, 352, seed=4)
    assert all(1 <= j.pods <= 64 and j.gpus in (1, 2, 4, 8) for j in jobs)
    assert all(j.total_gpus <= training.MAX_JOB_GPUS for j in jobs)
    lo, hi = training.RUNTIME_RANGE_S
    assert all(lo <= j.compute_s <= hi for j in jobs)
    arrivals = [j.arrival for j in jobs]
    assert arrivals == sorted(arrivals) and arrivals[0] == 0.0
    # the table's shares show up: 1-pod jobs are the most common, 64-pod ones exist only as 64x1
    share_single = sum(j.pods == 1 for j in jobs) / len(jobs)
    assert 0.3 < share_single < 0.6
    assert all(j.gpus == 1 for j in jobs if j.pods == 64)


@pytest.mark.parametrize(
    ("call", "field"),
    [
        pytest.param(lambda: training.generate(0, 8, seed=0), "jobs", id="no jobs"),
        pytest.param(lambda: training.generate(5, 8, seed=0, load=0), "load", id="zero load"),
        pytest.param(lambda: training.ClusterSpec(racks=0), "cluster.racks", id="no racks"),
        pytest.param(lambda: training.ClusterSpec(kinds=("dgx-9",)), "cluster.kinds", id="kind"),
    ],
)
def test_bad_input_names_the_field(call, field: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError) as err:
        call()
    assert err.value.field == field


def _placement(row: int, slots: list[int]) -> Placement:
    devices = tuple(
        DeviceAssignment(slot=s, uuid="", milli=1000, mem_mib=0, mode=SharingMode.EXCLUSIVE)
        for s in slots
    )
    return Placement(task_id=f"t{row}", node=f"n{row}", node_row=row, devices=devices)


HGX = topology.hgx_8gpu_nvswitch()
PCIE = topology.pcie_8gpu_2numa()
CLUSTER = [
    training.ClusterNode("n0", "b0", "r0", HGX),
    training.ClusterNode("n1", "b0", "r0", HGX),
    training.ClusterNode("n2", "b0", "r1", HGX),
    training.ClusterNode("n3", "b1", "r2", HGX),
    training.ClusterNode("n4", "b1", "r2", PCIE),
]


@pytest.mark.parametrize(
    ("placements", "gbps", "one_island"),
    [
        # 8 GPUs on one NVSwitch node: NV18 = 450 GB/s
        pytest.param([_placement(0, list(range(8)))], 450.0, True, id="one HGX node"),
        # two nodes in one rack: min(450, NIC 50 GB/s per GPU) = 50
        pytest.param(
            [_placement(0, list(range(8))), _placement(1, list(range(8)))],
            50.0,
            False,
            id="one rack",
        ),
        # across racks in one block: 50 / 2 (spine 2:1) = 25
        pytest.param(
            [_placement(0, list(range(8))), _placement(2, list(range(8)))],
            25.0,
            False,
            id="two racks",
        ),
        # across blocks: 50 / 4 (core 4:1) = 12.5
        pytest.param(
            [_placement(0, list(range(8))), _placement(3, list(range(8)))],
            12.5,
            False,
            id="two blocks",
        ),
        # PCIe node, GPUs 0 and 4 on two sockets: SYS = 10 GB/s
        pytest.param([_placement(4, [0, 4])], 10.0, False, id="PCIe across sockets"),
    ],
)
def test_allreduce_cost_arithmetic(
    placements: list[Placement], gbps: float, one_island: bool
) -> None:
    k = sum(len(p.devices) for p in placements)
    job = training.TrainingJob("j", len(placements), k // len(placements), 0.0, 3600.0, 14.0)
    cost = training.allreduce_cost(job, placements, CLUSTER)
    assert cost.bottleneck_gbps == pytest.approx(gbps)
    assert cost.one_island is one_island
    # ring all-reduce: 2 (k-1)/k * S / B, e.g. one HGX node: 2 * 7/8 * 14 / 450 = 0.0544 s
    assert cost.allreduce_s == pytest.approx(2 * (k - 1) / k * 14.0 / gbps)
    # job time: 3600 s compute in 3600 steps of 1 s, plus one all-reduce per step
    assert training.job_runtime(job, cost) == pytest.approx(3600 + 3600 * cost.allreduce_s)


def test_single_gpu_job_has_no_communication() -> None:
    job = training.TrainingJob("j", 1, 1, 0.0, 100.0, 14.0)
    cost = training.allreduce_cost(job, [_placement(4, [3])], CLUSTER)
    assert cost.allreduce_s == 0.0 and training.job_runtime(job, cost) == 100.0


def test_small_comparison_keeps_gangs_whole_and_reports_every_key() -> None:
    spec = training.ClusterSpec(racks=3, nodes_per_rack=2, racks_per_block=2)
    done: list[int] = []
    cmp = training.compare(n_jobs=25, seed=1, spec=spec, progress=done.append)
    s = cmp.summary()
    assert len(done) == 2 * 25  # every job finished under both policies
    assert s["partial_gangs_after_session"] == 0
    assert s["seed"] == 1 and s["gangs"] == sum(j.pods > 1 for j in cmp.jobs)
    for key in ("in_one_island_pct", "in_one_rack_pct"):
        pair = s[key]
        assert isinstance(pair, dict) and set(pair) == {"blind", "kallot"}
        assert all(0.0 <= v <= 100.0 or math.isnan(v) for v in pair.values())
    ratio = s["est_job_time_ratio"]
    assert isinstance(ratio, float) and ratio > 0
    # every job ran exactly once per policy, and never before it arrived
    for run in (cmp.blind, cmp.aware):
        assert set(run.results) == {j.id for j in cmp.jobs}
        assert all(r.start >= r.job.arrival and r.end > r.start for r in run.results.values())


def test_required_rack_gangs_wait_for_a_rack() -> None:
    spec = training.ClusterSpec(racks=3, nodes_per_rack=2, racks_per_block=2)
    cmp = training.compare(n_jobs=20, seed=2, spec=spec, gang_mode=TopologyMode.REQUIRED)
    multi = [r for r in cmp.aware.results.values() if r.job.pods > 1]
    assert multi and all(r.cost.racks == 1 for r in multi)  # never spans racks
    assert cmp.summary()["partial_gangs_after_session"] == 0


def test_fabric_oversubscription_below_one_is_rejected() -> None:
    with pytest.raises(ConfigError) as err:
        training.Fabric(rack_oversubscription=0.5)
    assert err.value.field == "fabric.rack_oversubscription"


def test_overlap_hides_communication_behind_compute() -> None:
    job = training.TrainingJob("j", 2, 8, 0.0, 100.0, 14.0)
    # across blocks: 2 * 15/16 * 14 / 12.5 = 2.1 s per 1 s step
    cost = training.allreduce_cost(
        job, [_placement(0, list(range(8))), _placement(3, list(range(8)))], CLUSTER
    )
    assert cost.allreduce_s == pytest.approx(2.1)
    assert training.job_runtime(job, cost) == pytest.approx(100 + 100 * 2.1)
    # half a step hidden: 2.1 - 0.5 = 1.6 exposed per step
    assert training.job_runtime(job, cost, 0.5) == pytest.approx(100 + 100 * 1.6)
    # one HGX node: 0.054 s, all of it hidden
    inside = training.allreduce_cost(job, [_placement(0, list(range(8)))], CLUSTER)
    assert training.job_runtime(job, inside, 1.0) == pytest.approx(100.0)


@settings(max_examples=12, deadline=None)
@given(
    st.integers(0, 10_000),
    st.sampled_from(list(TopologyMode)),
    st.integers(1, 3),
    st.integers(1, 3),
)
def test_gangs_are_whole_after_every_session(seed: int, mode, racks: int, nodes: int) -> None:  # type: ignore[no-untyped-def]
    # Many sessions (arrivals and completions) on small random clusters: simulate() counts any
    # gang with 0 < placed < min_available after a session and raises if a GPU is given twice.
    spec = training.ClusterSpec(racks=racks, nodes_per_rack=nodes, racks_per_block=2)
    cmp = training.compare(n_jobs=10, seed=seed, spec=spec, gang_mode=mode)
    assert cmp.blind.partial_gangs == cmp.aware.partial_gangs == 0
    assert cmp.aware.sessions > 1
    if mode is TopologyMode.REQUIRED:
        assert all(r.cost.racks == 1 for r in cmp.aware.results.values())
