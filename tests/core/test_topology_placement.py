"""The Topology plugin on multi-GPU pods: node and GPU-set choice, required vs preferred, the
explanation in the Decision, the score's arithmetic, and properties against a brute force."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kallot.config import presets
from kallot.core import policies, topology
from kallot.core.errors import ConfigError
from kallot.core.framework.runner import Framework
from kallot.core.scheduler import Scheduler
from kallot.core.session.session import Session
from kallot.core.workload import Task, TopologyConstraint, TopologyMode
from kallot.testing.builders import NodeBuilder, make_node, make_task, snapshot

REQUIRED_NVLINK = TopologyConstraint(mode=TopologyMode.REQUIRED, level="nvlink")
REQUIRED_NUMA = TopologyConstraint(mode=TopologyMode.REQUIRED, level="numa")
PREFERRED_NVLINK = TopologyConstraint(mode=TopologyMode.PREFERRED, level="nvlink")


def framework(**args: object) -> Framework:
    profile = presets.profile("topology")
    if args:
        profile = type(profile)(**{**_fields(profile), "args": {"Topology": dict(args)}})
    return Framework(profile, policies.builtin_registry())


def _fields(profile: object) -> dict[str, Any]:
    return {k: getattr(profile, k) for k in profile.__dataclass_fields__}  # type: ignore[attr-defined]


def run(nodes: list[NodeBuilder], tasks: list[Task], fw: Framework | None = None):  # type: ignore[no-untyped-def]
    return Scheduler(fw or framework()).run_session(
        snapshot(*nodes), tasks, now=0, rng=np.random.default_rng(0)
    )


def used(node: NodeBuilder, slots: list[int]) -> NodeBuilder:
    for s in slots:
        gpu = node.spec().gpus[s]
        gpu.used_milli, gpu.used_mem, gpu.clients = 1000, gpu.mem_mib, 1
    return node


@pytest.mark.parametrize(
    ("nodes", "task", "node", "slots"),
    [
        pytest.param(
            [
                make_node("p").topology(topology.pcie_8gpu_2numa()),
                make_node("h").topology(topology.hgx_8gpu_nvswitch()),
            ],
            make_task("t").gpu(count=4).obj(),
            "h",
            (0, 1, 2, 3),
            id="4 GPUs: the NVSwitch node over the PCIe node",
        ),
        pytest.param(
            [used(make_node("p").topology(topology.pcie_8gpu_2numa()), [0, 2])],
            make_task("t").gpu(count=2).obj(),
            "p",
            (4, 5),
            id="2 GPUs on PCIe: the first whole PIX pair, not 1+3 (NODE)",
        ),
        pytest.param(
            [used(make_node("p").topology(topology.pcie_8gpu_2numa()), [0, 5])],
            make_task("t").gpu(count=3, topology=REQUIRED_NUMA).obj(),
            "p",
            (1, 2, 3),
            id="3 GPUs required in one NUMA node",
        ),
        pytest.param(
            [
                make_node("q").topology(topology.nvlink_pairs_4gpu()),
                make_node("p").topology(topology.pcie_8gpu_2numa()),
            ],
            make_task("t").gpu(count=2, topology=REQUIRED_NVLINK).obj(),
            "q",
            (0, 1),
            id="2 GPUs required on NVLink: only the pair node qualifies",
        ),
        pytest.param(
            [
                make_node("h").topology(topology.hgx_8gpu_nvswitch()),
                make_node("p").topology(topology.pcie_8gpu_2numa()),
            ],
            make_task("t").gpu(count=1).obj(),
            "p",
            (0,),
            id="1 GPU: the PCIe node, keeping the HGX island whole",
        ),
    ],
)
def test_multi_gpu_pod_gets_the_best_connected_set(
    nodes: list[NodeBuilder], task: Task, node: str, slots: tuple[int, ...]
) -> None:
    d = run(nodes, [task])
    (p,) = d.placements
    assert (p.node, tuple(x.slot for x in p.devices)) == (node, slots)


def test_device_reason_explains_the_choice() -> None:
    d = run(
        [used(make_node("p").topology(topology.pcie_8gpu_2numa()), [0])],
        [make_task("t").gpu(count=2, topology=PREFERRED_NVLINK).obj()],
    )
    # 7 free GPUs: C(7, 2) = 21 sets; 2-3 is the first PIX pair left whole
    assert d.device_reasons["t"] == (
        "GPUs 2,3: PIX between every pair (24 GB/s); best of 21 free sets by slowest link, then "
        "total link cost, then fewest good links cut from the GPUs left free"
    )


@pytest.mark.parametrize(
    ("nodes", "task", "message"),
    [
        pytest.param(
            [make_node("p").topology(topology.pcie_8gpu_2numa())],
            make_task("t").gpu(count=2, topology=REQUIRED_NVLINK).obj(),
            "0/1 nodes are available: 1 node: fewer than 2 free GPUs in one NVLink island "
            "(most in one: 1)",
            id="required NVLink on a PCIe node",
        ),
        pytest.param(
            [used(make_node("p").topology(topology.pcie_8gpu_2numa()), [0, 1, 4, 5])],
            make_task("t").gpu(count=3, topology=REQUIRED_NUMA).obj(),
            "0/1 nodes are available: 1 node: fewer than 3 free GPUs in one NUMA node "
            "(most in one: 2)",
            id="required NUMA, two free per socket",
        ),
        pytest.param(
            [make_node("x").gpus(4)],
            make_task("t").gpu(count=2, topology=REQUIRED_NVLINK).obj(),
            "0/1 nodes are available: 1 node: the node publishes no GPU topology",
            id="node without topology",
        ),
        pytest.param(
            [make_node("p").topology(topology.pcie_8gpu_2numa())],
            make_task("t")
            .gpu(count=2, topology=TopologyConstraint(mode=TopologyMode.REQUIRED, level="rack"))
            .obj(),
            "GPU topology level 'rack' is not an in-node level, expected one of nvlink, numa",
            id="cluster level on a pod",
        ),
    ],
)
def test_required_constraint_that_cannot_be_met_is_explained(
    nodes: list[NodeBuilder], task: Task, message: str
) -> None:
    d = run(nodes, [task])
    assert not d.placements
    assert d.unschedulable[0].diagnosis.message() == message


def test_preferred_constraint_places_anyway() -> None:
    d = run(
        [make_node("p").topology(topology.pcie_8gpu_2numa())],
        [make_task("t").gpu(count=2, topology=PREFERRED_NVLINK).obj()],
    )
    assert [x.slot for x in d.placements[0].devices] == [0, 1]


def test_score_trades_fragmentation_against_topology() -> None:
    snap = snapshot(
        make_node("h").topology(topology.hgx_8gpu_nvswitch()),
        make_node("p").topology(topology.pcie_8gpu_2numa()),
    )
    task = make_task("t").gpu(count=4).obj()
    for locality in (0.0, 0.25, 0.5, 1.0):
        fw = framework(locality=locality)
        session = Session(fw, snap, now=0, rng=np.random.default_rng(0), jobs={})
        cycle = session.cycle()
        plugin = fw.plugins["Topology"]
        cand = fw.feasible(cycle, task)
        frag = plugin._frag.score(cycle, task, cand)  # kallot's fragmentation score
        # h: link 100 * 450/450 = 100; keep: the only free island holding 4 has 8 GPUs,
        #    100 * (1 - (8 - 4) / (8 - 4)) = 0; topology = (2 * 100 + 1 * 0) / 3 = 66.67
        # p: link: best 4-set {0,1,2,3}, slowest pair NODE 14 GB/s: 100 * 14/450 = 3.11;
        #    keep: no island holds 4, nothing whole is broken: 100;
        #    topology = (2 * 3.11 + 100) / 3 = 35.41
        topo = np.array([(2 * 100 + 0) / 3, (2 * 100 * 14 / 450 + 100) / 3])
        assert plugin.topology_score(cycle, task, cand) == pytest.approx(topo)
        total = plugin.score(cycle, task, cand)
        assert total == pytest.approx((1 - locality) * frag + locality * topo)
        assert np.all((total >= 0) & (total <= 100))


@pytest.mark.parametrize(
    ("args", "field"),
    [
        pytest.param({"locality": 1.5}, "Topology args.locality", id="locality out of range"),
        pytest.param({"levels": []}, "Topology args.levels", id="no levels"),
        pytest.param({"levels": [{"name": "rack"}]}, "Topology args.levels[0]", id="no label"),
        pytest.param({"weight": 1}, "Topology args", id="unknown arg"),
    ],
)
def test_bad_args_name_the_field(args: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        framework(**args)
    assert err.value.field == field


def test_custom_levels_from_args() -> None:
    fw = framework(
        levels=[
            {"name": "pod", "label": "example.com/pod"},
            {"name": "host", "label": topology.HOSTNAME_LABEL},
        ]
    )
    cluster = fw.plugins["Topology"].gang_topology.cluster
    assert [lv.name for lv in cluster.levels] == ["pod", "host"]


# -- properties ---------------------------------------------------------------------------------

PRESETS = ("hgx-8-nvswitch", "pcie-8-2numa", "nvlink-pairs-4")


@st.composite
def world(draw: st.DrawFn) -> tuple[list[NodeBuilder], Task]:
    nodes = []
    for i in range(draw(st.integers(1, 3))):
        topo = topology.preset(draw(st.sampled_from(PRESETS)))
        busy = draw(st.sets(st.integers(0, topo.gpus - 1), max_size=topo.gpus))
        nodes.append(used(make_node(f"n{i}").topology(topo), sorted(busy)))
    mode = draw(st.sampled_from(list(TopologyMode)))
    level = draw(st.sampled_from(["nvlink", "numa"]))
    count = draw(st.integers(1, 5))
    task = (
        make_task("t").gpu(count=count, topology=TopologyConstraint(mode=mode, level=level)).obj()
    )
    return nodes, task


def _oracle(link: np.ndarray, free: list[int], count: int) -> tuple[int, ...]:
    """Best set by definition, pair by pair (see test_topology_model)."""

    def cost(a: int, b: int) -> int:
        return round(topology.COST_SCALE / topology.DEFAULT_BANDWIDTHS.of(int(link[a, b])))

    keys = []
    for combo in itertools.combinations(free, count):
        pairs = [cost(a, b) for a, b in itertools.combinations(combo, 2)]
        cut = sum(cost(a, b) for a in combo for b in free if b not in combo)
        keys.append((max(pairs, default=0), sum(pairs), -cut, combo))
    return min(keys)[3]


@settings(max_examples=150, deadline=None)
@given(world())
def test_required_is_never_violated_and_the_set_is_optimal(
    w: tuple[list[NodeBuilder], Task],
) -> None:
    nodes, task = w
    snap = snapshot(*nodes)
    d = Scheduler(framework()).run_session(snap, [task], now=0, rng=np.random.default_rng(1))
    assert task.gpu is not None
    c = task.gpu.topology
    free_on = {
        n: [g for g in range(len(nodes[n].spec().gpus)) if not snap.gpu_used_milli[n, g]]
        for n in range(len(nodes))
    }
    if not d.placements:
        # it really did not fit: no node has enough free GPUs (in one group, when required)
        for n, free in free_on.items():
            if c.mode is TopologyMode.REQUIRED and task.gpu.count > 1:
                group = snap.gpu_island[n] if c.level == "nvlink" else snap.gpu_numa[n]
                best = max(
                    (sum(1 for g in free if group[g] == x) for x in set(group[free])), default=0
                )
                assert best < task.gpu.count
            else:
                assert len(free) < task.gpu.count
        return
    (p,) = d.placements
    slots = [x.slot for x in p.devices]
    assert len(slots) == task.gpu.count and set(slots) <= set(free_on[p.node_row])
    if c.mode is TopologyMode.REQUIRED and len(slots) > 1:
        group = snap.gpu_island[p.node_row] if c.level == "nvlink" else snap.gpu_numa[p.node_row]
        assert len({int(group[s]) for s in slots}) == 1
    else:
        link = np.asarray(nodes[p.node_row].spec().link, dtype=np.int8)
        assert tuple(slots) == _oracle(link, free_on[p.node_row], task.gpu.count)


def test_link_cache_tells_requests_with_different_models_apart() -> None:
    # PCIe node: GPUs 0 and 2 are L40S (NODE between them), the others H100 (PIX pairs 4-5, 6-7)
    node = make_node("p").topology(topology.pcie_8gpu_2numa())
    for g in (0, 2):
        node.spec().gpus[g].model = "L40S"
    fw = framework()
    session = Session(fw, snapshot(node), now=0, rng=np.random.default_rng(0), jobs={})
    cycle, plugin = session.cycle(), fw.plugins["Topology"]
    cand = np.array([0], dtype=np.intp)
    any_model = make_task("a").gpu(count=2).obj()
    only_l40s = make_task("b").gpu(count=2, models=["L40S"]).obj()
    # any model: a PIX pair, 100 * 24 / 450 = 5.33; only L40S: GPUs 0 and 2, NODE, 100 * 14 / 450
    assert plugin.link_score(cycle, any_model, cand, 2) == pytest.approx([100 * 24 / 450])
    assert plugin.link_score(cycle, only_l40s, cand, 2) == pytest.approx([100 * 14 / 450])
