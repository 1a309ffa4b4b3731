"""kallot's placement policy on DRA devices: which valid allocation of a pod's claims wins.

Where it sits: called by ``core.dra.allocator`` for every complete allocation its search finds
(``order`` also sorts each request's candidates so good allocations are found first). The key
is a tuple, lowest wins, compared lexicographically:

0. **binding conditions**: how many chosen devices have binding conditions (KEP-5007: the pod
   waits for them before it binds; upstream tries such pools last);
1. **locality**: per claim, how many distinct ``pcieRoot`` / ``numaNode`` / ``nvlinkIsland``
   values its devices span beyond one (two GPUs on one PCIe root beat two on different roots);
2. **opened**: how many physical units the allocation starts using that were idle (a shared
   device with no shares yet, a counter set, i.e. a MIG GPU, with no partition allocated):
   fuller GPUs first, idle GPUs stay whole;
3. **MIG layout preservation**: for every counter set (a partitionable GPU) the allocation
   touches, its headroom lost: how many fewer partitions of each size (largest first) could
   still be allocated afterwards, the rule of ``kallot.core.mig.headroom`` on generic
   partitions: the placement that keeps the biggest future placements wins (a 1g at the
   edge, not in the middle of a free 4g), and a nearly full GPU (little left to lose) wins
   over an emptier one; then the counters left free on the touched GPUs (best fit);
4. **island fit** (whole devices): free devices left in the chosen devices' NVLink island
   (else PCIe root, else NUMA node): best fit, so whole islands stay free for large claims;
5. **fullness** (shares): the free capacity fraction the chosen shared devices keep: best fit;
6. device ids, for a deterministic answer.

``FirstFit`` is kube-scheduler's behaviour (the first allocation in pool/slice order), for
comparisons.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

from kallot.core.dra.allocator import Candidate, Inventory, Pick, Usage
from kallot.core.dra.model import Amount, AttrValue, Device, exact

LOCALITY = ("pcieRoot", "numaNode", "nvlinkIsland")
ISLAND_ORDER = ("nvlinkIsland", "pcieRoot", "numaNode")


def attribute(dev: Device, short: str) -> AttrValue | None:
    """The device's attribute with this name in any domain (``resource.kubernetes.io/pcieRoot``
    and ``gpu.kallot.io/pcieRoot`` both answer ``pcieRoot``)."""
    for name, value in dev.attributes.items():
        if name.rsplit("/", 1)[-1] == short:
            return value
    return None


_ZERO = Fraction(0)


def _attribute(dev: Device, short: str, usage: Usage) -> AttrValue | None:
    """``attribute``, memoized on the state (the search asks it of the same devices often)."""
    key = ("attr", dev.id, short)
    if key in usage.memo:
        return usage.memo[key]  # type: ignore[return-value]
    got = usage.memo[key] = attribute(dev, short)
    return got


def _shares(terms: Sequence[tuple[Amount, Amount]]) -> Fraction:
    """The exact sum of ``numerator / denominator`` over ``terms`` (denominators not 0).
    Why: over whole amounts, one ``Fraction`` at the end instead of one per term and per
    addition (each normalizes with a gcd); the same number, so the same order and keys."""
    num, den = 0, 1
    for a, b in terms:
        if type(a) is not int or type(b) is not int:
            return sum((Fraction(a) / b for a, b in terms), _ZERO)
        num, den = num * b + a * den, den * b
    return Fraction(num, den) if num else _ZERO


def _free_share(dev: Device, usage: Usage) -> Fraction:
    """The free share of a shared device's capacities (each as a share of its total), exact."""
    got = usage.consumed.get(dev.id, {})
    return _shares(
        [(total - got.get(n, 0), total) for n, total in usage.capacity_of(dev).items() if total]
    )


def _size(dev: Device, usage: Usage) -> Fraction:
    """How much of its counter sets a partition takes (each counter as a share of its set),
    memoized on the state (the totals do not change)."""
    key = ("size", dev.id)
    hit = usage.memo.get(key)
    if hit is None:
        hit = usage.memo[key] = _size_of(dev, usage)
    return hit  # type: ignore[return-value]


def _size_of(dev: Device, usage: Usage) -> Fraction:
    terms: list[tuple[Amount, Amount]] = []
    for s, counters in dev.consumes.items():
        have = usage.counter_sets.get((dev.driver, dev.pool, s), {})
        for c, amount in counters.items():
            if have.get(c):
                terms.append((exact(amount), have[c]))
    return _shares(terms)


def _group(dev: Device, usage: Usage) -> tuple[str, AttrValue] | None:
    for short in ISLAND_ORDER:
        value = _attribute(dev, short, usage)
        if value is not None:
            return (short, value)
    return None


class KallotPolicy:
    """The default: fuller GPUs, preserved MIG layouts, local devices (module docstring)."""

    def order(self, devices: list[Device], usage: Usage) -> list[Device]:
        # Per counter set: whether it is in use and its free share (exact). The partitions of
        # one GPU share its set: computed once per set, not per partition.
        per_set: dict[tuple[str, str, str], tuple[bool, Fraction]] = {}

        def of_set(sid: tuple[str, str, str]) -> tuple[bool, Fraction]:
            hit = per_set.get(sid)
            if hit is None:
                have, taken = usage.counter_sets.get(sid, {}), usage.counters.get(sid, {})
                free = _shares([(v - taken.get(c, 0), v) for c, v in have.items() if v])
                hit = per_set[sid] = (any(taken.values()), free)
            return hit

        def key(dev: Device) -> tuple[bool, int, Fraction, tuple[str, ...], Fraction]:
            if not dev.consumes and not dev.allow_multiple:
                # A whole device without counters (most): no free share, no group, size 0.
                used = usage.in_use(dev)
                return (bool(dev.binding_conditions), 0 if used else 1, _ZERO, (), _ZERO)
            sets = sorted((dev.driver, dev.pool, s) for s in dev.consumes)
            used = usage.in_use(dev)
            free = _free_share(dev, usage) if dev.allow_multiple else _ZERO
            for sid in sets:
                in_use, set_free = of_set(sid)
                used = used or in_use
                free += set_free
            # Started and fuller units first, then a GPU's partitions together (a multi-device
            # request meets one GPU's combinations first), smaller first.
            group = tuple(x for sid in sets for x in sid)
            return (bool(dev.binding_conditions), 0 if used else 1, free, group, _size(dev, usage))

        return sorted(devices, key=key)

    def key(
        self,
        candidate: Candidate,
        usage: Usage,
        inventory: Inventory,
        *,
        beat: tuple[float, ...] | None = None,
    ) -> tuple[float, ...] | None:
        picks = [p for p in candidate.picks if not p.admin]
        waits = sum(1 for p in candidate.picks if p.device.binding_conditions)
        locality = 0
        for claim in {p.claim for p in candidate.picks}:
            devs = [p.device for p in candidate.picks if p.claim == claim]
            for short in LOCALITY:
                values = {_attribute(d, short, usage) for d in devs}
                values.discard(None)
                locality += max(0, len(values) - 1)
        opened: set[object] = set()
        touched: set[tuple[str, str, str]] = set()
        for p in picks:
            dev = p.device
            for s in dev.consumes:
                sid = (dev.driver, dev.pool, s)
                touched.add(sid)
                if not any(usage.counters.get(sid, {}).values()):
                    opened.add(sid)
            if dev.allow_multiple and not usage.in_use(dev):
                opened.add(dev.id)
        head = (float(waits), float(locality), float(len(opened)))
        if beat is not None and head > beat[:3]:
            # Every key has these three first: this one is higher than ``beat`` whatever the
            # rest (the MIG layout, the costly part, is not computed).
            return None
        # No counter set touched (no partitionable device picked): no headroom to lose.
        sizes = _partition_sizes(usage, touched, inventory) if touched else []
        before = _layout(usage, touched, inventory, sizes, memo=True)
        after = _after(usage, picks)
        now = _layout_after(after, touched, inventory, sizes, picks)
        # Headroom lost per partition size, largest first (kallot.core.mig.headroom's rule).
        lost = [sum(before[t][0][k] - now[t][0][k] for t in touched) for k in range(len(sizes))]
        left = sum((now[t][1] for t in touched), _ZERO)
        island_free = 0
        whole = [p.device for p in picks if not p.device.allow_multiple and not p.device.consumes]
        groups = {g for g in (_group(d, usage) for d in whole) if g is not None}
        if groups:
            members = _whole_by_group(usage, inventory)
            for g in groups:
                for dev in members.get(g, ()):
                    if not after.in_use(dev):
                        island_free += 1
        fullness = _ZERO
        for p in picks:
            if p.device.allow_multiple:
                fullness += _free_share(p.device, after)
        _unwind(after, picks)
        return (
            *head,
            *(float(x) for x in lost),
            float(left),
            float(island_free),
            float(fullness),
        )


def _whole_by_group(
    usage: Usage, inventory: Inventory
) -> dict[tuple[str, AttrValue], list[Device]]:
    """The whole devices (not shared, no counters) of each island group, in inventory order
    (memoized on the state: attributes do not change, only occupancy, checked per key)."""
    hit = usage.memo.get("whole_by_group")
    if hit is None:
        index: dict[tuple[str, AttrValue], list[Device]] = {}
        for pool in inventory.pools:
            for dev in pool.devices:
                if dev.allow_multiple or dev.consumes:
                    continue
                g = _group(dev, usage)
                if g is not None:
                    index.setdefault(g, []).append(dev)
        usage.memo["whole_by_group"] = hit = index
    return hit  # type: ignore[return-value]


def _by_set(usage: Usage) -> dict[tuple[str, str, str], list[Device]]:
    """Every device consuming each counter set (memoized on the state)."""
    hit = usage.memo.get("by_set")
    if hit is None:
        index: dict[tuple[str, str, str], list[Device]] = {}
        for dev in usage.devices.values():
            for s in dev.consumes:
                index.setdefault((dev.driver, dev.pool, s), []).append(dev)
        usage.memo["by_set"] = hit = index
    return hit  # type: ignore[return-value]


def _partition_sizes(
    usage: Usage, sets: set[tuple[str, str, str]], inventory: Inventory
) -> list[Fraction]:
    """The distinct sizes of the partitions consuming these counter sets, largest first
    (memoized on the state)."""
    key = ("sizes", frozenset(sets))
    hit = usage.memo.get(key)
    if hit is not None:
        return hit  # type: ignore[return-value]
    out: set[Fraction] = set()
    for pool in inventory.pools:
        for dev in pool.devices:
            if any((dev.driver, dev.pool, s) in sets for s in dev.consumes):
                out.add(_size(dev, usage))
    got = usage.memo[key] = sorted(out, reverse=True)
    return got


def _layout(
    usage: Usage,
    sets: set[tuple[str, str, str]],
    inventory: Inventory,
    sizes: list[Fraction],
    *,
    memo: bool = False,
) -> dict[tuple[str, str, str], tuple[list[int], Fraction]]:
    """Per counter set (a partitionable GPU): its headroom, how many more partitions of each
    size could still be allocated (each size on its own, greedily in slice order, as
    ``core.mig.headroom`` counts MIG instances), and the free share of its counters."""
    out: dict[tuple[str, str, str], tuple[list[int], Fraction]] = {}
    for sid in sets:
        key = ("layout", sid, tuple(sizes))
        if memo and key in usage.memo:
            out[sid] = usage.memo[key]  # type: ignore[assignment]
            continue
        by_size: dict[Fraction, list[Device]] = {}
        for dev in _by_set(usage).get(sid, ()):
            if not usage.in_use(dev):
                by_size.setdefault(_size(dev, usage), []).append(dev)
        room = []
        for size in sizes:
            taken: list[Device] = []
            for dev in by_size.get(size, ()):
                if usage.counters_fit(dev):
                    usage.take(dev, {})
                    taken.append(dev)
            for dev in reversed(taken):
                usage.release(dev, {})
            room.append(len(taken))
        total = usage.counter_sets.get(sid, {})
        used = usage.counters.get(sid, {})
        free = _shares([(v - used.get(c, 0), v) for c, v in total.items() if v])
        out[sid] = (room, free)
        if memo:
            usage.memo[key] = out[sid]
    return out


def _related(usage: Usage, sid: tuple[str, str, str]) -> frozenset[tuple[str, str, str]]:
    """The counter sets that the devices consuming ``sid`` consume (``sid`` among them): what
    ``_layout`` of ``sid`` reads (memoized on the state)."""
    key = ("related", sid)
    hit = usage.memo.get(key)
    if hit is None:
        sets = {sid}
        for dev in _by_set(usage).get(sid, ()):
            sets.update((dev.driver, dev.pool, s) for s in dev.consumes)
        usage.memo[key] = hit = frozenset(sets)
    return hit  # type: ignore[return-value]


def _layout_after(
    after: Usage,
    sets: set[tuple[str, str, str]],
    inventory: Inventory,
    sizes: list[Fraction],
    picks: Sequence[Pick],
) -> dict[tuple[str, str, str], tuple[list[int], Fraction]]:
    """``_layout`` of the state with ``picks`` taken (``_after``), memoized per counter set on
    the state by the devices picked that consume one of its related sets: ``_layout`` of a set
    reads only occupancy of its devices and the counters of their sets, and a state with the
    same such devices taken (each once or more: occupancy and counters count a device once)
    has the same layout, so candidates that differ elsewhere share it."""
    out: dict[tuple[str, str, str], tuple[list[int], Fraction]] = {}
    memo = after.memo
    for sid in sets:
        related = _related(after, sid)
        mine = frozenset(
            p.device.id
            for p in picks
            if any((p.device.driver, p.device.pool, s) in related for s in p.device.consumes)
        )
        key = ("after", sid, tuple(sizes), mine)
        hit = memo.get(key)
        if hit is None:
            hit = memo[key] = _layout(after, {sid}, inventory, sizes)[sid]
        out[sid] = hit  # type: ignore[assignment]
    return out


def _after(usage: Usage, picks: Sequence[Pick]) -> Usage:
    """``usage`` with the picks taken (undone by ``_unwind``: the same object, no copy)."""
    for p in picks:
        usage.take(p.device, p.consumed)
    return usage


def _unwind(usage: Usage, picks: Sequence[Pick]) -> None:
    for p in reversed(picks):
        usage.release(p.device, p.consumed)


class FirstFit:
    """kube-scheduler's choice: devices in pool/slice order, the first allocation found."""

    def order(self, devices: list[Device], usage: Usage) -> list[Device]:
        return list(devices)

    def key(
        self,
        candidate: Candidate,
        usage: Usage,
        inventory: Inventory,
        *,
        beat: tuple[float, ...] | None = None,
    ) -> tuple[float, ...] | None:
        return ()
