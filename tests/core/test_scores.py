"""Table tests for every score plugin of the openb policies and kallot's own score.

Each case computes the plugin's score by hand in the comments (units: milli-CPU, milli-GPU;
MaxSpecCpu = 128000, MaxSpecGpu = 8000; sigma(x) = 1 / (1 + e^-x)). Plugins are called on a real
Cycle of a real Session, so they see exactly what the scheduler hands them.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from kallot.config import presets
from kallot.core import frag, packing, policies
from kallot.core.framework.cycle import PENDING, Cycle
from kallot.core.framework.profile import Profile
from kallot.core.framework.runner import Framework
from kallot.core.helpers.kallot_frag import (
    cpu_per_gpu,
    learned_tail_values,
    model_pressure,
    stranded,
    tail_values,
)
from kallot.core.plugins.best_fit import BestFit
from kallot.core.plugins.dot_product import DotProduct
from kallot.core.plugins.fgd import FGD
from kallot.core.plugins.gpu_clustering import GpuClustering
from kallot.core.plugins.gpu_packing import GpuPacking
from kallot.core.plugins.kallot_score import KallotScore
from kallot.core.plugins.random_score import RandomGpu, RandomScore
from kallot.core.scheduler import Scheduler
from kallot.core.session.session import Session
from kallot.core.snapshot import GpuSpec, NodeSpec, Snapshot
from kallot.core.workload import Task
from kallot.testing.builders import NodeBuilder, make_node, make_task, snapshot


def sigma100(x: float) -> float:
    return 100.0 / (1.0 + math.exp(-x))


def cycle_of(snap: Snapshot, pending: tuple[Task, ...] = (), seed: int = 0) -> Cycle:
    fw = Framework(presets.PROFILES["first-fit"], policies.builtin_registry())
    session = Session(fw, snap, now=0.0, rng=np.random.default_rng(seed), jobs={})
    session.shared.put(PENDING, pending)
    return session.cycle()


def scores_of(plugin, snap: Snapshot, task: Task) -> list[float]:  # type: ignore[no-untyped-def]
    cycle = cycle_of(snap, (task,))
    rows = np.arange(snap.n_nodes, dtype=np.intp)
    return [float(x) for x in plugin.score(cycle, task, rows)]


def with_shapes(node: NodeBuilder, shapes: dict[int, int]) -> NodeSpec:
    spec = node.spec()
    spec.shapes = shapes
    return spec


def share(milli: int, cpu: int = 0) -> Task:
    return make_task("t").cpu(cpu).gpu(milli=milli).obj()


def whole(count: int, cpu: int = 0) -> Task:
    return make_task("t").cpu(cpu).gpu(count=count).obj()


def cpu_only(cpu: int) -> Task:
    return make_task("t").cpu(cpu).obj()


# ---------------------------------------------------------------------------------------------
# DotProduct: int(100 * (1 - dot / 2)), dot = <node free, task request> on the max-spec scale.


@pytest.mark.parametrize(
    ("node", "task", "expected"),
    [
        pytest.param(
            # cpu_left 64000/128000 = 0.5, gpu free 2000/8000 = 0.25; task 32000/128000 = 0.25,
            # 500/8000 = 0.0625; dot = 0.5*0.25 + 0.25*0.0625 = 0.140625;
            # 100 * (1 - 0.0703125) = 92.97 -> 92
            make_node("a").cpu(64_000).gpus(8, used_milli=[1000] * 6),
            share(500, cpu=32_000),
            92,
            id="cpu and share",
        ),
        pytest.param(
            # cpu_left 64000/128000 = 0.5, task 16000/128000 = 0.125, no GPU term;
            # dot = 0.0625; 100 * (1 - 0.03125) = 96.875 -> 96
            make_node("a").cpu(128_000, used=64_000).gpus(8),
            cpu_only(16_000),
            96,
            id="cpu-only task ignores GPUs",
        ),
        pytest.param(
            # cpu_left 0; gpu free 8000/8000 = 1, task 4 GPUs = 4000/8000 = 0.5; dot = 0.5;
            # 100 * (1 - 0.25) = 75
            make_node("a").cpu(96_000, used=96_000).gpus(8),
            whole(4),
            75,
            id="whole GPUs count in total",
        ),
        pytest.param(
            # one of the 2 GPUs is unhealthy: free 1000/8000 = 0.125 (not 0.25); task
            # 1000/8000 = 0.125; dot = 0.015625; 100 * (1 - 0.0078125) = 99.2 -> 99
            # (counting the unhealthy GPU would give 100 * (1 - 0.015625) = 98.4 -> 98)
            NodeSpec(
                name="a",
                cpu_milli=64_000,
                mem_mib=1 << 20,
                cpu_used=64_000,
                gpus=[GpuSpec("T4", 15360), GpuSpec("T4", 15360, healthy=False)],
            ),
            whole(1),
            99,
            id="unhealthy GPU is not free",
        ),
    ],
)
def test_dot_product(node, task, expected) -> None:  # type: ignore[no-untyped-def]
    assert scores_of(DotProduct(), snapshot(node), task) == [expected]


def test_dot_product_policy_picks_the_least_aligned_node() -> None:
    # a: gpu free 8000/8000 = 1 -> dot = 1 * 1000/8000 = 0.125 -> 93
    # b: gpu free 1000/8000 -> dot = 0.125 * 0.125 = 0.015625 -> 99 (wins)
    snap = snapshot(
        make_node("a").cpu(0).gpus(8), make_node("b").cpu(0).gpus(8, used_milli=[1000] * 7)
    )
    fw = Framework(presets.PROFILES["dotprod"], policies.builtin_registry())
    d = Scheduler(fw).run_session(snap, [whole(1)], now=0, rng=np.random.default_rng(3))
    assert d.placements[0].node == "b"
    assert scores_of(DotProduct(), snap, whole(1)) == [93, 99]


# ---------------------------------------------------------------------------------------------
# BestFit: raw = int(100 * (1 - [0.5 cpu_after/128000 + 0.5 gpu_after/8000])), then min-max
# normalized over the candidates: (raw - lo) * 100 // (hi - lo), all 0 when they tie.


@pytest.mark.parametrize(
    ("nodes", "task", "expected"),
    [
        pytest.param(
            [
                # a: cpu_after 64000-8000 = 56000 -> 0.5*56000/128000 = 0.21875;
                #    gpu_after 8000-500 = 7500 -> 0.5*7500/8000 = 0.46875; waste 0.6875 -> 31
                make_node("a").cpu(64_000).gpus(8),
                # b: cpu_after 16000-8000 = 8000 -> 0.03125; gpu free 700+1000 = 1700,
                #    after 1200 -> 0.075; waste 0.10625 -> 89.375 -> 89
                make_node("b").cpu(64_000, used=48_000).gpus(2, used_milli=[300]),
                # c: cpu_after 24000 -> 0.09375; gpu free 1000, after 500 -> 0.03125;
                #    waste 0.125 -> 87.5 -> 87
                make_node("c").cpu(32_000).gpus(4, used_milli=[1000] * 3),
            ],
            share(500, cpu=8_000),
            # lo 31, hi 89: a (31-31)*100//58 = 0; b 100; c 56*100//58 = 96
            [0, 100, 96],
            id="normalized over three nodes",
        ),
        pytest.param(
            [make_node("a").gpus(2), make_node("b").gpus(2)],
            share(500),
            [0, 0],
            id="ties all score 0",
        ),
        pytest.param([make_node("a").gpus(2)], whole(1), [0], id="one candidate scores 0"),
    ],
)
def test_best_fit(nodes, task, expected) -> None:  # type: ignore[no-untyped-def]
    assert scores_of(BestFit(), snapshot(*nodes), task) == expected


# ---------------------------------------------------------------------------------------------
# GpuPacking: (1) fits on partially used GPUs: max(100 - ratio//10, 50), ratio = sum over the
# GPUs taken (tightest first) of left*100//1000; (2) needs idle GPUs of a used node:
# max(50 - idle GPUs taken, 33); (3) node entirely idle: max(33 - GPUs, GPUs); CPU-only: 0.


@pytest.mark.parametrize(
    ("node", "task", "expected"),
    [
        pytest.param(make_node("a").gpus(8), share(500), 25, id="idle 8-GPU node: max(33-8, 8)"),
        pytest.param(make_node("a").gpus(2), share(500), 31, id="idle 2-GPU node: max(33-2, 2)"),
        pytest.param(
            # left [700, 1000, 1000, 1000]; tightest that fits 500 is 700 -> ratio 70;
            # 100 - 70//10 = 93
            make_node("a").gpus(4, used_milli=[300]),
            share(500),
            93,
            id="share on a partially used GPU",
        ),
        pytest.param(
            # left [700, 400, 1000, 1000]; tightest that fits 300 is 400 -> ratio 40; 100 - 4 = 96
            make_node("a").gpus(4, used_milli=[300, 600]),
            share(300),
            96,
            id="share takes the tightest partial GPU",
        ),
        pytest.param(
            # left [700, 1000]; 800 does not fit 700 -> takes the idle GPU: max(50 - 1, 33) = 49
            make_node("a").gpus(2, used_milli=[300]),
            share(800),
            49,
            id="share needs an idle GPU of a used node",
        ),
        pytest.param(
            # left [700, 1000, 1000, 1000]; 2 whole GPUs take two idle ones: max(50 - 2, 33) = 48
            make_node("a").gpus(4, used_milli=[300]),
            whole(2),
            48,
            id="two whole GPUs on a used node",
        ),
        pytest.param(make_node("a").gpus(4, used_milli=[300]), cpu_only(1000), 0, id="cpu only"),
    ],
)
def test_gpu_packing(node, task, expected) -> None:  # type: ignore[no-untyped-def]
    assert scores_of(GpuPacking(), snapshot(node), task) == [expected]


# ---------------------------------------------------------------------------------------------
# GpuClustering: base = 25 * (8000 - free) // 8000; 75 + base (node holds only this task's
# tag), 50 + base (this tag among others), 25 + base (no tag), base (only other tags).
# Tags: node_shapes column 0 = shares, column k = k whole GPUs.


@pytest.mark.parametrize(
    ("node", "task", "expected"),
    [
        pytest.param(
            # free 8000 -> base 0; no tag -> 25
            with_shapes(make_node("a").gpus(8), {}),
            whole(1),
            25,
            id="no tags",
        ),
        pytest.param(
            # free 4000 -> base 25*4000//8000 = 12; only the 1-GPU tag -> 75 + 12 = 87
            with_shapes(make_node("a").gpus(8, used_milli=[1000] * 4), {1: 4}),
            whole(1),
            87,
            id="only this tag",
        ),
        pytest.param(
            # free 0+0+500+600+4*1000 = 5100 -> base 25*2900//8000 = 9; tags {1, share} -> 59
            with_shapes(make_node("a").gpus(8, used_milli=[1000, 1000, 500, 400]), {1: 2, 0: 3}),
            whole(1),
            59,
            id="this tag among others",
        ),
        pytest.param(
            # free 500+600+700+5000 = 6800 -> base 25*1200//8000 = 3; only the share tag -> 3
            with_shapes(make_node("a").gpus(8, used_milli=[500, 400, 300]), {0: 3}),
            whole(1),
            3,
            id="only other tags",
        ),
        pytest.param(
            # a 2-GPU task is another tag than a 1-GPU task: free 6000 -> base 6 -> 6
            with_shapes(make_node("a").gpus(8, used_milli=[1000, 1000]), {2: 1}),
            whole(1),
            6,
            id="k-GPU tags differ by k",
        ),
        pytest.param(
            # free 7000 -> base 25*1000//8000 = 3; only the share tag -> 75 + 3 = 78
            with_shapes(make_node("a").gpus(8, used_milli=[500, 500]), {0: 2}),
            share(300),
            78,
            id="share tag",
        ),
        pytest.param(
            # a 2-GPU node looks mostly used on the 8-GPU scale: free 2000 -> base
            # 25*6000//8000 = 18; no tag -> 25 + 18 = 43
            with_shapes(make_node("a").gpus(2), {}),
            whole(1),
            43,
            id="small node base",
        ),
        pytest.param(with_shapes(make_node("a").gpus(8), {0: 1}), cpu_only(1000), 0, id="cpu only"),
    ],
)
def test_gpu_clustering(node, task, expected) -> None:  # type: ignore[no-untyped-def]
    assert scores_of(GpuClustering(), snapshot(node), task) == [expected]


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_gpu_clustering_policy_follows_the_tags_it_placed(seed: int) -> None:
    # The first 1-GPU task lands on the seeded tie winner; from then on that node holds only
    # the 1-GPU tag (75 + 25*1000//8000 = 78 vs 25 elsewhere), so the second follows it: the
    # session must update node_shapes as it places.
    snap = snapshot(make_node("a").gpus(8), make_node("b").gpus(8), make_node("c").gpus(8))
    tasks = [make_task(f"t{i}").gpu().created(i).obj() for i in range(2)]
    fw = Framework(presets.PROFILES["clustering"], policies.builtin_registry())
    d = Scheduler(fw).run_session(snap, tasks, now=0, rng=np.random.default_rng(seed))
    assert d.placements[0].node == d.placements[1].node


# ---------------------------------------------------------------------------------------------
# FGD. Target workload used below: A = 4000 milli-CPU + 500 milli-GPU share (p 0.5) and
# B = 2000 milli-CPU + 1 whole GPU (p 0.5). F_n(t) = idle milli when t cannot fit, else the
# idle milli of the GPUs too small for t. Score = int(100 * sigma((F - F') / 1000)).

SHAPE_A = frag.Shape(4000, 500, 1)
SHAPE_B = frag.Shape(2000, 1000, 1)
TARGET_AB = frag.TargetWorkload.of([(SHAPE_A, 0.5), (SHAPE_B, 0.5)])


def fgd_choice(
    plugin: FGD | KallotScore, snap: Snapshot, task: Task
) -> tuple[float, tuple[int, ...] | None]:
    cycle = cycle_of(snap, (task,))
    score = float(plugin.score(cycle, task, np.array([0], dtype=np.intp))[0])
    feasible = np.arange(snap.max_gpus, dtype=np.intp)
    return score, plugin.choose(cycle, task, 0, feasible)


@pytest.mark.parametrize(
    ("node", "task", "expected", "gpu"),
    [
        pytest.param(
            # left [400, 1000], cpu 8000: A fits on GPU1 but strands GPU0's 400; B the same:
            # F = 0.5*400 + 0.5*400 = 400.
            # GPU0 -> [100, 1000]: A and B strand 100 -> F' = 100, delta +300 -> 57.44 -> 57
            # GPU1 -> [400, 700]: A strands 400, B fits nowhere (idle 1100) -> F' = 750,
            #   delta -350 -> 41.34 -> 41.   Best: 57 on GPU 0.
            make_node("a").cpu(8_000).gpus(2, used_milli=[600]),
            share(300),
            57,
            (0,),
            id="share onto the half-used GPU",
        ),
        pytest.param(
            # mirror of the case above: the half-used GPU is slot 1
            make_node("a").cpu(8_000).gpus(2, used_milli=[0, 600]),
            share(300),
            57,
            (1,),
            id="share onto the half-used GPU, slot 1",
        ),
        pytest.param(
            # F = 0; either GPU -> [700, 1000]: A fits (strands 0), B strands 700 -> F' = 350,
            # delta -350 -> 41 on both; tie -> lowest index
            make_node("a").cpu(8_000).gpus(2),
            share(300),
            41,
            (0,),
            id="tie between GPUs goes to the lowest index",
        ),
        pytest.param(
            # cpu_left 8000 - 5000 = 3000 < A's 4000: A's fragment is all idle 2000; B fits
            # (3000 >= 2000, strands 0) -> F' = 1000, delta -1000 -> 26.89 -> 26
            make_node("a").cpu(8_000).gpus(2),
            cpu_only(5_000),
            26,
            None,
            id="cpu-only task strands GPUs for A",
        ),
        pytest.param(
            # whole GPU takes GPU0 -> [0, 1000]; A and B fit on GPU1, strand 0 -> delta 0 -> 50
            make_node("a").cpu(8_000).gpus(2),
            whole(1),
            50,
            None,
            id="whole GPU with no fragment change",
        ),
        pytest.param(
            # whole GPU and 5000 CPU: cpu_left 3000, A out (idle 1000), B fits on GPU1 ->
            # F' = 500, delta -500 -> 37.75 -> 37
            make_node("a").cpu(8_000).gpus(2),
            whole(1, cpu=5_000),
            37,
            None,
            id="whole GPU and CPU",
        ),
    ],
)
def test_fgd_score_and_gpu_choice(node, task, expected, gpu) -> None:  # type: ignore[no-untyped-def]
    score, chosen = fgd_choice(FGD(TARGET_AB), snapshot(node), task)
    assert score == expected
    assert chosen == gpu


def test_fgd_quantization_truncates_the_sigmoid() -> None:
    # the first case above: delta = +300 milli-GPU -> 100 * sigma(0.3) = 57.444...
    node = make_node("a").cpu(8_000).gpus(2, used_milli=[600])
    exact, _ = fgd_choice(FGD(TARGET_AB, quantize=False), snapshot(node), share(300))
    assert exact == pytest.approx(sigma100(0.3))
    quantized, _ = fgd_choice(FGD(TARGET_AB), snapshot(node), share(300))
    assert quantized == math.floor(sigma100(0.3)) == 57


def test_fgd_picks_a_gpu_that_best_fit_would_not() -> None:
    # Target: only 500-milli shares. Node left [1000, 600]; a 200 share:
    #   best fit (tightest): GPU1 (600 -> 400).
    #   FGD: GPU0 -> [800, 600] strands nothing (delta 0 -> 50); GPU1 -> [1000, 400] strands
    #   400 (delta -400 -> 40). FGD takes GPU0.
    target = frag.TargetWorkload.of([(frag.Shape(0, 500, 1), 1.0)])
    snap = snapshot(make_node("a").gpus(2, used_milli=[0, 400]))
    task = share(200)
    slots = {}
    for name in ("fgd", "kallot", "bestfit"):
        fw = Framework(presets.profile(name, target=target), policies.builtin_registry())
        d = Scheduler(fw).run_session(snap, [task], now=0, rng=np.random.default_rng(0))
        slots[name] = d.placements[0].devices[0].slot
    assert slots == {"fgd": 0, "kallot": 0, "bestfit": 1}


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5, 6])
def test_fgd_ties_go_to_the_seeded_node_order(seed: int) -> None:
    # Identical idle nodes all score the same; the winner is the node with the lowest rank in
    # the session's seeded permutation (its first draw from the rng).
    snap = snapshot(*(make_node(f"n{i}").gpus(2) for i in range(6)))
    fw = Framework(presets.profile("fgd", target=TARGET_AB), policies.builtin_registry())
    d = Scheduler(fw).run_session(snap, [share(300)], now=0, rng=np.random.default_rng(seed))
    rank = np.random.default_rng(seed).permutation(6)
    assert d.placements[0].node_row == int(np.argmin(rank))


def test_fgd_learns_its_target_from_pending_tasks() -> None:
    # No configured target: the typical shapes of the pending tasks (here only 500 shares)
    # are the target, so FGD behaves as in test_fgd_picks_a_gpu_that_best_fit_would_not.
    snap = snapshot(make_node("a").gpus(2, used_milli=[0, 400]))
    tasks = [make_task("first").gpu(milli=200).obj()] + [
        make_task(f"p{i}").gpu(milli=500).created(1 + i).obj() for i in range(5)
    ]
    fw = Framework(presets.PROFILES["fgd"], policies.builtin_registry())
    d = Scheduler(fw).run_session(snap, tasks, now=0, rng=np.random.default_rng(0))
    assert d.placement_of("first").devices[0].slot == 0  # type: ignore[union-attr]


# ---------------------------------------------------------------------------------------------
# KallotScore terms.


def inputs_of(pairs, models=()) -> frag.FragInputs:  # type: ignore[no-untyped-def]
    return frag.FragInputs.build(frag.TargetWorkload.of(pairs), models)


@pytest.mark.parametrize(
    ("pairs", "expected"),
    [
        pytest.param(
            # GPU shapes only: cpu 0.4*4000 + 0.4*2000 = 2400; milli 0.4*500 + 0.4*1000 = 600;
            # the CPU-only shape (p 0.2) is left out -> 2400 / 600 = 4.0
            [(SHAPE_A, 0.4), (SHAPE_B, 0.4), (frag.Shape(8000, 0, 0), 0.2)],
            4.0,
            id="cpu-only shapes do not count",
        ),
        pytest.param(
            # 8 whole GPUs with 16000 CPU (p .5) and a 250 share with 1000 CPU (p .5):
            # cpu 0.5*16000 + 0.5*1000 = 8500; milli 0.5*8000 + 0.5*250 = 4125 -> 2.0606...
            [(frag.Shape(16000, 1000, 8), 0.5), (frag.Shape(1000, 250, 1), 0.5)],
            8500 / 4125,
            id="multi-GPU shapes count all their GPUs",
        ),
        pytest.param([(frag.Shape(8000, 0, 0), 1.0)], 0.0, id="no GPU shape -> 0"),
    ],
)
def test_cpu_per_gpu(pairs, expected) -> None:  # type: ignore[no-untyped-def]
    assert cpu_per_gpu(inputs_of(pairs)) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("idle", "cpu", "ratio", "expected"),
    [
        # 4000 milli-CPU feeds 4000 / 4 = 1000 milli-GPU: 2000 - 1000 = 1000 stranded
        pytest.param(2000, 4000, 4.0, 1000.0, id="cpu feeds half"),
        # 8000 / 4 = 2000 >= 1500: nothing stranded
        pytest.param(1500, 8000, 4.0, 0.0, id="enough cpu"),
        pytest.param(1500, 0, 4.0, 1500.0, id="no cpu strands everything"),
        pytest.param(1500, 0, 0.0, 0.0, id="ratio 0 strands nothing"),
    ],
)
def test_stranded(idle: int, cpu: int, ratio: float, expected: float) -> None:
    out = stranded(np.array([idle], dtype=np.int64), np.array([cpu], dtype=np.int64), ratio)
    assert out.tolist() == [expected]


@pytest.mark.parametrize(
    ("pairs", "values"),
    [
        pytest.param(
            # shares 500 and 1000 (equal weights). Below 500 nothing fits: V[l] = l.
            # 500 <= l < 1000: only 500 fits: V[l] = V[l - 500] = l - 500.
            # V[1000] = (V[500] + V[0]) / 2 = 0.
            [(SHAPE_A, 0.5), (SHAPE_B, 0.5)],
            {0: 0, 100: 100, 499: 499, 500: 0, 700: 200, 999: 499, 1000: 0},
            id="500 and whole",
        ),
        pytest.param(
            # shares 300 and 500 (equal weights): V[300] = V[0] = 0;
            # V[500] = (V[200] + V[0]) / 2 = 100; V[600] = (V[300] + V[100]) / 2 = 50;
            # V[800] = (V[500] + V[300]) / 2 = 50
            [(frag.Shape(0, 300, 1), 1.0), (frag.Shape(0, 500, 1), 1.0)],
            {200: 200, 300: 0, 500: 100, 600: 50, 800: 50},
            id="300 and 500",
        ),
        pytest.param(
            # weights count: 3:1 for 300 vs 500: V[500] = (3*V[200] + 1*V[0]) / 4 = 150
            [(frag.Shape(0, 300, 1), 3.0), (frag.Shape(0, 500, 1), 1.0)],
            {500: 150},
            id="weighted",
        ),
        pytest.param(
            # CPU-only shapes never fill a GPU: V[l] = l everywhere
            [(frag.Shape(1000, 0, 0), 1.0)],
            {0: 0, 1: 1, 640: 640, 1000: 1000},
            id="no share",
        ),
    ],
)
def test_tail_values(pairs, values) -> None:  # type: ignore[no-untyped-def]
    v = tail_values(inputs_of(pairs))
    assert v.shape == (1001,)
    assert {k: pytest.approx(x) for k, x in values.items()} == {k: v[k] for k in values}


def test_learned_tail_values_pairs_of_halves() -> None:
    # Only 500 shares: best fit puts every second one on the 500 tail of the first, and the
    # request stops at exactly the simulated capacity, so every GPU ends at 0 free:
    # moves 1000 -> 500 -> 0, no GPU ends at 500 or 1000 -> V[500] = V[1000] = 0.
    # 700 is never visited: the closed form, V[700] = V[200] = 200.
    v = learned_tail_values(inputs_of([(frag.Shape(0, 500, 1), 1.0)]), gpus=100, rounds=1)
    assert (v[500], v[1000], v[700]) == (0.0, 0.0, 200.0)


def test_learned_tail_values_see_scarcity() -> None:
    # 800 shares (p .9) and 200 shares (p .1): every 800 leaves a 200 tail, and only about one
    # 200 share arrives per nine of them, so about 8 in 9 tails stay empty:
    # V[200] ~ 200 * 8/9 = 178. The closed form assumes a share that fits always comes:
    # V[200] = V[0] = 0.
    inputs = inputs_of([(frag.Shape(0, 800, 1), 0.9), (frag.Shape(0, 200, 1), 0.1)])
    assert tail_values(inputs)[200] == 0.0
    assert 160.0 < learned_tail_values(inputs)[200] < 195.0


def test_learned_tail_values_pool_levels_that_admit_the_same_shares() -> None:
    # 800 (p .85) and 790 (p .05) shares leave 200 and 210 tails; 190 shares (p .1) fit in
    # both. Best fit sends every 190 to a 200 tail first, so level by level no 210 tail is ever
    # filled (V[210] = 210) and the 200s look better than they are. A 190 has no reason to
    # prefer either: pooled over the class of levels 190..789 (exactly the 190 share fits), a
    # tail stays empty with probability q and takes a 190 with 1 - q, the same for both, so
    # V[l] = q * l + (1 - q) * (l - 190) = l - 190 * (1 - q) and V[210] - V[200] = 10.
    # About one tail in eight gets a 190: V[200] = 200 - 190 * (1 - q) ~ 175.
    inputs = inputs_of(
        [(frag.Shape(0, 800, 1), 0.85), (frag.Shape(0, 790, 1), 0.05), (frag.Shape(0, 190, 1), 0.1)]
    )
    per_level = learned_tail_values(inputs, pooled=False)
    pooled = learned_tail_values(inputs)
    assert per_level[210] == 210.0
    assert pooled[210] - pooled[200] == pytest.approx(10.0)
    assert 165.0 < pooled[200] < 185.0


def test_kallot_learned_tail_weight_4() -> None:
    # Same node and task as above with the learned tail: only dTail changes (learned V, weight 4).
    snap = snapshot(make_node("a").cpu(5_000).gpus(2, used_milli=[600]))
    task = share(300, cpu=2_000)
    cycle = cycle_of(snap, (task,))
    rows = np.array([0], dtype=np.intp)
    closed, _ = KallotScore(TARGET_AB, tail="closed", tail_weight=0.0).deltas(cycle, task, rows)
    learned = KallotScore(TARGET_AB, tail="learned")
    got, _ = learned.deltas(cycle, task, rows)
    _, values = learned.terms(learned.view(cycle))
    tail = 4.0 * (values[[400, 1000]] - values[[100, 700]])
    assert got.tolist() == [pytest.approx((closed[0] + tail).tolist())]


def test_kallot_lp_tail_is_the_default() -> None:
    # Target: 700 and 200 shares, p .5 each: the hand instance of tests/core/test_packing.py,
    # V[1000] = 125, V[800] = 100, V[700] = 0, V[500] = 150. Node: GPUs left [700, 1000]; task:
    # a 200 share. dTail x 12: GPU0 (700 -> 500) 12 * (0 - 150) = -1800, GPU1 (1000 -> 800)
    # 12 * (125 - 100) = +300: the 700 tail is kept for a 700, the share opens the idle GPU.
    target = frag.TargetWorkload.of(
        [(frag.Shape(1000, 700, 1), 0.5), (frag.Shape(1000, 200, 1), 0.5)]
    )
    snap = snapshot(make_node("a").cpu(8_000).gpus(2, used_milli=[300]))
    task = share(200, cpu=1_000)
    cycle = cycle_of(snap, (task,))
    rows = np.array([0], dtype=np.intp)
    without, _ = KallotScore(target, tail="closed", tail_weight=0.0).deltas(cycle, task, rows)
    got, _ = KallotScore(target).deltas(cycle, task, rows)
    assert (got[0] - without[0]).tolist() == pytest.approx([-1800.0, 300.0])
    assert fgd_choice(KallotScore(target), snap, task)[1] == (1,)


T4_ONLY = frag.Shape(0, 1000, 1, frozenset({"T4"}))
ANY_HALF = frag.Shape(0, 500, 1)


@pytest.mark.parametrize(
    ("pairs", "expected"),
    [
        pytest.param(
            # Snapshot models (sorted): G2 (code 0, 8 GPUs), T4 (code 1, 2 GPUs); capacity share
            # T4 = 2000/10000 = 0.2. Demand: T4-only 0.5*1000 = 500, any 0.5*500 = 250 (750).
            # T4 insisted 500/750 = 0.667 -> pressure 0.667/0.2 = 3.333; G2 0; padding 0.
            [(T4_ONLY, 0.5), (ANY_HALF, 0.5)],
            [0.0, (500 / 750) / 0.2, 0.0],
            id="T4 insisted on",
        ),
        pytest.param(
            # a model absent from the snapshot (V100M32) does not dilute the split: T4 only
            [(frag.Shape(0, 1000, 1, frozenset({"T4", "V100M32"})), 0.5), (ANY_HALF, 0.5)],
            [0.0, (500 / 750) / 0.2, 0.0],
            id="absent model ignored",
        ),
        pytest.param(
            # insisted on either: 250 each; G2: (250/750)/0.8 = 0.4167, T4 (250/750)/0.2 = 1.667
            [(frag.Shape(0, 1000, 1, frozenset({"T4", "G2"})), 0.5), (ANY_HALF, 0.5)],
            [(250 / 750) / 0.8, (250 / 750) / 0.2, 0.0],
            id="split evenly",
        ),
        pytest.param([(ANY_HALF, 1.0)], [0.0, 0.0, 0.0], id="nobody insists"),
    ],
)
def test_model_pressure(pairs, expected) -> None:  # type: ignore[no-untyped-def]
    snap = snapshot(make_node("t").gpus(2, model="T4"), make_node("g").gpus(8, model="G2"))
    assert snap.models == ("G2", "T4")
    out = model_pressure(inputs_of(pairs, snap.models), snap)
    assert out.tolist() == pytest.approx(expected)


def test_kallot_delta_for_a_share_combines_all_terms() -> None:
    # Target A (4000 CPU + 500 share) and B (2000 CPU + 1 GPU), p 0.5 each: c = 3000/750 = 4.
    # Node: 5000 CPU, GPUs left [400, 1000]; task: 300 share + 2000 CPU.
    # F: A fits (cpu 5000 >= 4000) stranding 400; B strands 400 -> F = 400.
    # dF:  GPU0 -> [100, 1000], cpu 3000: A out (idle 1100), B strands 100 -> F' = 600, -200
    #      GPU1 -> [400, 700]: A out, B out -> F' = 1100, -700
    # dStranded: before max(0, 1400 - 5000/4) = 150, after max(0, 1100 - 3000/4) = 350 ->
    #      -200, x cpu_weight 1.5 = -300 on both GPUs
    # dTail (V of test_tail_values "500 and whole"): GPU0 V[400] - V[100] = 300, x 0.5 = +150;
    #      GPU1 V[1000] - V[700] = -200, x 0.5 = -100
    # pressure: no constrained shape -> 0
    # delta GPU0 = -200 - 300 + 150 = -350 -> 41; GPU1 = -700 - 300 - 100 = -1100 -> 24.97 -> 24
    # (FGD alone: GPU0 -200 -> 45, GPU1 -700 -> 33). The closed-form V and tail weight 0.5 keep
    # the arithmetic by hand; the defaults (learned V, weight 4) are checked below.
    snap = snapshot(make_node("a").cpu(5_000).gpus(2, used_milli=[600]))
    task = share(300, cpu=2_000)
    plugin = KallotScore(TARGET_AB, tail="closed", tail_weight=0.5, cpu_weight=1.5)
    cycle = cycle_of(snap, (task,))
    delta, slots = plugin.deltas(cycle, task, np.array([0], dtype=np.intp))
    assert slots is not None and slots.tolist() == [[True, True]]
    assert delta.tolist() == [pytest.approx([-350.0, -1100.0])]
    score, chosen = fgd_choice(
        KallotScore(TARGET_AB, tail="closed", tail_weight=0.5, cpu_weight=1.5), snap, task
    )
    assert (score, chosen) == (41, (0,))
    assert fgd_choice(FGD(TARGET_AB), snap, task)[0] == 45


@pytest.mark.parametrize(
    ("task", "node", "expected"),
    [
        pytest.param(
            # Target T4-only whole GPU (p .5) + any 500 share (p .5); pressure T4 = 3.333.
            # On the T4 node (2 idle): dF 0 (both shapes still fit), c = 0 -> no stranding,
            # pressure 1.0 * 3.333 * 1000 = 3333.3 -> delta -3333.3
            whole(1),
            0,
            -1000 * (500 / 750) / 0.2,
            id="unconstrained task pays T4 pressure",
        ),
        pytest.param(
            # On the G2 node (8 idle): T4-only shape has no access -> its fragment is all idle:
            # F = 0.5*8000 = 4000, F' = 0.5*7000 = 3500 -> dF +500, pressure G2 0 -> +500
            whole(1),
            1,
            500.0,
            id="G2 has no pressure",
        ),
        pytest.param(
            # A task that may only use T4 pays nothing for it: dF 0 -> 0
            make_task("t").gpu(models=["T4"]).obj(),
            0,
            0.0,
            id="constrained task pays no pressure",
        ),
    ],
)
def test_kallot_delta_model_pressure(task, node, expected) -> None:  # type: ignore[no-untyped-def]
    snap = snapshot(make_node("t").gpus(2, model="T4"), make_node("g").gpus(8, model="G2"))
    target = frag.TargetWorkload.of([(T4_ONLY, 0.5), (ANY_HALF, 0.5)])
    plugin = KallotScore(target)
    delta, slots = plugin.deltas(cycle_of(snap, (task,)), task, np.array([node], dtype=np.intp))
    assert slots is None
    assert delta.tolist() == [pytest.approx(expected)]


@pytest.mark.parametrize(
    "args",
    [
        pytest.param({"cpu_weight": -1}, id="negative weight"),
        pytest.param({"tail_weight": float("nan")}, id="NaN weight"),
        pytest.param({"model_weight": float("inf")}, id="infinite weight"),
        pytest.param({"tail_weight": "high"}, id="not a number"),
        pytest.param({"model_weight": True}, id="bool is not a weight"),
        pytest.param({"target": [1, 2]}, id="target not a TargetWorkload"),
        pytest.param({"speed": 1}, id="unknown arg"),
        pytest.param({"tail": "psychic"}, id="unknown tail model"),
    ],
)
def test_kallot_score_rejects_bad_args(args) -> None:  # type: ignore[no-untyped-def]
    from kallot.core.errors import ConfigError

    with pytest.raises(ConfigError) as exc:
        policies.builtin_registry().create("KallotScore", args)
    assert exc.value.field.startswith("KallotScore args")


# ---------------------------------------------------------------------------------------------
# Random-fit: one feasible node drawn with the session rng scores 100, the rest 0; shares go to
# a GPU drawn among those that fit.


def test_random_score_gives_one_node_100_deterministically_per_seed() -> None:
    snap = snapshot(*(make_node(f"n{i}").gpus(1) for i in range(4)))
    rows = np.arange(4, dtype=np.intp)
    winners = []
    for seed in range(40):
        out = [RandomScore().score(cycle_of(snap, seed=seed), share(100), rows) for _ in range(2)]
        assert out[0].tolist() == out[1].tolist()  # same seed, same draw
        assert sorted(out[0].tolist()) == [0.0, 0.0, 0.0, 100.0]
        winners.append(int(np.argmax(out[0])))
    assert set(winners) == {0, 1, 2, 3}  # every node can win


def test_random_gpu_draws_only_among_feasible_gpus() -> None:
    # left [1000, 100, 700, 1000]: a 500 share fits on GPUs 0, 2, 3, never on 1.
    snap = snapshot(make_node("a").gpus(4, used_milli=[0, 900, 300]))
    feasible = np.array([0, 2, 3], dtype=np.intp)
    picks = set()
    for seed in range(40):
        a = RandomGpu().choose(cycle_of(snap, seed=seed), share(500), 0, feasible)
        b = RandomGpu().choose(cycle_of(snap, seed=seed), share(500), 0, feasible)
        assert a == b
        assert a is not None and len(a) == 1
        picks.add(a[0])
    assert picks == {0, 2, 3}
    # whole GPUs are left to the framework default (lowest-index idle GPUs)
    assert RandomGpu().choose(cycle_of(snap), whole(1), 0, feasible) is None


def test_random_policy_is_deterministic_per_seed_and_varies_across_seeds() -> None:
    snap = snapshot(*(make_node(f"n{i}").gpus(4, used_milli=[0, 500]) for i in range(5)))
    tasks = [make_task(f"t{i}").gpu(milli=300).created(i).obj() for i in range(6)]
    fw = Framework(presets.PROFILES["random"], policies.builtin_registry())

    def layout(seed: int) -> list[tuple[str, int]]:
        d = Scheduler(fw).run_session(snap, tasks, now=0, rng=np.random.default_rng(seed))
        return [(p.node, p.devices[0].slot) for p in d.placements]

    assert layout(11) == layout(11)
    assert len({tuple(layout(s)) for s in range(6)}) > 1


def test_one_plugin_profile_runs_each_score_plugin() -> None:
    # Every score plugin works as the only plugin of a profile (as the policies use them).
    snap = snapshot(make_node("a").gpus(2, used_milli=[600]), make_node("b").gpus(8))
    for name in ("DotProduct", "BestFit", "GpuPacking", "GpuClustering", "RandomScore"):
        prof = Profile(
            name=name,
            filter=presets.PROFILES["first-fit"].filter,
            score=((name, 1),),
            mig=presets.PROFILES["first-fit"].mig,
            gang_topology=presets.PROFILES["first-fit"].gang_topology,
        )
        fw = Framework(prof, policies.builtin_registry())
        d = Scheduler(fw).run_session(snap, [share(300)], now=0, rng=np.random.default_rng(0))
        assert len(d.placements) == 1, name


def test_a_new_target_with_the_same_gpu_demand_solves_no_new_lp(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A live scheduler learns a new target object every session; when only binds happened
    # the demand is the same and the LP's values are reused. A changed demand solves again.
    solved: list[dict[int, float]] = []
    real = packing.lp_tail_values

    def counting(demand: dict[int, float]) -> np.ndarray:
        solved.append(dict(demand))
        return real(demand)

    monkeypatch.setattr(packing, "lp_tail_values", counting)
    snap = snapshot(make_node("a").cpu(64_000).gpus(2))
    tasks = [make_task(f"s{i}").cpu(1_000).gpu(milli=300 + 100 * (i % 3)).obj() for i in range(9)]
    plugin = KallotScore()
    first = plugin.terms(frag.FragView(snap, frag.TargetWorkload.typical(tasks)))
    again = plugin.terms(frag.FragView(snap, frag.TargetWorkload.typical(list(reversed(tasks)))))
    assert len(solved) == 1 and again[1] is first[1]
    plugin.terms(frag.FragView(snap, frag.TargetWorkload.typical(tasks[:-1])))
    assert len(solved) == 2 and solved[1] == {300: 3.0, 400: 3.0, 500: 2.0}
