"""Framework basics: filters AND, diagnosis wording, tie-break, gangs, statement rollback."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kallot.config import presets
from kallot.core import policies
from kallot.core.framework.runner import Framework
from kallot.core.scheduler import Scheduler
from kallot.core.session.session import Session
from kallot.core.workload import Job
from kallot.testing.builders import make_node, make_task, snapshot


def scheduler() -> Scheduler:
    return Scheduler(Framework(presets.PROFILES["first-fit"], policies.builtin_registry()))


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
    fw = Framework(presets.PROFILES["first-fit"], policies.builtin_registry())
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


class _Silent:
    """A filter and score with nothing to say about any task (returns None), counting calls."""

    name = "Silent"

    def __init__(self) -> None:
        self.calls = 0

    def filter(self, cycle, task):  # type: ignore[no-untyped-def]
        self.calls += 1

    def explain(self, cycle, task, rejected):  # type: ignore[no-untyped-def]
        raise AssertionError("a filter that rejected nothing is never asked why")

    def score(self, cycle, task, candidates):  # type: ignore[no-untyped-def]
        self.calls += 1


class _Zeros:
    """A score that returns all zeros (an opinion of no weight)."""

    name = "Zeros"

    def score(self, cycle, task, candidates):  # type: ignore[no-untyped-def]
        return np.zeros(candidates.size)


def test_plugins_that_return_none_pass_every_node_and_add_nothing() -> None:
    """None from a filter passes every node (also when no node fits and the diagnosis is built);
    None or zeros from a score leave the totals of the other scores bit for bit."""
    import dataclasses

    silent = _Silent()
    registry = policies.builtin_registry()
    registry.register("Silent", lambda args: silent)
    registry.register("Zeros", lambda args: _Zeros())
    base = presets.PROFILES["fgd"]
    quiet = dataclasses.replace(
        base,
        filter=("Silent", *base.filter),
        score=(("Zeros", 3), ("Silent", 1), *base.score, ("Zeros", 1)),
    )
    snap = snapshot(
        make_node("a").gpus(4, used_milli=[300]),
        make_node("b").gpus(2, used_milli=[500, 700]),
        make_node("c").gpus(8),
    )
    task = make_task("t").cpu(1000).gpu(milli=250).obj()
    totals = []
    for fw in (Framework(base, policies.builtin_registry()), Framework(quiet, registry)):
        cycle = Session(fw, snap, now=0, rng=np.random.default_rng(0), jobs={}).cycle()
        candidates = fw.feasible(cycle, task)
        assert candidates.tolist() == [0, 1, 2]
        totals.append(fw.score(cycle, task, candidates))
    assert totals[0].tobytes() == totals[1].tobytes()
    assert silent.calls == 2
    fw = Framework(quiet, registry)
    session = Session(fw, snap, now=0, rng=np.random.default_rng(0), jobs={})
    too_big = make_task("big").gpu(count=16).obj()
    diagnosis = fw.diagnose(session.cycle(), too_big)
    assert diagnosis.reasons and all(r.plugin != "Silent" for r in diagnosis.reasons)


def test_scratch_lists_every_touched_row_since_a_mark() -> None:
    """Caches refresh ``changed_since(mark)``: every row a placement or a rollback touched."""
    snap = snapshot(make_node("a").gpus(2), make_node("b").gpus(2), make_node("c").gpus(2))
    fw = Framework(presets.PROFILES["first-fit"], policies.builtin_registry())
    session = Session(fw, snap, now=0, rng=np.random.default_rng(0), jobs={})
    x = session.scratch
    start = x.mark
    assert x.changed_since(start).tolist() == []
    cp = session.statement.checkpoint()
    placed = [session.place(make_task(f"t{i}").gpu(count=2).obj()) for i in range(2)]
    rows = sorted(p.node_row for p in placed)  # type: ignore[union-attr]
    assert x.changed_since(start).tolist() == rows
    after = x.mark
    session.statement.rollback(cp)
    assert x.changed_since(after).tolist() == rows  # the rollback touched them again
    assert x.changed_since(x.mark).tolist() == []


@given(
    touches=st.lists(st.integers(0, 199), min_size=70, max_size=300),
    marks=st.lists(st.integers(0, 300), min_size=1, max_size=6),
)
def test_changed_since_is_every_row_touched_after_the_mark(
    touches: list[int], marks: list[int]
) -> None:
    """Short and long tails (the latter answered by comparing ``last_touch``) both give the
    rows touched at or after ``mark``, each once, ascending, against the log itself."""
    from kallot.core.snapshot import Scratch

    snap = snapshot(*(make_node(f"n{i}").gpus(1) for i in range(200)))
    x = Scratch.of(snap)
    for node in touches:
        x.touch(node)
    for mark in sorted(m % (len(touches) + 1) for m in marks):
        want = sorted(set(touches[mark:]))
        assert x.changed_since(mark).tolist() == want
        assert x.changed_since(mark).tolist() == want  # the kept answer too
