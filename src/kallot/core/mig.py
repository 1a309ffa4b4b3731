"""MIG geometry: NVIDIA's profile tables and placement rules, as pure functions.

Every MIG-capable GPU kallot knows (A100-40GB, A100-80GB, H100-80GB, H200-141GB) has 8 memory
slices and 7 compute slices. A GPU instance of a profile occupies ``mem_slices`` contiguous memory
slices from one of the profile's valid ``starts``. A layout (the instances of one GPU) is valid
when (NVIDIA MIG user guide; ``docs/design/005-sharing.md``):

1. every instance starts at one of its profile's valid starts, and memory ranges
   ``[start, start + mem_slices)`` are disjoint;
2. the compute slices of all instances sum to at most 7;
3. each profile has at most ``max_count`` instances, and at most one ``+me`` (media engine)
   instance exists on the GPU.

``reconfigure`` finds, for a request that no existing instance serves, the cheapest layout change
of one GPU that admits it: destroy only idle instances, fewest destroyed first, then the smallest
loss of future large instances (``headroom``), then the lowest start.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import combinations

from kallot.core.resources import MILLI

MEMORY_SLICES = 8
COMPUTE_SLICES = 7


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One GPU-instance profile of one GPU model (``nvidia-smi mig -lgip`` row)."""

    name: str  # e.g. '3g.40gb'
    gi_id: int  # GPU-instance profile id (19, 20, 15, 14, 9, 5, 0)
    compute: int  # compute slices (of 7)
    mem_slices: int  # memory slices (of 8)
    mem_mib: int  # instance memory as NVML reports it
    starts: tuple[int, ...]  # valid placement starts, in memory slices
    max_count: int  # instances of this profile on one GPU
    media: bool = False  # '+me': the GPU's single set of JPEG/OFA engines

    @property
    def milli(self) -> int:
        """Compute in milli-GPU: ``compute * 1000 // 7`` (1g 142, 2g 285, 3g 428, 4g 571, 7g 1000;
        floors, so the instances of one valid layout never sum to more than 1000)."""
        return self.compute * MILLI // COMPUTE_SLICES

    def mask(self, start: int) -> int:
        """Memory slices covered when placed at ``start``, as a bit mask."""
        return ((1 << self.mem_slices) - 1) << start


# GI profile id, compute, memory slices, valid starts, max instances, +me: the same on all four
# GPUs (k8s-apis.md §4). Order: 19, 20, 15, 14, 9, 5, 0.
_GEOMETRY: tuple[tuple[int, int, int, tuple[int, ...], int, bool], ...] = (
    (19, 1, 1, (0, 1, 2, 3, 4, 5, 6), 7, False),
    (20, 1, 1, (0, 1, 2, 3, 4, 5, 6), 1, True),
    (15, 1, 2, (0, 2, 4, 6), 4, False),
    (14, 2, 2, (0, 2, 4), 3, False),
    (9, 3, 4, (0, 4), 2, False),
    (5, 4, 4, (0,), 1, False),
    (0, 7, 8, (0,), 1, False),
)


def _table(names: Sequence[str], mem_mib: Sequence[int]) -> tuple[MigProfile, ...]:
    return tuple(
        MigProfile(name, gi, c, m, mib, starts, count, me)
        for name, mib, (gi, c, m, starts, count, me) in zip(names, mem_mib, _GEOMETRY, strict=True)
    )


# Profile names and instance memory (MiB) per model, in _GEOMETRY order. Sources: KEP-4815 and
# the go-nvml mocks (A100, H200), an H100 ``nvidia-smi mig -lgip`` capture (GiB with two
# decimals: 9.75 -> 9984, 19.62 -> 20096, 39.50 -> 40448, 79.25 -> 81152).
PROFILES: dict[str, tuple[MigProfile, ...]] = {
    "A100-40GB": _table(
        ("1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),
        (4864, 4864, 9856, 9856, 19968, 19968, 40192),
    ),
    "A100-80GB": _table(
        ("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
        (9856, 9856, 19968, 19968, 40192, 40192, 80384),
    ),
    "H100-80GB": _table(
        ("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
        (9984, 9984, 20096, 20096, 40448, 40448, 81152),
    ),
    "H200-141GB": _table(
        ("1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"),
        (18432, 18432, 35840, 35840, 72704, 72704, 144384),
    ),
}

ALL_PROFILE_NAMES: frozenset[str] = frozenset(p.name for t in PROFILES.values() for p in t)


def profile(model: str, name: str) -> MigProfile | None:
    """The profile ``name`` of ``model``, or None if that model has no such profile."""
    for p in PROFILES.get(model, ()):
        if p.name == name:
            return p
    return None


def profile_for_share(model: str, mem_mib: int, milli: int) -> MigProfile | None:
    """The smallest profile of ``model`` that serves a share of ``mem_mib`` memory and ``milli``
    compute: instance memory ``mem_mib`` (NVML's) >= the share's, and ``compute x 1000 // 7``
    >= its milli; smallest = fewest memory slices, then fewest compute slices. '+me' profiles
    are never chosen for a share (their media engines are a scarce one-per-GPU resource).
    H100-80GB: 23 GiB (23552 MiB) and 100 milli -> 3g.40gb (1g.20gb and 2g.20gb hold 20096 MiB);
    10 GiB -> 1g.20gb (1g.10gb holds 9984 MiB); 300 milli -> 3g.40gb (2g: 285 < 300)."""
    fits = [
        p
        for p in PROFILES.get(model, ())
        if not p.media and p.mem_mib >= mem_mib and p.milli >= milli
    ]
    return min(fits, key=lambda p: (p.mem_slices, p.compute), default=None)


def models_with(name: str) -> frozenset[str]:
    """GPU models that offer a profile named ``name``."""
    return frozenset(m for m, table in PROFILES.items() if any(p.name == name for p in table))


Instance = tuple[str, int]  # (profile name, start)


@dataclass(frozen=True, slots=True)
class _Books:
    """What a set of instances occupies: memory mask, compute, count per profile, +me count."""

    mask: int
    compute: int
    counts: tuple[int, ...]
    media: int


def _books(table: tuple[MigProfile, ...], instances: Iterable[Instance]) -> _Books | str:
    mask = compute = media = 0
    counts = [0] * len(table)
    by_name = {p.name: i for i, p in enumerate(table)}
    for name, start in instances:
        if name not in by_name:
            return f"unknown profile {name}"
        i = by_name[name]
        p = table[i]
        if start not in p.starts:
            return f"{name} cannot start at memory slice {start} (valid: {list(p.starts)})"
        m = p.mask(start)
        if mask & m:
            return f"{name}@{start} overlaps another instance's memory slices"
        mask |= m
        compute += p.compute
        counts[i] += 1
        media += p.media
        if counts[i] > p.max_count:
            return f"more than {p.max_count} instances of {name}"
    if compute > COMPUTE_SLICES:
        return f"{compute} compute slices, at most {COMPUTE_SLICES}"
    if media > 1:
        return "more than one +me instance"
    return _Books(mask, compute, tuple(counts), media)


def valid_layout(model: str, instances: Iterable[Instance]) -> str:
    """'' if ``instances`` is a valid layout of one ``model`` GPU, else the broken rule."""
    table = PROFILES.get(model)
    if table is None:
        return f"{model} is not MIG-capable"
    books = _books(table, instances)
    return books if isinstance(books, str) else ""


def _fits(p: MigProfile, index: int, books: _Books, start: int) -> bool:
    return (
        not books.mask & p.mask(start)
        and books.compute + p.compute <= COMPUTE_SLICES
        and books.counts[index] < p.max_count
        and not (p.media and books.media)
    )


def placements(model: str, instances: Iterable[Instance], name: str) -> tuple[int, ...]:
    """Starts at which one more ``name`` instance keeps the (valid) layout valid."""
    table = PROFILES.get(model, ())
    books = _books(table, instances)
    if isinstance(books, str):
        return ()
    for i, p in enumerate(table):
        if p.name == name:
            return tuple(s for s in p.starts if _fits(p, i, books, s))
    return ()


# Profiles in the order their future capacity matters: largest first (7g, 4g, 3g, 2g, 1g with
# two memory slices, 1g). '+me' is left out: it is one 1g with engines, never a capacity question.
_HEADROOM_ORDER = (6, 5, 4, 3, 2, 0)


def headroom(model: str, instances: Iterable[Instance]) -> tuple[int, ...]:
    """How many more instances of each profile, largest first, could still be created.

    Each entry is independent (how many 7g, or else how many 4g, ...): equal-size aligned blocks
    packed lowest-start-first, capped by the compute left and the profile's instance count.
    A100-80GB, empty GPU: (1, 1, 2, 3, 4, 7); with one 3g@0: (0, 0, 1, 1, 2, 3).
    """
    table = PROFILES[model]
    books = _books(table, instances)
    assert not isinstance(books, str), books
    out = []
    for i in _HEADROOM_ORDER:
        p = table[i]
        mask, n = books.mask, 0
        for s in p.starts:
            if not mask & p.mask(s):
                mask |= p.mask(s)
                n += 1
        by_compute = (COMPUTE_SLICES - books.compute) // p.compute
        out.append(min(n, by_compute, p.max_count - books.counts[i]))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Plan:
    """A layout change of one GPU: destroy idle instances, then create ``create``.

    ``key`` orders plans, smaller is better: (instances destroyed, loss of headroom largest
    profile first (negative = gain), start).
    """

    destroy: tuple[Instance, ...]
    create: Instance
    key: tuple[int, ...]


def reconfigure(model: str, instances: Sequence[tuple[str, int, bool]], name: str) -> Plan | None:
    """The best plan that admits one ``name`` instance on a GPU with ``instances``
    (profile, start, used), destroying only idle ones; None if even destroying every idle
    instance would not make room, the model has no such profile, or the current layout is not
    valid (a node reporting an impossible layout is never reconfigured).

    Brute force over subsets of idle instances (at most 7 on a GPU, so at most 128 subsets)
    and the profile's starts (at most 7): clarity over speed, MIG GPUs are few.
    """
    if profile(model, name) is None or valid_layout(model, [(n, s) for n, s, _ in instances]):
        return None  # no such profile, or a layout kallot cannot reason about (left alone)
    used = [(n, s) for n, s, u in instances if u]
    idle = [(n, s) for n, s, u in instances if not u]
    if not placements(model, used, name):
        return None
    before = headroom(model, [(n, s) for n, s, _ in instances])
    best: Plan | None = None
    for k in range(len(idle) + 1):
        for gone in combinations(range(len(idle)), k):
            kept = used + [x for i, x in enumerate(idle) if i not in gone]
            for start in placements(model, kept, name):
                after = headroom(model, [*kept, (name, start)])
                loss = tuple(b - a for b, a in zip(before, after, strict=True))
                key = (k, *loss, start)
                if best is None or key < best.key:
                    best = Plan(tuple(idle[i] for i in gone), (name, start), key)
        if best is not None:
            return best  # fewer destroyed always wins: no need to try larger subsets
    return None


# -- live re-layout (issue 21): a target layout, and the steps from one layout to another ------


def changed_layout(
    current: Iterable[Instance], destroy: Iterable[Instance], create: Iterable[Instance]
) -> tuple[Instance, ...] | None:
    """``current`` without ``destroy`` and with ``create``, sorted by start; None when an
    instance to destroy is not in ``current`` (a plan made on a layout that has moved on)."""
    out = list(current)
    for x in destroy:
        if x not in out:
            return None
        out.remove(x)
    out.extend(create)
    return tuple(sorted(out, key=lambda x: (x[1], x[0])))


def layout_steps(
    current: Iterable[Instance], target: Iterable[Instance]
) -> tuple[tuple[Instance, ...], tuple[Instance, ...]]:
    """(destroy, create): the instances of ``current`` not in ``target`` and those of ``target``
    not in ``current``. Destroying all of the first and then creating the second one by one
    passes only through subsets of ``current`` and ``target``, so every intermediate layout is
    valid when both ends are (validity is closed under taking subsets). Applied again after a
    partial run (an agent killed mid-apply), it yields only what is left: no double instances."""
    cur, tgt = list(current), list(target)
    destroy = [x for x in cur if x not in tgt]
    create = [x for x in tgt if x not in cur]
    return tuple(sorted(destroy, key=lambda x: x[1])), tuple(sorted(create, key=lambda x: x[1]))


def relayout(
    model: str, instances: Sequence[tuple[str, int, bool]], name: str
) -> tuple[Instance, ...] | None:
    """The target layout that admits one more ``name`` instance: ``reconfigure``'s best plan
    applied to the current layout (used instances kept as they are); None when there is none."""
    plan = reconfigure(model, instances, name)
    if plan is None:
        return None
    return changed_layout([(n, s) for n, s, _ in instances], plan.destroy, [plan.create])
