"""Scoring once per distinct node state (``frag.distinct_rows``) and the per-signature DeviceFit
cache change no decision: the same session with and without them, on clusters built from a few
node kinds repeated (where the grouping applies) with random prior use and random tasks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kallot.config import presets
from kallot.core import frag, policies
from kallot.core.decision import Decision
from kallot.core.framework.runner import Framework
from kallot.core.plugins import device_fit
from kallot.core.resources import SharingMode
from kallot.core.scheduler import Scheduler
from kallot.core.snapshot import Snapshot
from kallot.testing.builders import make_node, make_task, snapshot

KINDS = [
    ("A100-40GB", 8, 96000),
    ("T4", 4, 32000),
    ("V100-32GB", 8, 64000),
]
USES = [0, 0, 0, 250, 500, 1000]


@st.composite
def clusters(draw: st.DrawFn) -> Snapshot:
    nodes = []
    for i in range(draw(st.integers(4, 40))):
        model, gpus, cpu = draw(st.sampled_from(KINDS))
        used = draw(st.lists(st.sampled_from(USES), min_size=gpus, max_size=gpus))
        nodes.append(
            make_node(f"n{i}")
            .cpu(cpu, used=draw(st.sampled_from([0, 0, 8000])))
            .mem(512 * 1024)
            .gpus(gpus, model=model, mode=SharingMode.MPS, used_milli=used)
        )
    return snapshot(*nodes)


@st.composite
def tasks(draw: st.DrawFn) -> list:  # type: ignore[type-arg]
    out = []
    for i in range(draw(st.integers(1, 30))):
        t = make_task(f"t{i}").cpu(draw(st.sampled_from([0, 2000, 8000, 30000]))).mem(1024)
        kind = draw(st.sampled_from(["cpu", "share", "whole"]))
        if kind == "share":
            t = t.gpu(1, milli=draw(st.sampled_from([100, 250, 500, 800])))
        elif kind == "whole":
            t = t.gpu(draw(st.sampled_from([1, 2, 4])))
        out.append(t.obj())
    return out


def decide(snap: Snapshot, pending: list, policy: str) -> Decision:  # type: ignore[type-arg]
    fw = Framework(presets.profile(policy), policies.builtin_registry())
    return Scheduler(fw, explain=False).run_session(
        snap, pending, now=0.0, rng=np.random.default_rng(7)
    )


def placements(d: Decision) -> list[tuple[str, int, tuple[int, ...]]]:
    return sorted((p.task_id, p.node_row, tuple(x.slot for x in p.devices)) for p in d.placements)


@settings(max_examples=60, deadline=None)
@given(snap=clusters(), pending=tasks(), policy=st.sampled_from(["kallot", "fgd"]))
def test_grouped_scoring_decides_as_per_node_scoring(
    snap: Snapshot,
    pending: list,  # type: ignore[type-arg]
    policy: str,
) -> None:
    with pytest.MonkeyPatch.context() as m:
        m.setattr(frag, "DISTINCT_MIN_ROWS", 10**9)  # never group
        m.setattr(device_fit, "CACHE_FITS", False)  # the per-GPU rule over all nodes each time
        plain = decide(snap, pending, policy)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(frag, "DISTINCT_MIN_ROWS", 1)  # always group, however few the rows
        m.setattr(frag, "DISTINCT_MAX_SHARE", 1.0)
        grouped = decide(snap, pending, policy)
    assert placements(grouped) == placements(plain)
    assert sorted(u.task_id for u in grouped.unschedulable) == sorted(
        u.task_id for u in plain.unschedulable
    )


def test_distinct_rows_groups_identical_nodes_only() -> None:
    # n0 and n2 are the same kind with the same use; n1 differs in one GPU's use; n3 in model.
    snap = snapshot(
        make_node("n0").cpu(64000).gpus(2, model="T4", used_milli=[500]),
        make_node("n1").cpu(64000).gpus(2, model="T4", used_milli=[250]),
        make_node("n2").cpu(64000).gpus(2, model="T4", used_milli=[500]),
        make_node("n3").cpu(64000).gpus(2, model="A100-40GB", used_milli=[500]),
    )
    from kallot.core.snapshot import Scratch

    rows = np.arange(4, dtype=np.intp)
    old = frag.DISTINCT_MIN_ROWS, frag.DISTINCT_MAX_SHARE
    frag.DISTINCT_MIN_ROWS, frag.DISTINCT_MAX_SHARE = 1, 1.0
    try:
        groups = frag.distinct_rows(snap, Scratch.of(snap), rows)
    finally:
        frag.DISTINCT_MIN_ROWS, frag.DISTINCT_MAX_SHARE = old
    assert groups is not None
    reps, inverse = groups
    assert reps.size == 3
    assert reps[inverse][0] == reps[inverse][2]
    assert len({int(reps[inverse][i]) for i in (0, 1, 3)}) == 3
