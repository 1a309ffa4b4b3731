"""The fragmentation measure (core.frag): hand-computed fragments, the incremental updates
against a from-scratch recomputation (hypothesis), and the typical-shape target workload."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kallot.core import frag
from kallot.core.resources import SharingMode
from kallot.core.snapshot import GpuSpec, NodeSpec, Scratch
from kallot.core.workload import Task
from kallot.testing.builders import make_node, make_task, snapshot

SHARE_500 = frag.Shape(0, 500, 1)
WHOLE_1 = frag.Shape(0, 1000, 1)
WHOLE_2 = frag.Shape(0, 1000, 2)
CPU_ONLY = frag.Shape(1000, 0, 0)


def node_frag(node, pairs) -> float:  # type: ignore[no-untyped-def]
    """F_n of the one node, via the FragView the plugins and the simulator use."""
    snap = snapshot(node)
    view = frag.FragView(snap, frag.TargetWorkload.of(pairs))
    view.refresh(Scratch.of(snap))
    return float(view.frag[0])


@pytest.mark.parametrize(
    ("node", "pairs", "expected"),
    [
        pytest.param(
            # CPU-only shapes count every idle GPU: 700 + 1000
            make_node("a").gpus(2, used_milli=[300]),
            [(CPU_ONLY, 1.0)],
            1700,
            id="cpu-only shape: all idle",
        ),
        pytest.param(
            # the shape may only use T4 and the node has G2: all idle, 2000
            make_node("a").gpus(2, model="G2"),
            [(frag.Shape(0, 500, 1, frozenset({"T4"})), 1.0)],
            2000,
            id="no access: all idle",
        ),
        pytest.param(
            # left [400, 1000, 200]: a 500 share fits on GPU1; GPUs 0 and 2 are too small:
            # 400 + 200 = 600
            make_node("a").gpus(3, used_milli=[600, 0, 800]),
            [(SHARE_500, 1.0)],
            600,
            id="fits: only GPUs too small count",
        ),
        pytest.param(
            # same node, the shape needs 4000 CPU but only 64000 - 62000 = 2000 is free: all idle
            # 400 + 1000 + 200 = 1600
            make_node("a").cpu(64_000, used=62_000).gpus(3, used_milli=[600, 0, 800]),
            [(frag.Shape(4000, 500, 1), 1.0)],
            1600,
            id="lacks CPU: all idle",
        ),
        pytest.param(
            # left [400, 200]: no GPU takes a 500 share: all idle, 600
            make_node("a").gpus(2, used_milli=[600, 800]),
            [(SHARE_500, 1.0)],
            600,
            id="lacks GPU: all idle",
        ),
        pytest.param(
            # left [500, 1000, 1000, 800]: 2 whole GPUs fit; partial ones strand 500 + 800
            make_node("a").gpus(4, used_milli=[500, 0, 0, 200]),
            [(WHOLE_2, 1.0)],
            1300,
            id="multi-GPU shape fits: partial GPUs strand",
        ),
        pytest.param(
            # left [500, 1000, 800, 800]: one idle GPU, 2 needed: all idle 3100
            make_node("a").gpus(4, used_milli=[500, 0, 200, 200]),
            [(WHOLE_2, 1.0)],
            3100,
            id="multi-GPU shape does not fit",
        ),
        pytest.param(
            # left [400, 1000]: share 500 strands 400 (p .25), whole strands 400 (p .25),
            # CPU-only counts 1400 (p .5): 100 + 100 + 700 = 900
            make_node("a").gpus(2, used_milli=[600]),
            [(SHARE_500, 1.0), (WHOLE_1, 1.0), (CPU_ONLY, 2.0)],
            900,
            id="expectation over the target",
        ),
        pytest.param(make_node("a"), [(SHARE_500, 1.0), (CPU_ONLY, 1.0)], 0, id="no GPUs"),
        pytest.param(
            # the unhealthy and the MIG GPU do not count: only GPU0 (left 1000) is seen;
            # a 500 share fits it and strands nothing -> 0; CPU-only counts its 1000 -> 500
            NodeSpec(
                name="a",
                cpu_milli=64_000,
                mem_mib=1 << 20,
                gpus=[
                    GpuSpec("T4", 15360),
                    GpuSpec("T4", 15360, healthy=False),
                    GpuSpec("T4", 15360, mode=SharingMode.MIG),
                ],
            ),
            [(SHARE_500, 1.0), (CPU_ONLY, 1.0)],
            500,
            id="unhealthy and MIG GPUs ignored",
        ),
    ],
)
def test_fragment_amount(node, pairs, expected) -> None:  # type: ignore[no-untyped-def]
    assert node_frag(node, pairs) == pytest.approx(expected)


def test_cluster_fragment_sums_nodes_and_reports_idle() -> None:
    # a: left [400, 1000] -> share strands 400; b: left [1000, 1000] -> 0. Total 400, idle 3400
    snap = snapshot(make_node("a").gpus(2, used_milli=[600]), make_node("b").gpus(2))
    inputs = frag.FragInputs.build(frag.TargetWorkload.of([(SHARE_500, 1.0)]), snap.models)
    ok = snap.gpu_valid & snap.gpu_healthy
    left = np.where(ok, snap.gpu_cap_milli - snap.gpu_used_milli, 0)
    cpu = snap.node_cpu_milli - snap.node_cpu_used
    amount, idle = frag.cluster_fragment(inputs, left, cpu, frag.usable(inputs, snap.gpu_model, ok))
    assert amount == pytest.approx(400.0)
    assert idle == 3400


def test_frag_view_refreshes_only_changed_rows() -> None:
    snap = snapshot(make_node("a").gpus(2), make_node("b").gpus(2))
    view = frag.FragView(snap, frag.TargetWorkload.of([(SHARE_500, 1.0)]))
    scratch = Scratch.of(snap)
    view.refresh(scratch)
    assert view.frag.tolist() == [0.0, 0.0]
    # put 700 on a's GPU0 -> left [300, 1000]: 300 stranded; b unchanged
    scratch.gpu_used_milli[0, 0] = 700
    view.refresh(scratch)
    assert view.frag.tolist() == [0.0, 0.0]  # version did not move: cached
    scratch.touch(0)
    view.refresh(scratch)
    assert view.frag.tolist() == [300.0, 0.0]


# ---------------------------------------------------------------------------------------------
# after_share / after_take against stats() recomputed from scratch.

MODELS = ("G2", "T4")

shapes_st = st.builds(
    frag.Shape,
    cpu_milli=st.sampled_from([0, 1000, 4000, 12000]),
    gpu_milli=st.sampled_from([0, 100, 250, 500, 810, 1000]),
    gpu_count=st.just(1),
    models=st.sampled_from([frozenset(), frozenset({"T4"}), frozenset({"G2", "T4"})]),
).map(lambda s: frag.Shape(s.cpu_milli, s.gpu_milli, 0 if s.gpu_milli == 0 else 1, s.models))
multi_st = st.builds(
    frag.Shape,
    cpu_milli=st.sampled_from([0, 8000]),
    gpu_milli=st.just(1000),
    gpu_count=st.sampled_from([2, 4]),
)
target_st = st.lists(
    st.tuples(st.one_of(shapes_st, multi_st), st.integers(1, 5)), min_size=1, max_size=5
).map(frag.TargetWorkload.of)


@st.composite
def rows_st(draw):  # type: ignore[no-untyped-def]
    k = draw(st.integers(1, 4))
    g = draw(st.integers(1, 8))
    cap = np.full((k, g), 1000, dtype=np.int64)
    used = np.array(
        draw(
            st.lists(
                st.sampled_from([0, 100, 190, 300, 500, 810, 1000]), min_size=k * g, max_size=k * g
            )
        ),
        dtype=np.int64,
    ).reshape(k, g)
    ok = np.array(draw(st.lists(st.booleans(), min_size=k * g, max_size=k * g))).reshape(k, g)
    ok |= draw(st.booleans())  # often every slot is usable
    model = np.array(
        draw(st.lists(st.sampled_from([0, 1]), min_size=k, max_size=k)), dtype=np.int32
    )
    cpu = np.array(draw(st.lists(st.sampled_from([0, 3000, 8000, 64000]), min_size=k, max_size=k)))
    left = np.where(ok, cap - used, 0).astype(np.int64)
    return left, cpu.astype(np.int64), ok, np.repeat(model[:, None], g, axis=1)


@settings(max_examples=60, deadline=None)
@given(target=target_st, rows=rows_st(), milli=st.sampled_from([50, 200, 500, 810, 999]))
def test_after_share_equals_recomputation(target, rows, milli) -> None:  # type: ignore[no-untyped-def]
    left, cpu, ok, model = rows
    inputs = frag.FragInputs.build(target, MODELS)
    use = frag.usable(inputs, model, ok)
    base = frag.stats(inputs, left, cpu, use)
    task_cpu = 2000
    after = frag.after_share(inputs, base, left, use, milli=milli, cpu=task_cpu)
    assert after.shape == left.shape
    for i in range(left.shape[0]):
        for g in range(left.shape[1]):
            if not ok[i, g] or left[i, g] < milli:
                continue  # the share cannot go there: entries are documented as meaningless
            moved = left[i : i + 1].copy()
            moved[0, g] -= milli
            want = frag.stats(inputs, moved, cpu[i : i + 1] - task_cpu, use[i : i + 1]).frag[0]
            assert after[i, g] == pytest.approx(want), (i, g)


@settings(max_examples=60, deadline=None)
@given(target=target_st, rows=rows_st(), data=st.data())
def test_after_take_equals_recomputation(target, rows, data) -> None:  # type: ignore[no-untyped-def]
    left, cpu, ok, model = rows
    inputs = frag.FragInputs.build(target, MODELS)
    use = frag.usable(inputs, model, ok)
    base = frag.stats(inputs, left, cpu, use)
    fractions = np.array(
        data.draw(
            st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=left.size, max_size=left.size)
        )
    ).reshape(left.shape)
    take = (left * fractions).astype(np.int64)
    task_cpu = data.draw(st.sampled_from([0, 1000, 5000]))
    after = frag.after_take(inputs, base, left, use, take=take, cpu=task_cpu)
    want = frag.stats(inputs, left - take, cpu - task_cpu, use).frag
    assert after.tolist() == pytest.approx(want.tolist())


@settings(max_examples=80, deadline=None)
@given(target=target_st, rows=rows_st(), data=st.data())
def test_after_share_at_is_after_share_bit_for_bit(target, rows, data) -> None:  # type: ignore[no-untyped-def]
    """The per-pair form the scores use for shares gives the very floats of the [k, G] form on
    every (row, GPU) pair it is asked for."""
    left, cpu, ok, model = rows
    inputs = frag.FragInputs.build(target, MODELS)
    use = frag.usable(inputs, model, ok)
    base = frag.stats(inputs, left, cpu, use)
    pick = np.array(
        data.draw(st.lists(st.booleans(), min_size=left.size, max_size=left.size))
    ).reshape(left.shape)
    row, gpu = pick.nonzero()
    milli = data.draw(st.sampled_from([50, 200, 500, 810, 999]))
    task_cpu = data.draw(st.sampled_from([0, 1000, 5000]))
    want = frag.after_share(inputs, base, left, use, milli=milli, cpu=task_cpu)[row, gpu]
    got = frag.after_share_at(inputs, base, left, use, row=row, gpu=gpu, milli=milli, cpu=task_cpu)
    assert got.tobytes() == want.tobytes()


@settings(max_examples=80, deadline=None)
@given(target=target_st, rows=rows_st(), data=st.data())
def test_after_take_one_is_after_take_bit_for_bit(target, rows, data) -> None:  # type: ignore[no-untyped-def]
    """The one-GPU form the scores use for whole-GPU tasks gives the very floats of the general
    form (decisions must not move), including rows that take nothing."""
    left, cpu, ok, model = rows
    inputs = frag.FragInputs.build(target, MODELS)
    use = frag.usable(inputs, model, ok)
    base = frag.stats(inputs, left, cpu, use)
    k, g = left.shape
    slot = np.array(data.draw(st.lists(st.integers(0, g - 1), min_size=k, max_size=k)))
    takes = np.array(data.draw(st.lists(st.booleans(), min_size=k, max_size=k)))
    one = np.where(takes, left[np.arange(k), slot], 0).astype(np.int64)
    full = np.zeros_like(left)
    full[np.arange(k), slot] = one
    task_cpu = data.draw(st.sampled_from([0, 1000, 5000]))
    want = frag.after_take(inputs, base, left, use, take=full, cpu=task_cpu)
    got = frag.after_take_one(inputs, base, left, use, slot=slot, take=one, cpu=task_cpu)
    assert got.tobytes() == want.tobytes()


# ---------------------------------------------------------------------------------------------
# TargetWorkload.typical


def tasks_of(counts: dict[str, int], shape_of: Callable[[str, str], Task]) -> list[Task]:
    out: list[Task] = []
    for key, n in counts.items():
        for i in range(n):
            out.append(shape_of(key, f"{key}-{i}"))
    return out


def by_key(key: str, tid: str):  # type: ignore[no-untyped-def]
    # a: 8000 CPU + 500 share; b: 1 GPU; c: 2000 CPU only; d: 6000 CPU only
    t = make_task(tid)
    if key == "a":
        return t.cpu(8000).gpu(milli=500).obj()
    if key == "b":
        return t.gpu().obj()
    if key == "c":
        return t.cpu(2000).obj()
    return t.cpu(6000).obj()


A = frag.Shape(8000, 500, 1)
B = frag.Shape(0, 1000, 1)
C = frag.Shape(2000, 0, 0)
D = frag.Shape(6000, 0, 0)


@pytest.mark.parametrize(
    ("coverage", "expected"),
    [
        # 10 tasks: a 5, b 3, c 1, d 1. Shapes are added while covered < coverage * 10.
        # 0.8: a (5), b (8 >= 8) -> stop. Weights 5/8, 3/8.
        pytest.param(0.8, [(A, 5 / 8), (B, 3 / 8)], id="80%"),
        # 0.85: a, b (8 < 8.5), then one of the two 1-count shapes: equal counts go by FGD's
        # order descending: (6000, ...) > (2000, ...) -> d. Weights 5/9, 3/9, 1/9.
        pytest.param(0.85, [(A, 5 / 9), (B, 3 / 9), (D, 1 / 9)], id="85%: ties by order"),
        # 0.95: 9 < 9.5 -> all four
        pytest.param(0.95, [(A, 0.5), (B, 0.3), (D, 0.1), (C, 0.1)], id="95%: all"),
        pytest.param(0.5, [(A, 1.0)], id="50%: the top shape alone"),
    ],
)
def test_typical_coverage_and_order(coverage, expected) -> None:  # type: ignore[no-untyped-def]
    tasks = tasks_of({"a": 5, "b": 3, "c": 1, "d": 1}, by_key)
    target = frag.TargetWorkload.typical(tasks, coverage=coverage)
    got = list(zip(target.shapes, target.weight.tolist(), strict=True))
    assert [s for s, _ in got] == [s for s, _ in expected]
    assert [w for _, w in got] == pytest.approx([w for _, w in expected])


def test_typical_ignores_memory_and_keeps_models() -> None:
    tasks = [
        make_task("x").cpu(1000).mem(100).gpu(milli=500).obj(),
        make_task("y").cpu(1000).mem(99_999).gpu(milli=500).obj(),
        make_task("z").cpu(1000).gpu(milli=500, models=["T4"]).obj(),
    ]
    target = frag.TargetWorkload.typical(tasks, coverage=1.0)
    assert target.shapes == (
        frag.Shape(1000, 500, 1),
        frag.Shape(1000, 500, 1, frozenset({"T4"})),
    )
    assert target.weight.tolist() == pytest.approx([2 / 3, 1 / 3])


def test_typical_gpu_weighted_counts_whole_gpus() -> None:
    # 3 shares count 3; one 8-GPU task counts 1 + 8 = 9: the 8-GPU shape ranks first.
    tasks = [make_task(f"s{i}").gpu(milli=300).obj() for i in range(3)]
    tasks.append(make_task("big").gpu(count=8).obj())
    plain = frag.TargetWorkload.typical(tasks, coverage=0.7)
    weighted = frag.TargetWorkload.typical(tasks, coverage=0.7, gpu_weighted=True)
    assert plain.shapes == (frag.Shape(0, 300, 1),)
    assert weighted.shapes == (frag.Shape(0, 1000, 8),)


def test_typical_of_nothing_is_empty() -> None:
    assert frag.TargetWorkload.typical([]).size == 0


def test_typical_on_the_bundled_default_trace() -> None:
    # The paper's run log: 35 shapes cover 95.26% of the default pod list; the top shape is
    # 3.15 CPU (3152 milli in the CSV) + 0.81 GPU at 12.84% of all pods, i.e. 12.84 / 95.26 of
    # the kept ones; then 11.3 CPU + 1 GPU (10.72%) and 11.4 CPU + 1 GPU (7.35%).
    from kallot.sim import openb, trace

    pods = trace.read_pods(trace.bundled(trace.BUNDLED_DEFAULT))
    target = openb.target_workload(pods)
    assert target.size == 35
    assert target.shapes[:3] == (
        frag.Shape(3152, 810, 1),
        frag.Shape(11300, 1000, 1),
        frag.Shape(11400, 1000, 1),
    )
    assert target.weight[:3].tolist() == pytest.approx(
        [0.1284 / 0.9526, 0.1072 / 0.9526, 0.0735 / 0.9526], abs=1e-3
    )
    assert float(target.weight.sum()) == pytest.approx(1.0)
    assert list(target.weight) == sorted(target.weight, reverse=True)


def test_target_workload_validates_weights() -> None:
    with pytest.raises(ValueError, match="weights"):
        frag.TargetWorkload(shapes=(A,), weight=np.array([0.5, 0.5]))
    with pytest.raises(ValueError, match="sums to"):
        frag.TargetWorkload(shapes=(A, B), weight=np.array([0.5, 0.4]))
