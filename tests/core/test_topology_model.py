"""core.topology: link codes, presets, pair costs, GPU-set ranking (against a brute-force oracle),
cluster domains from node labels."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kallot.core import topology
from kallot.core.snapshot import Labels

NV18 = topology.link_code(topology.LinkLevel.SYSTEM, 18)
PIX = int(topology.LinkLevel.SINGLE)
NODE = int(topology.LinkLevel.NODE)
SYS = int(topology.LinkLevel.SYSTEM)


@pytest.mark.parametrize(
    ("level", "nvlinks", "code", "name"),
    [
        pytest.param(50, 18, 118, "NV18", id="NVLink wins over the PCIe path"),
        pytest.param(10, 0, 10, "PIX", id="one PCIe switch"),
        pytest.param(40, 0, 40, "NODE", id="same NUMA node"),
        pytest.param(50, 0, 50, "SYS", id="across sockets"),
        pytest.param(0, 0, 0, "BRD", id="same board"),
        pytest.param(-1, 0, -1, "?", id="unknown"),
        pytest.param(50, 40, 127, "NV27", id="link count clipped to int8 headroom"),
    ],
)
def test_link_codes(level: int, nvlinks: int, code: int, name: str) -> None:
    assert topology.link_code(level, nvlinks) == code
    assert topology.link_name(code) == name


def test_link_matrix_rejects_bad_input_naming_the_entry() -> None:
    with pytest.raises(ValueError, match=r"topology.levels\[0\]\[1\].*got 15"):
        topology.link_matrix([[0, 15], [15, 0]])
    with pytest.raises(ValueError, match=r"topology\[0\]\[1\]: got PIX one way and SYS"):
        topology.link_matrix([[0, 10], [50, 0]])
    with pytest.raises(ValueError, match="expected a 2x2 matrix"):
        topology.link_matrix([[0, 10], [10]])


def test_link_matrix_from_nvml_levels_and_nvlinks() -> None:
    m = topology.link_matrix(
        [[0, 50, 10], [50, 0, 50], [10, 50, 0]], [[0, 12, 0], [12, 0, 0], [0, 0, 0]]
    )
    assert [topology.link_name(int(c)) for c in m[0]] == ["?", "NV12", "PIX"]
    assert topology.islands_from_links(m).tolist() == [0, 0, 1]


@pytest.mark.parametrize(
    ("preset", "gpus", "islands", "numa", "nic_share"),
    [
        pytest.param("hgx-8-nvswitch", 8, [0] * 8, [0] * 4 + [1] * 4, [50.0] * 8, id="hgx"),
        # 25 GB/s per socket NIC shared by 4 GPUs: 6.25 each
        pytest.param("pcie-8-2numa", 8, list(range(8)), [0] * 4 + [1] * 4, [6.25] * 8, id="pcie"),
        pytest.param("nvlink-pairs-4", 4, [0, 0, 1, 1], [0, 0, 1, 1], [6.25] * 4, id="pairs"),
    ],
)
def test_presets(
    preset: str, gpus: int, islands: list[int], numa: list[int], nic_share: list[float]
) -> None:
    topo = topology.preset(preset)
    assert topo.gpus == gpus
    assert np.array_equal(topo.link, topo.link.T)
    assert topo.islands().tolist() == islands
    assert list(topo.numa) == numa
    assert topo.nic_share_gbps().tolist() == nic_share


def test_unknown_preset_is_named() -> None:
    with pytest.raises(ValueError, match=r"got 'dgx-9'.*expected one of"):
        topology.preset("dgx-9")


def test_pair_costs_arithmetic() -> None:
    link = topology.pcie_8gpu_2numa().link
    cost = topology.pair_costs(link)
    # COST_SCALE / GB/s: PIX 10000/24 = 416.7 -> 417; NODE 10000/14 = 714.3 -> 714; SYS 1000
    assert (int(cost[0, 1]), int(cost[0, 2]), int(cost[0, 4])) == (417, 714, 1000)
    # NV18 = 18 links * 25 GB/s = 450 GB/s: 10000/450 = 22.2 -> 22
    assert int(topology.pair_costs(topology.hgx_8gpu_nvswitch().link)[0, 7]) == 22
    assert int(cost[3, 3]) == 0


@pytest.mark.parametrize(
    ("preset", "free", "count", "groups", "expected"),
    [
        pytest.param("pcie-8-2numa", range(8), 2, None, (0, 1), id="pcie: a PIX pair"),
        pytest.param("pcie-8-2numa", [0, 2, 3, 5], 2, None, (2, 3), id="pcie: the free PIX pair"),
        # {0,1,2,3}: one socket, slowest pair NODE; any set across sockets has a SYS pair
        pytest.param("pcie-8-2numa", range(8), 4, None, (0, 1, 2, 3), id="pcie: one socket"),
        # one GPU, every choice costs 0: the cut decides. Slot 2 is the one whose loss keeps the
        # PIX pair 0-1 whole (cut 714+714 > 417+714).
        pytest.param("pcie-8-2numa", [0, 1, 2], 1, None, (2,), id="pcie: keep the pair"),
        pytest.param("nvlink-pairs-4", range(4), 2, None, (0, 1), id="pairs: an NVLink pair"),
        pytest.param("nvlink-pairs-4", [0, 2, 3], 2, None, (2, 3), id="pairs: the free pair"),
        pytest.param("nvlink-pairs-4", [0, 2], 2, [0, 0, 1, 1], None, id="pairs: required, none"),
    ],
)
def test_rank_gpu_sets(
    preset: str, free: list[int], count: int, groups: list[int] | None, expected: tuple[int, ...]
) -> None:
    ranked = topology.rank_gpu_sets(topology.preset(preset).link, list(free), count, groups=groups)
    assert (ranked[0].slots if ranked else None) == expected


def test_rank_gpu_sets_rejects_bad_arguments() -> None:
    link = topology.hgx_8gpu_nvswitch().link
    with pytest.raises(ValueError, match=r"free: got slots \[9\]"):
        topology.rank_gpu_sets(link, [9], 1)
    with pytest.raises(ValueError, match="must_include"):
        topology.rank_gpu_sets(link, [1, 2], 2, must_include=[3])
    assert topology.rank_gpu_sets(link, [1, 2], 3) == []


def test_describe_set_names_the_slowest_pair() -> None:
    assert topology.describe_set(topology.pcie_8gpu_2numa().link, [0, 1, 4]) == (
        "GPUs 0,1,4: slowest pair 0-4 SYS (10 GB/s)"
    )
    hgx = topology.hgx_8gpu_nvswitch()
    assert topology.describe_set(hgx.link, [0, 1], islands=hgx.islands()) == (
        "GPUs 0,1: NV18 between every pair (450 GB/s), one NVLink island"
    )


CODES = [NV18, topology.link_code(0, 12), topology.link_code(0, 4), 0, PIX, 20, 30, NODE, SYS]


@st.composite
def small_node(draw: st.DrawFn) -> tuple[np.ndarray, list[int], int]:
    g = draw(st.integers(2, 6))
    link = np.full((g, g), -1, dtype=np.int8)
    for i, j in itertools.combinations(range(g), 2):
        link[i, j] = link[j, i] = draw(st.sampled_from(CODES))
    free = sorted(draw(st.sets(st.integers(0, g - 1), min_size=1)))
    count = draw(st.integers(1, len(free)))
    return link, free, count


def _oracle(link: np.ndarray, free: list[int], count: int) -> tuple[int, int, int, tuple[int, ...]]:
    """The definition of the best set, written out pair by pair: smallest slowest-pair cost, then
    total, then largest cut to the free GPUs left out, then lowest slots."""
    bw = topology.DEFAULT_BANDWIDTHS

    def cost(a: int, b: int) -> int:
        return round(topology.COST_SCALE / bw.of(int(link[a, b])))

    best = None
    for combo in itertools.combinations(free, count):
        pairs = [cost(a, b) for a, b in itertools.combinations(combo, 2)]
        rest = [s for s in free if s not in combo]
        cut = sum(cost(a, b) for a in combo for b in rest)
        key = (max(pairs, default=0), sum(pairs), -cut, combo)
        best = key if best is None or key < best else best
    assert best is not None
    return best


@settings(max_examples=200, deadline=None)
@given(small_node())
def test_chosen_set_is_optimal_against_brute_force(node: tuple[np.ndarray, list[int], int]) -> None:
    link, free, count = node
    choice = topology.best_gpu_set(link, free, count)
    assert choice is not None and choice.exact
    best = choice.best
    assert best.key() == _oracle(link, free, count)
    # and in bandwidth terms: no other set has a faster slowest link
    bw = topology.DEFAULT_BANDWIDTHS

    def slowest(combo: tuple[int, ...]) -> float:
        return min((bw.of(int(link[a, b])) for a, b in itertools.combinations(combo, 2)), default=0)

    assert all(
        slowest(best.slots) >= slowest(c) - 1e-9 for c in itertools.combinations(free, count)
    )


def test_greedy_search_on_a_large_node_returns_a_valid_set() -> None:
    # 24 GPUs in three NVLink islands of 8, SYS between: C(24, 8) = 735471 > EXACT_LIMIT
    g = 24
    link = np.full((g, g), SYS, dtype=np.int8)
    for i, j in itertools.combinations(range(g), 2):
        if i // 8 == j // 8:
            link[i, j] = link[j, i] = NV18
    choice = topology.best_gpu_set(link, range(g), 8)
    assert choice is not None and not choice.exact
    assert len({s // 8 for s in choice.best.slots}) == 1  # greedy still finds one island


def _labels(rows: list[dict[str, str]]) -> Labels:
    keys = sorted({k for r in rows for k in r})
    vocab = {k: {v: i for i, v in enumerate(sorted({r[k] for r in rows if k in r}))} for k in keys}
    codes = {
        k: np.array([vocab[k][r[k]] if k in r else -1 for r in rows], dtype=np.int32) for k in keys
    }
    return Labels(codes=codes, vocab=vocab, n=len(rows))


def test_cluster_domains_nest_and_skip_unlabelled_nodes() -> None:
    b, r = "kallot.io/block", "kallot.io/rack"
    labels = _labels(
        [
            {b: "b0", r: "r1"},
            {b: "b0", r: "r1"},
            {b: "b1", r: "r1"},  # same rack name in another block: another rack
            {b: "b1"},  # no rack label: in no rack
        ]
    )
    topo = topology.DEFAULT_CLUSTER_TOPOLOGY
    rack = topo.resolve("rack")
    assert rack is not None and topo.resolve("kallot.io/rack") == rack
    d = topo.domains(labels, rack)
    assert d[0] == d[1] != d[2] and d[3] == -1
    block = topo.resolve("block")
    assert block is not None
    assert topo.domains(labels, block).tolist()[2:] == [1, 1]
    host = topo.resolve("host")
    assert host is not None and sorted(topo.domains(labels, host).tolist()) == [0, 1, 2, 3]
    assert topo.domain_name(labels, rack, 2) == "kallot.io/rack=r1"
    assert topo.resolve("zone") is None
    assert topo.resolve("example.com/pod") == topology.ClusterLevel(
        "example.com/pod", "example.com/pod"
    )


def test_cluster_levels_must_be_unique() -> None:
    with pytest.raises(ValueError, match=r"levels\[\].label: \['a/b'\] repeated"):
        topology.ClusterTopology(
            (topology.ClusterLevel("x", "a/b"), topology.ClusterLevel("y", "a/b"))
        )


def test_levels_are_nvmls_values() -> None:
    pynvml = pytest.importorskip("pynvml")
    assert int(topology.LinkLevel.INTERNAL) == pynvml.NVML_TOPOLOGY_INTERNAL
    assert int(topology.LinkLevel.SINGLE) == pynvml.NVML_TOPOLOGY_SINGLE
    assert int(topology.LinkLevel.MULTIPLE) == pynvml.NVML_TOPOLOGY_MULTIPLE
    assert int(topology.LinkLevel.HOSTBRIDGE) == pynvml.NVML_TOPOLOGY_HOSTBRIDGE
    assert int(topology.LinkLevel.NODE) == pynvml.NVML_TOPOLOGY_NODE
    assert int(topology.LinkLevel.SYSTEM) == pynvml.NVML_TOPOLOGY_SYSTEM
