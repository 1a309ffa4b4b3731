"""Hard constraints hold under every policy (issue 16): one test per constraint x policy.

Each cluster is built so that the constraint is what decides: the node (or GPUs) a policy's
scores would pick otherwise break it, and a node (or domain) that meets it exists; a second
cluster has none, and the task must then stay pending. Eight seeds each (the seeded node order
breaks ties differently).
"""

from __future__ import annotations

import numpy as np
import pytest

from kallot.config import presets
from kallot.core import policies
from kallot.core.decision import Decision
from kallot.core.framework.profile import Profile
from kallot.core.framework.runner import Framework
from kallot.core.resources import GPU_MODELS, SharingMode
from kallot.core.scheduler import Scheduler
from kallot.core.snapshot import GpuSpec, NodeSpec, Snapshot, SnapshotBuilder
from kallot.core.workload import DeviceRequest, Job, Task, TopologyConstraint, TopologyMode

POLICIES = (*presets.POLICY_NAMES, "first-fit", "topology")
SEEDS = range(8)
MODEL = "H100-80GB"
REQUIRED = TopologyMode.REQUIRED


def gpu(*, island: int = -1, numa: int = -1, used: bool = False, model: str = MODEL) -> GpuSpec:
    mem = GPU_MODELS[model].memory_mib
    return GpuSpec(
        model=model,
        mem_mib=mem,
        mode=SharingMode.MPS,
        island=island,
        numa=numa,
        used_milli=1000 if used else 0,
        used_mem=mem if used else 0,
        clients=1 if used else 0,
    )


def node(name: str, gpus: list[GpuSpec], **labels: str) -> NodeSpec:
    return NodeSpec(name=name, cpu_milli=64_000, mem_mib=1 << 20, gpus=gpus, labels=labels)


def run(policy: str, snap: Snapshot, tasks: list[Task], seed: int, **jobs: Job) -> Decision:
    sched = Scheduler(Framework(presets.PROFILES[policy], policies.builtin_registry()))
    return sched.run_session(snap, tasks, now=0, rng=np.random.default_rng(seed), jobs=jobs)


def four(level: str, task_id: str = "t", job: str = "") -> Task:
    c = TopologyConstraint(mode=REQUIRED, level=level)
    return Task(id=task_id, gpu=DeviceRequest(count=4, topology=c), job=job)


# -- in-node: required:nvlink, required:numa ---------------------------------------------------


def linked_cluster(level: str, *, with_good: bool) -> Snapshot:
    """Node 'flat': 8 idle GPUs, no NVLink and no NUMA information (the emptiest node, which
    packing and fragmentation scores like least and spreading ones like most). Node 'split':
    two groups of 4 with one GPU used in each (6 free, never 4 in one group). Node 'good' (when
    asked): two groups of 4, one of them wholly free."""

    def grouped(i: int, used: bool) -> GpuSpec:
        if level == "nvlink":
            return gpu(island=i // 4, used=used)
        return gpu(numa=i // 4, used=used)

    b = SnapshotBuilder().add(node("flat", [gpu() for _ in range(8)]))
    b.add(node("split", [grouped(i, used=i in (0, 4)) for i in range(8)]))
    if with_good:
        b.add(node("good", [grouped(i, used=i < 2) for i in range(8)]))
    return b.build()


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("level", ["nvlink", "numa"])
def test_required_in_node_group_holds(policy: str, level: str) -> None:
    snap = linked_cluster(level, with_good=True)
    for seed in SEEDS:
        d = run(policy, snap, [four(level)], seed)
        (p,) = d.placements
        assert p.node == "good" and sorted(x.slot for x in p.devices) == [4, 5, 6, 7], (seed, p)
    bad = linked_cluster(level, with_good=False)
    for seed in SEEDS:
        d = run(policy, bad, [four(level)], seed)
        assert not d.placements
        (u,) = d.unschedulable
        assert "in one" in u.diagnosis.message() and not u.diagnosis.fault


@pytest.mark.parametrize("policy", POLICIES)
def test_required_nvlink_gang_members_never_land_without_nvlink(policy: str) -> None:
    # two 4-GPU members; 'flat' A100s (no NVLink) could take both, one NVLink island of 4
    # free on each H100 node
    b = SnapshotBuilder().add(node("flat", [gpu(model="A100-80GB") for _ in range(8)]))
    for name in ("h0", "h1"):
        b.add(node(name, [gpu(island=i // 4, used=i < 4) for i in range(8)]))
    snap = b.build()
    tasks = [four("nvlink", f"m{i}", job="ns/g") for i in range(2)]
    for seed in SEEDS:
        d = run(policy, snap, tasks, seed, **{"ns/g": Job(id="ns/g", min_available=2)})
        assert sorted(p.node for p in d.placements) == ["h0", "h1"], seed
        for p in d.placements:
            assert sorted(x.slot for x in p.devices) == [4, 5, 6, 7]


@pytest.mark.parametrize("policy", POLICIES)
def test_required_level_that_is_not_in_node_pends_unresolvable(policy: str) -> None:
    snap = linked_cluster("nvlink", with_good=True)
    for seed in SEEDS[:2]:
        d = run(policy, snap, [four("rack")], seed)
        (u,) = d.unschedulable
        assert not d.placements and u.diagnosis.unresolvable
        assert "not an in-node level" in u.diagnosis.message()


# -- a gang's required domain ----------------------------------------------------------------


@pytest.mark.parametrize("policy", POLICIES)
def test_required_rack_keeps_the_gang_in_one_rack(policy: str) -> None:
    # rack r0: a (2 free) + b (2 free); rack r1: c (4 free, the emptiest node) + d (2 free).
    # Three 2-GPU members fit r1 (4 + 2) but not r0 (2 + 2); spread over racks they would fit
    # in many ways.
    rack = "kallot.io/rack"
    b = SnapshotBuilder()
    b.add(node("a", [gpu(used=i < 2) for i in range(4)], **{rack: "r0"}))
    b.add(node("b", [gpu(used=i < 2) for i in range(4)], **{rack: "r0"}))
    b.add(node("c", [gpu() for i in range(4)], **{rack: "r1"}))
    b.add(node("d", [gpu(used=i < 2) for i in range(4)], **{rack: "r1"}))
    snap = b.build()
    job = Job(id="ns/g", min_available=3, topology=TopologyConstraint(mode=REQUIRED, level=rack))
    tasks = [Task(id=f"m{i}", gpu=DeviceRequest(count=2), job="ns/g") for i in range(3)]
    for seed in SEEDS:
        d = run(policy, snap, tasks, seed, **{"ns/g": job})
        assert len(d.placements) == 3, (seed, [u.diagnosis.message() for u in d.unschedulable])
        assert {p.node for p in d.placements} <= {"c", "d"}, seed
    # four members fit no rack (they would fit spread over both): the gang pends
    tasks.append(Task(id="m3", gpu=DeviceRequest(count=2), job="ns/g"))
    job4 = Job(id="ns/g", min_available=4, topology=job.topology)
    for seed in SEEDS[:2]:
        d = run(policy, snap, tasks, seed, **{"ns/g": job4})
        assert not d.placements and len(d.unschedulable) == 4


# -- the other hard constraints: models and node selectors -----------------------------------


@pytest.mark.parametrize("policy", POLICIES)
def test_models_and_node_selector_hold(policy: str) -> None:
    snap = (
        SnapshotBuilder()
        .add(node("a100", [gpu(model="A100-80GB") for _ in range(8)], pool="x"))
        .add(node("h100", [gpu(used=i < 6) for i in range(8)], pool="y"))
        .add(node("h100x", [gpu(used=i < 7) for i in range(8)], pool="x"))
        .build()
    )
    by_model = Task(id="m", gpu=DeviceRequest(count=1, models=frozenset({MODEL})))
    by_label = Task(id="s", gpu=DeviceRequest(count=1), node_selector={"pool": "y"})
    for seed in SEEDS:
        d = run(policy, snap, [by_model, by_label], seed)
        got = {p.task_id: p.node for p in d.placements}
        assert got["m"] in ("h100", "h100x") and got["s"] == "h100", seed


def test_a_profile_with_neither_topology_plugin_refuses_required_rather_than_violate_it() -> None:
    snap = SnapshotBuilder().add(node("a", [gpu() for _ in range(8)], **{"kallot.io/rack": "r"}))
    c = TopologyConstraint(mode=REQUIRED, level="rack")
    blind = Profile(name="blind", filter=("NodeResourcesFit", "NodeSelector", "DeviceFit"))
    sched = Scheduler(Framework(blind, policies.builtin_registry()))
    tasks = [Task(id=f"m{i}", gpu=DeviceRequest(count=1), job="g") for i in range(2)]
    job = Job(id="g", min_available=2, topology=c)
    d = sched.run_session(snap.build(), tasks, now=0, rng=np.random.default_rng(0), jobs={"g": job})
    assert not d.placements and len(d.unschedulable) == 2
    diag = d.unschedulable[0].diagnosis
    assert diag.unresolvable and diag.message() == (
        "gang g: requires one 'rack' domain but profile 'blind' has no Topology or "
        "RequiredTopology plugin to honour it"
    )
