"""``sim.bounds.ResourceLP``: the packing LP with CPU and memory (issue 23). Hand arithmetic,
and brute force over every subset and GPU assignment of tiny instances: the LP is never below
the best real placement, and with CPU and memory to spare it is the plain packing LP."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kallot.core.packing import ConfigLP
from kallot.sim.bounds import PodClass, ResourceLP


def test_cpu_decides_which_pods_a_bound_places() -> None:
    # 2 GPUs, 16 CPUs. A whole GPU with 12 CPUs, and two 500 shares with 4 CPUs each: all
    # three need 20 CPUs; the best fit into 16 is the two shares (1000 milli, 8 CPUs)
    # plus 8/12 of the whole GPU (fractional: 667), 1667 in all.
    whole, half = (1000, 1, 12000, 0), (500, 1, 4000, 0)
    lp = ResourceLP([whole, half], gpus=2, cpu=16000, mem=1 << 20)
    assert lp.max_allocated({whole: 1, half: 2}) == pytest.approx(1000 + 8000 / 12000 * 1000)
    # CPU-only pods took 8 CPUs: 8 left, the two shares (8 CPUs) are the best use of them.
    assert lp.max_allocated({whole: 1, half: 2}, cpu_taken=8000) == pytest.approx(1000)
    # memory binds the same way: two 2-GPU pods of 300 MiB in 450 MiB, 1.5 pods of 2 GPUs
    heavy = (1000, 2, 0, 300)
    lp = ResourceLP([heavy], gpus=4, cpu=0, mem=450)
    assert lp.max_allocated({heavy: 2}) == pytest.approx(1.5 * 2000)


def test_bad_classes_are_named() -> None:
    with pytest.raises(ValueError, match="classes"):
        ResourceLP([(0, 1, 0, 0)], gpus=1, cpu=1, mem=1)
    lp = ResourceLP([(500, 1, 1, 1)], gpus=1, cpu=1, mem=1)
    with pytest.raises(ValueError, match="arrived"):
        lp.max_allocated({(400, 1, 1, 1): 1})


def brute_force(pods: list[PodClass], gpus: int, cpu: int, mem: int) -> int:
    """Most milli-GPU any placement of a subset of ``pods`` holds: each pod's GPUs on distinct
    GPUs of ``gpus`` (1000 milli each), the subset's CPU and memory within ``cpu`` and ``mem``."""
    best = 0
    for keep in itertools.product((False, True), repeat=len(pods)):
        chosen = [p for p, k in zip(pods, keep, strict=True) if k]
        if sum(p[2] for p in chosen) > cpu or sum(p[3] for p in chosen) > mem:
            continue
        units = [p[0] for p in chosen for _ in range(p[1])]  # one entry per GPU a pod takes
        owner = [i for i, p in enumerate(chosen) for _ in range(p[1])]
        for assign in itertools.product(range(gpus), repeat=len(units)):
            load = [0] * gpus
            for u, g in zip(units, assign, strict=True):
                load[g] += u
            distinct = all(
                len({g for g, o in zip(assign, owner, strict=True) if o == i}) == p[1]
                for i, p in enumerate(chosen)
            )
            if distinct and all(x <= 1000 for x in load):
                best = max(best, sum(units))
                break
    return best


pod = st.tuples(
    st.sampled_from([230, 470, 810, 1000]),
    st.integers(1, 2),
    st.integers(0, 8).map(lambda c: 1000 * c),
    st.integers(0, 8).map(lambda m: 1024 * m),
).map(lambda p: p if p[0] == 1000 else (p[0], 1, p[2], p[3]))


@settings(max_examples=60, deadline=None)
@given(
    pods=st.lists(pod, max_size=5),
    gpus=st.integers(1, 3),
    cpu=st.integers(0, 16).map(lambda c: 1000 * c),
    mem=st.integers(0, 16).map(lambda m: 1024 * m),
)
def test_bound_is_above_every_placement(
    pods: list[PodClass], gpus: int, cpu: int, mem: int
) -> None:
    classes = list(dict.fromkeys(pods))
    arrived: dict[PodClass, int] = {}
    for p in pods:
        arrived[p] = arrived.get(p, 0) + 1
    lp = ResourceLP(classes, gpus=gpus, cpu=cpu, mem=mem)
    bound = lp.max_allocated(arrived)
    assert bound >= brute_force(pods, gpus, cpu, mem) - 1e-6
    # taking CPU away only lowers it; with CPU and memory to spare it is the packing LP
    assert lp.max_allocated(arrived, cpu_taken=1000) <= bound + 1e-6
    plenty = ResourceLP(classes, gpus=gpus, cpu=1 << 30, mem=1 << 30)
    sizes: dict[int, int] = {}
    for p in pods:
        sizes[p[0]] = sizes.get(p[0], 0) + p[1]
    packing = ConfigLP({p[0] for p in pods} | {1000}, gpus).max_allocated(sizes)
    assert plenty.max_allocated(arrived) == pytest.approx(packing, abs=1e-6)
