"""bench/openb_bounds.py's configuration LP: a bound on what any placement can allocate.

The LP is what issue 2's closing analysis rests on (how far kallot is from the best packing of
the same arrivals), so it is checked against hand arithmetic and against brute force.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from openb_bounds import ConfigLP, best_fit_decreasing, patterns


def test_patterns_are_every_multiset_that_fits_one_gpu() -> None:
    pats = set(patterns([810, 470, 160]))
    # by hand: 160 x1..6 (6 x 160 = 960), 470 with 0..3 x 160 (470 + 3 x 160 = 950),
    # 470 + 470, 810, 810 + 160; nothing with 810 + 470 or 3 x 470.
    expected = {(160,) * k for k in range(1, 7)}
    expected |= {(160,) * k + (470,) for k in range(4)}
    expected |= {(470, 470), (810,), (160, 810)}
    assert pats == expected


def test_lp_on_a_hand_instance_and_what_forcing_big_shares_costs() -> None:
    # 3 GPUs; 3 x 810, 2 x 470, 1 x 160 arrived (3,530 milli for 3,000).
    # Best: 810+160 (970), 470+470 (940), 810 (810) = 2,720; one 810 is left out.
    # Forced to place all three 810s, every GPU holds one and only the 160 fits beside one:
    # 3 x 810 + 160 = 2,590.
    lp = ConfigLP([810, 470, 160], gpus=3)
    counts = {810: 3, 470: 2, 160: 1}
    assert abs(lp.max_allocated(counts) - 2720) < 1e-6
    assert abs(lp.max_allocated(counts, {810: 3}) - 2590) < 1e-6
    # whole GPUs count too: one whole GPU leaves two GPUs for the shares (970 + 940)
    assert abs(lp.max_allocated({**counts, 1000: 1}) - 2910) < 1e-6


def brute_force_max(requests: list[int], gpus: int) -> int:
    """Most milli that any assignment of a subset of ``requests`` to ``gpus`` GPUs holds."""
    best = 0
    for assign in itertools.product(range(gpus + 1), repeat=len(requests)):  # gpus = left out
        load = [0] * gpus
        for r, g in zip(requests, assign, strict=True):
            if g < gpus:
                load[g] += r
        if all(x <= 1000 for x in load):
            best = max(best, sum(load))
    return best


@settings(max_examples=60, deadline=None)
@given(
    requests=st.lists(st.sampled_from([110, 230, 320, 470, 590, 650, 810, 1000]), max_size=6),
    gpus=st.integers(1, 3),
)
def test_lp_bounds_every_placement_from_above(requests: list[int], gpus: int) -> None:
    lp = ConfigLP(requests, gpus=gpus)
    counts: dict[int, int] = {}
    for r in requests:
        counts[r] = counts.get(r, 0) + 1
    bound = lp.max_allocated(counts)
    exact = brute_force_max(requests, gpus)
    assert bound >= exact - 1e-6
    # and so best-fit-decreasing (a real placement) never beats it either
    bfd_failed = best_fit_decreasing(requests, gpus * 1000) * gpus * 1000 / 100
    assert sum(requests) - bfd_failed <= bound + 1e-6
