"""Gangs (core.gang through Allocate): all-or-nothing inside one session, inside one topology
domain when asked, with a diagnosis when they cannot start; properties on random clusters."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kallot.config import presets
from kallot.core import gang, policies, topology
from kallot.core.actions.gang_allocate import place_gang
from kallot.core.decision import Decision
from kallot.core.framework.runner import Framework
from kallot.core.scheduler import Scheduler
from kallot.core.session.session import Session
from kallot.core.snapshot import Allocation, Snapshot, SnapshotBuilder
from kallot.core.workload import Job, Task, TopologyConstraint, TopologyMode
from kallot.testing.builders import NodeBuilder, make_node, make_task, snapshot

RACK = "kallot.io/rack"
BLOCK = "kallot.io/block"


def hgx(name: str, rack: str, block: str = "b0", busy: int = 0) -> NodeBuilder:
    node = (
        make_node(name).topology(topology.hgx_8gpu_nvswitch()).label(RACK, rack).label(BLOCK, block)
    )
    for gpu in node.spec().gpus[:busy]:
        gpu.used_milli, gpu.used_mem, gpu.clients = 1000, gpu.mem_mib, 1
    return node


def gang_of(job: str, pods: int, gpus: int) -> list[Task]:
    return [make_task(f"{job}-{i}").gpu(count=gpus).job(job).created(i).obj() for i in range(pods)]


def constraint(mode: TopologyMode, level: str) -> TopologyConstraint:
    return TopologyConstraint(mode=mode, level=level)


def session_run(
    snap: Snapshot, tasks: list[Task], jobs: dict[str, Job], policy: str = "topology"
) -> Decision:
    fw = Framework(presets.profile(policy), policies.builtin_registry())
    return Scheduler(fw).run_session(snap, tasks, now=0, rng=np.random.default_rng(0), jobs=jobs)


def racks_of(d: Decision, snap: Snapshot) -> set[str | None]:
    return {snap.labels.value_of(RACK, p.node_row) for p in d.placements}


def test_required_rack_goes_to_the_best_fitting_rack() -> None:
    # r0: 2 free nodes (16 GPUs), r1: 4 free nodes (32 GPUs). A 2x8 gang fits both; best fit
    # (fewest free GPUs that hold it) keeps r1 whole for a larger gang.
    snap = snapshot(
        *(hgx(f"a{i}", "r0") for i in range(2)), *(hgx(f"b{i}", "r1") for i in range(4))
    )
    jobs = {"g": Job(id="g", min_available=2, topology=constraint(TopologyMode.REQUIRED, "rack"))}
    d = session_run(snap, gang_of("g", 2, 8), jobs)
    assert len(d.placements) == 2 and racks_of(d, snap) == {"r0"}


def test_required_rack_that_no_rack_can_hold_stays_pending_with_nothing_held() -> None:
    # 2 racks of 2 nodes, one GPU busy in each rack: 15 free per rack, 30 in all. A 3x8 gang
    # needs 24 in one rack.
    snap = snapshot(
        hgx("a0", "r0", busy=1), hgx("a1", "r0"), hgx("b0", "r1", busy=1), hgx("b1", "r1")
    )
    jobs = {"g": Job(id="g", min_available=3, topology=constraint(TopologyMode.REQUIRED, "rack"))}
    d = session_run(snap, gang_of("g", 3, 8), jobs)
    assert not d.placements
    assert [u.task_id for u in d.unschedulable] == ["g-0", "g-1", "g-2"]
    assert d.unschedulable[0].diagnosis.message() == (
        "gang g: no rack has 24 free GPUs (most free in one: 15)"
    )


def test_required_rack_skips_a_rack_whose_free_gpus_are_fragmented() -> None:
    # r0 has 16 free GPUs but as 4+4+8: a 2x8 gang needs two idle nodes, so r0 fails and r1 works
    snap = snapshot(
        hgx("a0", "r0", busy=4), hgx("a1", "r0", busy=4), hgx("a2", "r0"), hgx("b0", "r1"),
        hgx("b1", "r1"), hgx("b2", "r1"),
    )  # fmt: skip
    jobs = {"g": Job(id="g", min_available=2, topology=constraint(TopologyMode.REQUIRED, "rack"))}
    d = session_run(snap, gang_of("g", 2, 8), jobs)
    assert racks_of(d, snap) == {"r1"}


def test_preferred_rack_falls_back_to_the_cluster() -> None:
    snap = snapshot(
        hgx("a0", "r0", busy=1), hgx("a1", "r0"), hgx("b0", "r1", busy=1), hgx("b1", "r1")
    )
    jobs = {"g": Job(id="g", min_available=2, topology=constraint(TopologyMode.PREFERRED, "rack"))}
    d = session_run(snap, gang_of("g", 2, 8), jobs)
    # each rack has one idle node: the gang spans both racks rather than wait
    assert len(d.placements) == 2 and racks_of(d, snap) == {"r0", "r1"}


def test_without_constraint_the_topology_score_keeps_a_small_gang_on_one_node() -> None:
    # 2 pods x 4 GPUs fit one idle HGX node; the other node has 4 free GPUs, which a pod fits too
    snap = snapshot(hgx("a0", "r0", busy=4), hgx("a1", "r0"), hgx("b0", "r1", busy=4))
    jobs = {"g": Job(id="g", min_available=2)}
    d = session_run(snap, gang_of("g", 2, 4), jobs)
    assert {p.node for p in d.placements} == {"a1"}
    slots = sorted(x.slot for p in d.placements for x in p.devices)
    assert slots == list(range(8))


@pytest.mark.parametrize(
    ("job", "tasks", "policy", "message", "unresolvable"),
    [
        pytest.param(
            Job(id="g", min_available=2, topology=constraint(TopologyMode.REQUIRED, "zone")),
            gang_of("g", 2, 1),
            "topology",
            "gang g: topology level 'zone' is not configured, expected one of block, rack, host "
            "or a node label key",
            True,
            id="unknown level",
        ),
        pytest.param(
            Job(id="g", min_available=3),
            gang_of("g", 2, 1),
            "topology",
            "gang g: 2 of 3 required tasks are pending or running (waiting for the rest)",
            False,
            id="not all members pending yet",
        ),
        pytest.param(
            Job(id="g", min_available=3),
            gang_of("g", 3, 8),
            "topology",
            "gang g: only 2 of 3 required tasks fit: 0/2 nodes are available: 2 nodes: fewer than "
            "8 idle GPUs (most idle on one node: 0)",
            False,
            id="cluster too small",
        ),
    ],
)
def test_gang_that_cannot_start_is_diagnosed(
    job: Job, tasks: list[Task], policy: str, message: str, unresolvable: bool
) -> None:
    snap = snapshot(hgx("a0", "r0"), hgx("a1", "r1"))
    d = session_run(snap, tasks, {job.id: job}, policy)
    assert not d.placements
    diag = d.unschedulable[0].diagnosis
    assert (diag.message(), diag.unresolvable) == (message, unresolvable)
    assert {u.task_id for u in d.unschedulable} == {t.id for t in tasks}


def test_failed_gang_leaves_the_scratch_as_it_was() -> None:
    # r0: one idle node and three with 6 free GPUs (26 free: enough by count for 3x8); r1: one
    # idle node. The rack try places one pod and fails, the cluster-wide try places two and
    # fails: both are rolled back.
    snap = snapshot(
        hgx("a0", "r0"), *(hgx(f"a{i}", "r0", busy=2) for i in range(1, 4)), hgx("b0", "r1")
    )
    fw = Framework(presets.profile("topology"), policies.builtin_registry())
    job = Job(id="g", min_available=3, topology=constraint(TopologyMode.PREFERRED, "rack"))
    session = Session(fw, snap, now=0, rng=np.random.default_rng(0), jobs={"g": job})
    before = (session.scratch.gpu_used_milli.copy(), session.scratch.node_pods_used.copy())
    outcome = place_gang(session, job, gang_of("g", 3, 8))
    assert not outcome.started and outcome.tries >= 2  # racks, then the whole cluster
    assert np.array_equal(session.scratch.gpu_used_milli, before[0])
    assert np.array_equal(session.scratch.node_pods_used, before[1])
    assert session.statement.placements() == []


# -- properties -----------------------------------------------------------------------------------

PRESETS = ("hgx-8-nvswitch", "pcie-8-2numa", "nvlink-pairs-4")
LEVELS = ("host", "rack", "block")


@st.composite
def cluster_and_gangs(draw: st.DrawFn) -> tuple[Snapshot, list[Task], dict[str, Job]]:
    nodes = []
    for r in range(draw(st.integers(1, 3))):
        for i in range(draw(st.integers(1, 3))):
            topo = topology.preset(draw(st.sampled_from(PRESETS)))
            node = (
                make_node(f"r{r}n{i}")
                .topology(topo)
                .label(RACK, f"r{r}")
                .label(BLOCK, f"b{r // 2}")
            )
            node = node.label(topology.HOSTNAME_LABEL, f"r{r}n{i}")
            for g in draw(st.sets(st.integers(0, topo.gpus - 1), max_size=topo.gpus)):
                gpu = node.spec().gpus[g]
                gpu.used_milli, gpu.used_mem, gpu.clients = 1000, gpu.mem_mib, 1
            nodes.append(node)
    tasks: list[Task] = []
    jobs: dict[str, Job] = {}
    for j in range(draw(st.integers(1, 4))):
        pods = draw(st.integers(1, 4))
        mode = draw(st.sampled_from(list(TopologyMode)))
        jobs[f"j{j}"] = Job(
            id=f"j{j}",
            min_available=draw(st.integers(1, pods)),
            topology=constraint(mode, draw(st.sampled_from(LEVELS))),
        )
        tasks += gang_of(f"j{j}", pods, draw(st.sampled_from([1, 2, 4, 8])))
    return snapshot(*nodes), tasks, jobs


@settings(max_examples=120, deadline=None)
@given(cluster_and_gangs(), st.sampled_from(["topology", "kallot"]))
def test_gangs_are_all_or_nothing_and_required_domains_hold(
    world: tuple[Snapshot, list[Task], dict[str, Job]], policy: str
) -> None:
    snap, tasks, jobs = world
    d = session_run(snap, tasks, jobs, policy)
    taken: set[tuple[int, int]] = set()
    for p in d.placements:
        for x in p.devices:
            assert (
                snap.gpu_valid[p.node_row, x.slot] and not snap.gpu_used_milli[p.node_row, x.slot]
            )
            assert (p.node_row, x.slot) not in taken  # never over-committed
            taken.add((p.node_row, x.slot))
    decided = [p.task_id for p in d.placements] + [u.task_id for u in d.unschedulable]
    assert sorted(decided) == sorted(t.id for t in tasks)  # every task decided exactly once
    cluster = topology.DEFAULT_CLUSTER_TOPOLOGY
    for job in jobs.values():
        mine = [p for p in d.placements if p.task_id.startswith(f"{job.id}-")]
        assert len(mine) == 0 or len(mine) >= job.min_available  # all-or-nothing
        if mine and job.topology.mode is TopologyMode.REQUIRED and gang.is_gang(job):
            # every built-in profile honours required domains (RequiredTopology)
            level = cluster.resolve(job.topology.level)
            assert level is not None
            domains = cluster.domains(snap.labels, level)
            assert len({int(domains[p.node_row]) for p in mine}) == 1
            assert int(domains[mine[0].node_row]) >= 0


def test_same_seed_same_decision() -> None:
    snap = snapshot(*(hgx(f"a{i}", "r0", busy=i) for i in range(3)), hgx("b0", "r1", busy=2))
    jobs = {
        "g": Job(id="g", min_available=2, topology=constraint(TopologyMode.PREFERRED, "rack")),
        "h": Job(id="h", min_available=3),
    }
    tasks = gang_of("g", 2, 4) + gang_of("h", 3, 2)
    runs = [session_run(snap, tasks, jobs) for _ in range(2)]
    assert runs[0].placements == runs[1].placements
    assert runs[0].device_reasons == runs[1].device_reasons


def test_running_members_count_towards_min_available() -> None:
    # g-0 already runs on a0, so g-1 alone completes min_available = 2; the gang score puts it
    # next to its peer: a1 (same rack) over b0 and b1 (another rack)
    b = SnapshotBuilder()
    for node in (hgx("a0", "r0", busy=8), hgx("a1", "r0"), hgx("b0", "r1"), hgx("b1", "r1")):
        b.add(node.spec())
    members = gang_of("g", 2, 8)
    b.running([Allocation(task=members[0], node_row=0)])
    d = session_run(b.build(), members[1:], {"g": Job(id="g", min_available=2)})
    assert [(p.task_id, p.node) for p in d.placements] == [("g-1", "a1")]


@pytest.mark.parametrize("policy", ["kallot", "topology", "first-fit"])
def test_a_quorum_of_small_members_starts_when_large_ones_come_first(policy: str) -> None:
    # 4 free GPUs; members in queue order 4, 4, 1, 1, 1 GPUs, min 3: in order the first 4-GPU
    # member takes the node and nothing else fits (1 of 3); smallest first, three 1-GPU members do
    snap = snapshot(hgx("a0", "r0", busy=4))
    big = [make_task(f"g-{i}").gpu(count=4).job("g").created(i).obj() for i in range(2)]
    small = [make_task(f"g-{i}").gpu(count=1).job("g").created(i).obj() for i in range(2, 5)]
    d = session_run(snap, [*big, *small], {"g": Job(id="g", min_available=3)}, policy)
    assert sorted(p.task_id for p in d.placements) == ["g-2", "g-3", "g-4"]
    assert sorted(u.task_id for u in d.unschedulable) == ["g-0", "g-1"]


@pytest.mark.parametrize("exclusive", [True, False])
def test_exclusive_gangs_get_a_domain_each(exclusive: bool) -> None:
    # Two racks of 2 nodes; each 1x8 gang fits a rack twice over. Best fit packs both into one
    # rack; exclusive placement (JobSet/LWS) gives each its own.
    snap = snapshot(
        *(hgx(f"a{i}", "r0") for i in range(2)), *(hgx(f"b{i}", "r1") for i in range(2))
    )
    rack = constraint(TopologyMode.REQUIRED, RACK)
    jobs = {j: Job(id=j, topology=rack, exclusive=exclusive) for j in ("g", "h")}
    d = session_run(snap, gang_of("g", 1, 8) + gang_of("h", 1, 8), jobs)
    racks = {p.task_id[0]: snap.labels.value_of(RACK, p.node_row) for p in d.placements}
    assert len(racks) == 2
    assert (racks["g"] != racks["h"]) is exclusive


def test_exclusive_gang_avoids_domains_that_running_exclusive_gangs_hold() -> None:
    snap = snapshot(
        *(hgx(f"a{i}", "r0") for i in range(2)), *(hgx(f"b{i}", "r1") for i in range(2))
    )
    rack = constraint(TopologyMode.REQUIRED, RACK)
    job = Job(id="g", topology=rack, exclusive=True, avoid_nodes=frozenset({"a1"}))
    d = session_run(snap, gang_of("g", 1, 8), {"g": job})
    assert racks_of(d, snap) == {"r1"}
    job = Job(id="g", topology=rack, exclusive=True, avoid_nodes=frozenset({"a1", "b0"}))
    d = session_run(snap, gang_of("g", 1, 8), {"g": job})
    assert not d.placements
    assert "held by another exclusive gang" in d.unschedulable[0].diagnosis.message()


def test_gang_topology_is_the_one_the_profile_declares() -> None:
    # The topology profile declares the Topology plugin's (aware) GangTopology, the others
    # RequiredTopology's; a plugin that carries none is refused with the field named.
    import dataclasses

    from kallot.core.errors import ConfigError

    reg = policies.builtin_registry()
    aware = Framework(presets.profile("topology"), reg).gang_topology
    assert aware.aware and not Framework(presets.profile("kallot"), reg).gang_topology.aware
    assert Framework(presets.profile("kallot"), reg).gang_topology.enforces_required
    blind = dataclasses.replace(presets.profile("kallot"), gang_topology="")
    assert Framework(blind, reg).gang_topology == gang.BLIND
    wrong = dataclasses.replace(presets.profile("kallot"), gang_topology="NodeSelector")
    with pytest.raises(ConfigError, match=r"profile\.gang_topology"):
        Framework(wrong, reg)
