"""The packing LP behind kallot's default tail values (``core.packing``).

A hand-solved instance with a unique dual, then properties on random instances: the prices are
dual-feasible for *every* pattern (so column generation stopped at the true optimum), the dual
objective equals the LP optimum (strong duality), and ``V`` is a waste: 0 <= V(l) <= l and a
milli more room never saves more than a milli.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kallot.core import frag, packing
from kallot.core.helpers.kallot_frag import share_demand
from kallot.testing.builders import make_task

# 700 and 200 shares, equal counts (1111.1 each on 1000 GPUs: 450 milli of demand per pair,
# scaled to 1000 * 1000 milli). Patterns: a = 700+200 (900), b = 5 x 200 (1000), c = 700 (700).
# Filling every GPU, the objective is 700,000 + 200a + 300b with a + b <= 1000 GPUs and
# a + 5b <= 1111.1 200s: a = 972.2, b = 27.8, allocated 902,777.8. The 700 row is slack
# (972.2 < 1111.1), so pi_700 = 0; a and b are basic: mu + pi_200 = 900, mu + 5 pi_200 = 1000,
# so pi_200 = 25 and mu = 875 (pattern c: 875 >= 700). Worth to the host r = s - pi:
# 700 and 175. U(l) = best sum of r fitting in l: U(1000) = 875 (700 + 200, or 5 x 200),
# U(900) = 875, U(800) = 700, U(700) = 700, U(500) = 350, U(300) = 175, U(200) = 175, U(100) = 0.
# V = l - U.
HAND = {700: 1.0, 200: 1.0}
LEVELS = [1000, 900, 800, 700, 500, 300, 200, 100, 0]
HAND_V = [125.0, 25.0, 100.0, 0.0, 150.0, 125.0, 25.0, 100.0, 0.0]


def test_hand_instance_prices() -> None:
    n = 1000 * 1000 / 900
    lp = packing.prices({700: n, 200: n}, 1000)
    assert lp.gpu == pytest.approx(875.0)
    assert lp.share[700] == pytest.approx(0.0, abs=1e-6)
    assert lp.share[200] == pytest.approx(25.0)
    assert lp.allocated == pytest.approx(700_000 + 200 * 8750 / 9 + 300 * 250 / 9)


def test_hand_instance_tail_values() -> None:
    v = packing.lp_tail_values(HAND)
    assert v[LEVELS].tolist() == pytest.approx(HAND_V)
    # What a placement costs is V(l) - V(l - s) - pi_s: a 200 share loses nothing on an idle
    # GPU (125 - 100 = 25 = pi_200) and 175 on a 700 tail that should host a 700 (0 - 150).
    assert v[1000] - v[800] == pytest.approx(25.0)
    assert v[700] - v[500] == pytest.approx(-150.0)


def test_share_demand_counts_gpus_by_size() -> None:
    # a 2 x 1000 shape counts 2 whole GPUs per pod; CPU-only shapes ask for none
    inputs = frag.FragInputs.build(
        frag.TargetWorkload.of(
            [
                (frag.Shape(1000, 700, 1), 0.5),
                (frag.Shape(1000, 1000, 2), 0.25),
                (frag.Shape(8000, 0, 0), 0.25),
            ]
        ),
        (),
    )
    assert share_demand(inputs) == pytest.approx({700: 0.5, 1000: 0.5})


def test_share_demand_of_a_learned_target_counts_every_task_not_only_the_typical_shapes() -> None:
    # Ten 700-milli tasks with ten different CPU requests and five 300-milli tasks with one:
    # at 50% coverage the typical shapes are the 300 alone (5 of 15 tasks, then the 700s one
    # by one), which would price a workload of 300s only. The LP is given what every task asks.
    tasks = [make_task(f"a{i}").cpu(1000 + i).gpu(milli=700).obj() for i in range(10)]
    tasks += [make_task(f"b{i}").cpu(500).gpu(milli=300).obj() for i in range(5)]
    tasks += [make_task("w").cpu(100).gpu(count=2).obj(), make_task("c").cpu(9000).obj()]
    target = frag.TargetWorkload.typical(tasks, coverage=0.5)
    assert frag.Shape(500, 300, 1) in target.shapes and len(target.shapes) < 8
    assert target.gpu_demand == ((300, 5.0), (700, 10.0), (1000, 2.0))
    assert share_demand(frag.FragInputs.build(target, ())) == {300: 5.0, 700: 10.0, 1000: 2.0}
    # A target given as shapes has no separate demand: its shapes are the demand.
    assert frag.TargetWorkload.of([(frag.Shape(0, 300, 1), 1.0)]).gpu_demand == ()


def test_no_shares_means_every_idle_milli_is_waste() -> None:
    assert packing.lp_tail_values({1000: 1.0}).tolist() == list(range(1001))
    assert packing.lp_tail_values({}).tolist() == list(range(1001))


def test_bad_demand_is_named() -> None:
    with pytest.raises(ValueError, match="demand"):
        packing.prices({1200: 1.0}, 10)
    with pytest.raises(ValueError, match="gpus"):
        packing.prices({500: 1.0}, 0)


def all_patterns(sizes: list[int]) -> list[tuple[int, ...]]:
    out: list[tuple[int, ...]] = []

    def grow(start: int, room: int, cur: list[int]) -> None:
        if cur:
            out.append(tuple(cur))
        for i in range(start, len(sizes)):
            if sizes[i] <= room:
                grow(i, room - sizes[i], [*cur, sizes[i]])

    grow(0, 1000, [])
    return out


instances = st.tuples(
    st.dictionaries(
        st.integers(10, 99).map(lambda k: 10 * k),  # 100..990 milli: enumerable patterns
        st.floats(0.5, 50.0),
        min_size=1,
        max_size=5,
    ),
    st.booleans(),  # whole GPUs in the demand too
    st.floats(1.0, 60.0),
)


@settings(max_examples=60, deadline=None)
@given(instances)
def test_prices_are_an_optimal_dual(instance: tuple[dict[int, float], bool, float]) -> None:
    shares, whole, gpus = instance
    demand = {**shares, **({1000: 3.0} if whole else {})}
    lp = packing.prices(demand, gpus)
    sizes = sorted(shares)
    # dual feasibility over every pattern, not only the generated ones
    for p in all_patterns(sizes):
        assert lp.gpu + sum(lp.share[s] for s in p) >= sum(p) - 1e-6, p
    if whole:
        assert lp.gpu + lp.share[1000] >= 1000 - 1e-6
    # strong duality: the dual objective is the LP optimum
    dual = lp.gpu * gpus + sum(lp.share[s] * n for s, n in demand.items())
    assert dual == pytest.approx(lp.allocated, rel=1e-7, abs=1e-6)
    assert lp.allocated <= min(1000 * gpus, sum(s * n for s, n in demand.items())) + 1e-6


@settings(max_examples=60, deadline=None)
@given(instances)
def test_tail_values_are_a_waste(instance: tuple[dict[int, float], bool, float]) -> None:
    shares, whole, _ = instance
    v = packing.lp_tail_values({**shares, **({1000: 3.0} if whole else {})})
    levels = np.arange(1001)
    assert v[0] == 0
    assert (v >= -1e-9).all() and (v <= levels + 1e-9).all()
    # U = l - V never decreases with more room
    assert (np.diff(levels - v) >= -1e-9).all()


# ConfigLP as a bound (kallot.sim.bounds, bench/openb_bounds.py): what any placement of the
# arrived requests can hold, optionally placing at least what a policy placed.


def test_bound_on_a_hand_instance_and_what_forcing_big_shares_costs() -> None:
    # 3 GPUs; 3 x 810, 2 x 470, 1 x 160 arrived (3,530 milli for 3,000).
    # Best: 810+160 (970), 470+470 (940), 810 (810) = 2,720; one 810 is left out.
    # Forced to place all three 810s, every GPU holds one and only the 160 fits beside one:
    # 3 x 810 + 160 = 2,590.
    lp = packing.ConfigLP([810, 470, 160, 1000], gpus=3)
    counts = {810: 3, 470: 2, 160: 1}
    assert lp.max_allocated(counts) == pytest.approx(2720)
    assert lp.max_allocated(counts, {810: 3}) == pytest.approx(2590)
    # whole GPUs count too: one whole GPU leaves two GPUs for the shares (970 + 940)
    assert lp.max_allocated({**counts, 1000: 1}) == pytest.approx(2910)
    # and forcing the whole GPU and two 810s: 1000 + (810 + 160) + 810 = 2,780
    assert lp.max_allocated({**counts, 1000: 1}, {1000: 1, 810: 2}) == pytest.approx(2780)


def test_bound_refuses_what_no_packing_holds() -> None:
    lp = packing.ConfigLP([810], gpus=2)
    with pytest.raises(RuntimeError, match="at_least"):
        lp.max_allocated({810: 3}, {810: 3})
    with pytest.raises(ValueError, match="sizes"):
        lp.max_allocated({470: 1})
    with pytest.raises(ValueError, match="at_least"):
        lp.max_allocated({810: 1}, {810: 2})


def brute_force_max(requests: list[int], gpus: int, at_least: dict[int, int]) -> int | None:
    """Most milli that any assignment of a subset of ``requests`` to ``gpus`` GPUs holds while
    placing at least ``at_least[s]`` requests of each size (None: no assignment does)."""
    best: int | None = None
    for assign in itertools.product(range(gpus + 1), repeat=len(requests)):  # gpus = left out
        load = [0] * gpus
        placed: dict[int, int] = {}
        for r, g in zip(requests, assign, strict=True):
            if g < gpus:
                load[g] += r
                placed[r] = placed.get(r, 0) + 1
        if all(x <= 1000 for x in load) and all(placed.get(s, 0) >= n for s, n in at_least.items()):
            best = max(best or 0, sum(load))
    return best


@settings(max_examples=60, deadline=None)
@given(
    requests=st.lists(st.sampled_from([110, 230, 320, 470, 590, 650, 810, 1000]), max_size=6),
    gpus=st.integers(1, 3),
    keep=st.lists(st.booleans(), min_size=6, max_size=6),
)
def test_bound_is_above_every_placement(requests: list[int], gpus: int, keep: list[bool]) -> None:
    """The LP is at least the best real placement, with and without lower bounds taken from a
    real placement (first fit of a random subset), and the lower bounds only lower it."""
    lp = packing.ConfigLP([*requests, 1000], gpus=gpus)
    counts: dict[int, int] = {}
    for r in requests:
        counts[r] = counts.get(r, 0) + 1
    free = lp.max_allocated(counts)
    exact = brute_force_max(requests, gpus, {})
    assert exact is not None and free >= exact - 1e-6
    load = [0] * gpus  # a real placement: first fit of the kept requests
    placed: dict[int, int] = {}
    for r, k in zip(requests, keep, strict=False):
        g = next((g for g in range(gpus) if load[g] + r <= 1000), None)
        if k and g is not None:
            load[g] += r
            placed[r] = placed.get(r, 0) + 1
    given_placed = lp.max_allocated(counts, placed)
    best_given = brute_force_max(requests, gpus, placed)
    assert best_given is not None and given_placed >= best_given - 1e-6
    assert given_placed >= sum(load) - 1e-6
    assert given_placed <= free + 1e-6
