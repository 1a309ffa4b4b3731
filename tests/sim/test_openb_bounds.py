"""The openb packing bounds: ``kallot sim openb --bounds`` (``sim.bounds``) and the offline
references of ``bench/openb_bounds.py``.

The LP itself (``core.packing.ConfigLP``) is checked against hand arithmetic and brute force in
``tests/core/test_packing.py``; here: the bounds of a real run bound that run, and the
clairvoyant best-fit-decreasing reference is a real placement the LP bounds too.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kallot.core.packing import ConfigLP
from kallot.sim import bounds, openb, trace

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from openb_bounds import best_fit_decreasing


@settings(max_examples=60, deadline=None)
@given(
    requests=st.lists(st.sampled_from([110, 230, 320, 470, 590, 650, 810, 1000]), max_size=6),
    gpus=st.integers(1, 3),
)
def test_best_fit_decreasing_is_a_placement_the_lp_bounds(requests: list[int], gpus: int) -> None:
    lp = ConfigLP([*requests, 1000], gpus=gpus)
    counts: dict[int, int] = {}
    for r in requests:
        counts[r] = counts.get(r, 0) + 1
    bfd_failed = best_fit_decreasing(requests, gpus * 1000) * gpus * 1000 / 100
    assert sum(requests) - bfd_failed <= lp.max_allocated(counts) + 1e-6


def test_run_bounds_bound_the_run_from_below() -> None:
    """On a small cluster of the bundled trace: the best packing of the pods the policy placed
    leaves no more idle than the policy did, and the free LP no more than that."""
    nodes = trace.read_nodes(trace.bundled(trace.BUNDLED_NODES))[:60]
    pods = trace.read_pods(trace.bundled(trace.BUNDLED_DEFAULT))
    for policy in ("fgd", "kallot"):
        run = openb.run(nodes, pods, policy=policy, seed=3)
        b = bounds.run_bounds(run, pods)
        assert b.lp_pct <= b.lp_given_placed_pct + 1e-9
        assert b.lp_given_placed_pct <= run.unallocated_at(100) + 1e-9


def test_run_bounds_refuse_other_pods() -> None:
    nodes = trace.read_nodes(trace.bundled(trace.BUNDLED_NODES))[:20]
    pods = trace.read_pods(trace.bundled(trace.BUNDLED_DEFAULT))
    run = openb.run(nodes, pods, policy="bestfit", seed=1)
    with pytest.raises(ValueError, match="events"):
        bounds.run_bounds(run, pods[:100])
