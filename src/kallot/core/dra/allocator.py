"""The DRA allocator: every valid allocation of a pod's ResourceClaims on one node, best first.

Where it sits: the core's structured-parameters allocation (KEP-4381 and its extensions), pure.
The kube shell (not wired yet) hands it the cluster's pools, DeviceClasses and existing
allocations (``Inventory``), the pod's claims and one candidate node; it answers an ``Outcome``:
the new ``ClaimAllocation`` of every unallocated claim (``config.dra.allocation_status`` writes
the JSON), the claims that are already allocated and only need the pod reserved, or the reason
nothing fits. ``kallot.core.dra.policy`` chooses among the valid allocations.

Semantics follow kube-scheduler's allocator (k8s.io/dynamic-resource-allocation/structured):
a device is a candidate for a request when its slice reaches the node, every selector of the
class and the request matches, every taint is tolerated and its capacities cover the request's
``capacity.requests``; ``ExactCount`` takes ``count`` distinct devices, ``All`` every device
matching selectors and capacity (none may be in use, tainted without toleration or out of
counters, at least one must exist; an incomplete pool reaching the node fails it); ``firstAvailable`` takes the first subrequest for
which the whole pod can be allocated; ``matchAttribute`` / ``distinctAttribute`` hold over the
devices of the requests they name; a device is in at most one allocation unless it
``allowMultipleAllocations``, in which case the sum of consumed capacity (request policies
applied) stays within its capacity; a device that ``consumesCounters`` fits only while its
counter sets have room (per pick; a shared device's later shares do not count again);
``adminAccess`` may use a device others hold but not one its own claim took, and its pick
counts for the pod's other requests, consumes counters and, on a shared device, capacity (with
a share). A selector failing on a device fails the pod only if upstream's search, in its own
device order, would meet that device first (decided by a first-fit search in that order).

The search (bounded): depth-first over requests in claim order, alternatives in order, devices
of an ``ExactCount`` request as increasing index combinations (no permutations), pruned when a
request has fewer candidates left than devices to pick, with feasibility (occupancy, counters,
capacity, constraints) checked incrementally and undone on backtrack. It collects up to
``Budget.solutions`` complete allocations and visits at most ``Budget.steps`` search nodes; the
policy scores each collected allocation (against the best so far as a bound) and the best
wins (a lower ``firstAvailable`` alternative always beats a higher one). When it found none within ``Budget.steps``, a first-fit
search in upstream's device order (pool, slice, device) goes on for ``Budget.upstream_steps``;
an outcome that hit the bound says so (``exhausted``, and the reason).

Long module: one search with its incremental feasibility state (occupancy, counters, capacity,
constraints) that every step updates and undoes on backtrack; split, the undo pairs would sit
apart from the steps they undo.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Protocol

from kallot.core.dra.model import (
    Amount,
    AttrValue,
    ClaimAllocation,
    Config,
    Device,
    DeviceClass,
    DeviceId,
    ExactRequest,
    NodeSelector,
    NodeSelectorRequirement,
    Pool,
    ResourceClaim,
    Result,
    SelectorError,
    exact,
    qualify,
    value_set,
)

CounterSetId = tuple[str, str, str]  # (driver, pool, counter set name)


@dataclass(frozen=True, slots=True)
class Inventory:
    """The cluster's DRA state: complete pools, classes, and every allocation that occupies
    devices (claims allocated by anyone, plus allocations in flight)."""

    pools: Sequence[Pool]
    classes: Mapping[str, DeviceClass]
    allocated: Sequence[ClaimAllocation] = ()
    # Pools with slices missing (``model.incomplete_pools``): none of their devices is used,
    # and an ``All`` request on a node they reach cannot be allocated.
    incomplete: Sequence[Pool] = ()


@dataclass(frozen=True, slots=True)
class Budget:
    steps: int = 20_000  # search nodes visited by the policy's search
    # Search nodes the first-fit search in upstream's order may visit when the policy's search
    # found nothing within ``steps`` (or to decide a failing selector as upstream would).
    upstream_steps: int = 2_000_000
    solutions: int = 64  # complete allocations collected for the policy to choose from


# What an untouched counter set has used (shared, never written: read-only lookups).
_NONE_USED: Mapping[str, Amount] = {}


class Usage:
    """What the existing allocations occupy: exclusive devices, consumed capacity of shared
    devices, counters. Mutable during the search (``take`` / ``release`` undo each other)."""

    def __init__(self, pools: Sequence[Pool], allocated: Sequence[ClaimAllocation]) -> None:
        self.devices: dict[DeviceId, Device] = {d.id: d for p in pools for d in p.devices}
        # Exact amounts (ints when whole): the search compares counters at every step.
        self.counter_sets: dict[tuple[str, str, str], Mapping[str, Amount]] = {
            (p.driver, p.name, s): {k: exact(v) for k, v in c.items()}
            for p in pools
            for s, c in p.counters.items()
        }
        # Per device: what it consumes of each counter set, exact (filled as met).
        self.eats: dict[
            DeviceId, tuple[tuple[CounterSetId, tuple[tuple[str, Amount], ...]], ...]
        ] = {}
        # Whole-device allocations per device: existing ones and the search's (admin access
        # included: an admin pick keeps the device from the pod's other requests, as upstream).
        self.exclusive: dict[DeviceId, int] = {}
        self.shares: dict[DeviceId, int] = {}
        self.consumed: dict[DeviceId, dict[str, Amount]] = {}
        self.counters: dict[tuple[str, str, str], dict[str, Amount]] = {}
        # Per device: its capacities as exact amounts (filled as the search meets devices).
        self.capacity: dict[DeviceId, dict[str, Amount]] = {}
        # Derived values a policy may cache for this state; valid while the state is (a policy
        # that takes picks to score them gives them back before returning).
        self.memo: dict[object, object] = {}
        for alloc in allocated:
            for r in alloc.results:
                if r.admin_access:  # as kube-scheduler: an admin result occupies nothing
                    continue
                dev = self.devices.get(r.device_id)
                if dev is None:  # a device that is gone occupies nothing
                    continue
                consumed = {k: exact(v) for k, v in r.consumed.items()}
                self.take(dev, consumed, shared=bool(r.share_id) or None)

    def copy(self) -> Usage:
        """The same state, independent of this one (cheaper than replaying the allocations)."""
        out = Usage.__new__(Usage)
        out.devices = self.devices
        out.counter_sets = self.counter_sets
        out.exclusive = dict(self.exclusive)
        out.shares = dict(self.shares)
        out.consumed = {k: dict(v) for k, v in self.consumed.items()}
        out.counters = {k: dict(v) for k, v in self.counters.items()}
        out.capacity = self.capacity
        out.eats = self.eats
        out.memo = {}
        return out

    def in_use(self, dev: Device) -> bool:
        return self.exclusive.get(dev.id, 0) > 0 or self.shares.get(dev.id, 0) > 0

    def exclusive_in_use(self, dev: Device) -> bool:
        """Allocated whole (upstream's ``deviceInUse``; shares do not count)."""
        return self.exclusive.get(dev.id, 0) > 0

    def consumes(
        self, dev: Device
    ) -> tuple[tuple[CounterSetId, tuple[tuple[str, Amount], ...]], ...]:
        """``dev.consumes`` keyed by counter set id, amounts exact (cached)."""
        got = self.eats.get(dev.id)
        if got is None:
            got = self.eats[dev.id] = tuple(
                ((dev.driver, dev.pool, s), tuple((c, exact(v)) for c, v in counters.items()))
                for s, counters in dev.consumes.items()
            )
        return got

    def take(
        self,
        dev: Device,
        consumed: Mapping[str, Amount],
        *,
        shared: bool | None = None,
        counters: bool | None = None,
    ) -> None:
        """One more allocation of ``dev``: a share (``shared``, default: when the device allows
        several) or a whole device; its counters are consumed when ``counters`` (default: when
        the device was not in use before; the search says explicitly, as upstream reserves
        them per pick)."""
        if counters is None:
            counters = not self.in_use(dev)
        if dev.allow_multiple if shared is None else shared:
            self.shares[dev.id] = self.shares.get(dev.id, 0) + 1
            used = self.consumed.setdefault(dev.id, {})
            for name, amount in consumed.items():
                used[name] = used.get(name, 0) + amount
        else:
            self.exclusive[dev.id] = self.exclusive.get(dev.id, 0) + 1
        if counters:
            for sid, taken in self.consumes(dev):
                used_c = self.counters.setdefault(sid, {})
                for c, amount in taken:
                    used_c[c] = used_c.get(c, 0) + amount

    def release(
        self,
        dev: Device,
        consumed: Mapping[str, Amount],
        *,
        shared: bool | None = None,
        counters: bool | None = None,
    ) -> None:
        """Undoes ``take`` with the same arguments."""
        if dev.allow_multiple if shared is None else shared:
            self.shares[dev.id] -= 1
            used = self.consumed[dev.id]
            for name, amount in consumed.items():
                used[name] -= amount
        else:
            self.exclusive[dev.id] -= 1
        if counters is None:
            counters = not self.in_use(dev)
        if counters:
            for sid, taken in self.consumes(dev):
                used_c = self.counters[sid]
                for c, amount in taken:
                    used_c[c] = used_c[c] - amount

    def counters_fit(self, dev: Device) -> bool:
        if self.in_use(dev):
            return True  # a shared device's counters are already counted
        return self.counters_room(dev)

    def counters_room(self, dev: Device) -> bool:
        """Whether the device's counter consumption fits what its sets have left."""
        for sid, counters in self.consumes(dev):
            total = self.counter_sets.get(sid)
            if total is None:
                return False
            used = self.counters.get(sid, _NONE_USED)
            for c, amount in counters:
                have = total.get(c)
                if have is None or used.get(c, 0) + amount > have:
                    return False
        return True

    def capacity_of(self, dev: Device) -> dict[str, Amount]:
        """The device's capacities as exact amounts."""
        got = self.capacity.get(dev.id)
        if got is None:
            got = self.capacity[dev.id] = {n: exact(c.value) for n, c in dev.capacity.items()}
        return got

    def capacity_fits(self, dev: Device, consumed: Mapping[str, Amount]) -> bool:
        used = self.consumed.get(dev.id, {})
        cap = self.capacity_of(dev)
        return all(used.get(name, 0) + amount <= cap[name] for name, amount in consumed.items())


def consumption(dev: Device, req: ExactRequest) -> dict[str, Amount] | None:
    """What one allocation of ``req`` consumes of a shared device (request policies applied);
    None when a requested amount is not valid for the device."""
    wanted = {qualify(k, dev.driver): v for k, v in req.capacity.items()}
    out: dict[str, Amount] = {}
    for name, cap in dev.capacity.items():
        policy = cap.policy
        if name in wanted:
            amount = policy.rounds(wanted[name]) if policy else wanted[name]
            if amount is None:
                return None
        elif policy is not None and policy.default is not None:
            amount = policy.default
        else:
            amount = cap.value
        out[name] = exact(amount)
    return out


class Consumptions:
    """``consumption`` per (device, request), computed once per ``allocate`` call (the filter,
    the search and the explanation ask it of the same pairs; both outlive the call, so their
    ids are stable keys)."""

    def __init__(self) -> None:
        self._got: dict[tuple[int, int], dict[str, Amount] | None] = {}

    def __call__(self, dev: Device, req: ExactRequest) -> dict[str, Amount] | None:
        key = (id(dev), id(req))
        if key in self._got:
            return self._got[key]
        got = self._got[key] = consumption(dev, req)
        return got


@dataclass(frozen=True, slots=True)
class Pick:
    """One device chosen for one request alternative of one claim."""

    claim: int  # index into the pod's unallocated claims
    request: str  # result request name: "req" or "req/sub"
    alternative: ExactRequest
    device: Device
    consumed: Mapping[str, Amount]  # of a shared device; {} otherwise
    counters: bool = False  # this pick consumed the device's counters

    @property
    def admin(self) -> bool:
        return self.alternative.admin_access


@dataclass(frozen=True, slots=True)
class Candidate:
    """A complete allocation of the pod's unallocated claims: picks and the alternative
    index chosen per request (lower is better, before any policy)."""

    picks: tuple[Pick, ...]
    alternatives: tuple[int, ...]


class Policy(Protocol):
    """Scores valid allocations; the lowest key wins (``core.dra.policy``)."""

    def order(self, devices: list[Device], usage: Usage) -> list[Device]:
        """Candidate devices in the order the search tries them (best first)."""
        ...

    def key(
        self,
        candidate: Candidate,
        usage: Usage,
        inventory: Inventory,
        *,
        beat: tuple[float, ...] | None = None,
    ) -> tuple[float, ...] | None:
        """``usage`` is what existed before the candidate (its picks not taken). Given
        ``beat`` (the best key so far), None may stand for a key that is not lower than it
        (a bound: the policy need not finish scoring a candidate that cannot win)."""
        ...


@dataclass(slots=True)
class Outcome:
    allocations: dict[str, ClaimAllocation] = field(default_factory=dict)  # claim key -> new
    reserve_only: tuple[str, ...] = ()  # claim keys already allocated, usable here
    reason: str = ""  # why nothing fits ("" when it does)
    candidates: int = 0  # complete allocations found
    steps: int = 0
    exhausted: bool = False  # the search bound was hit
    chosen: Candidate | None = None
    # The chosen allocation's (alternatives, policy key): lower is better, comparable across
    # nodes (the live scheduler ranks nodes by it).
    key: tuple[tuple[int, ...], tuple[float, ...]] | None = None

    @property
    def ok(self) -> bool:
        return not self.reason


@dataclass(slots=True)
class _Slot:
    claim: int
    request_index: int
    alternatives: tuple[tuple[str, ExactRequest, list[Device]], ...]
    # The request's alternative index of each entry (a slot narrowed to some alternatives);
    # empty: the entries' own positions.
    indices: tuple[int, ...] = ()

    def only(self, a: int) -> _Slot:
        """The slot narrowed to its ``a``-th entry."""
        index = self.indices[a] if self.indices else a
        return _Slot(self.claim, self.request_index, (self.alternatives[a],), (index,))


@dataclass(frozen=True, slots=True)
class _Alt:
    """One request alternative as the search walks it, built once per search."""

    claim: int
    index: int  # the request's alternative index (what ``Candidate.alternatives`` records)
    name: str
    req: ExactRequest
    devices: list[Device]
    # Devices whose selectors failed (the reason, per device id): the upstream-order search
    # fails there when it reaches one (upstream evaluates selectors lazily, in search order).
    errors: Mapping[DeviceId, str]
    # The claim's constraints covering this request: (constraint index, attribute, whether
    # matchAttribute), so a step does not re-read which constraints apply.
    constraints: tuple[tuple[int, str, bool], ...]


# One pick on the search's stack: (claim, request, alternative, device, consumed, counters),
# a plain tuple (a step builds one; ``Pick``s are built only for the allocations found).
_Step = tuple[int, str, ExactRequest, Device, Mapping[str, Amount], bool]


class _Stop(Exception):
    pass


class _Failed(Exception):
    """A selector failed on a device the upstream-order search reached."""


def _tolerated(dev: Device, req: ExactRequest) -> bool:
    return all(
        t.effect == "None" or any(tol.tolerates(t) for tol in req.tolerations) for t in dev.taints
    )


def _capacity_matches(dev: Device, req: ExactRequest, eats: Consumptions) -> bool:
    # Upstream's CmpRequestOverCapacity, for every device: each requested capacity exists,
    # and what the request consumes (request policy applied) is valid and within capacity.
    if not req.capacity and not dev.allow_multiple:
        # Nothing requested of a whole device: each capacity consumes its value, or its
        # policy's default (which must fit); the rest of this function answers the same.
        return all(
            c.policy is None or c.policy.default is None or c.policy.default <= c.value
            for c in dev.capacity.values()
        )
    for name in req.capacity:
        if qualify(name, dev.driver) not in dev.capacity:
            return False
    got = eats(dev, req)
    if got is None:
        return False
    if not dev.allow_multiple:
        return all(got[n] <= exact(c.value) for n, c in dev.capacity.items())
    return True


def candidates_for(
    claim: ResourceClaim,
    request: str,
    req: ExactRequest,
    devices: Sequence[Device],
    classes: Mapping[str, DeviceClass],
    *,
    eats: Consumptions | None = None,
    errors: dict[DeviceId, str] | None = None,
    base: Usage | None = None,
    node: tuple[str, Mapping[str, str]] | None = None,
) -> list[Device]:
    """The devices that may serve ``req`` (before occupancy), in the given order: class and
    request selectors, then capacity; taints too for ``ExactCount`` (an ``All`` request takes
    every matching device and fails on an untolerated taint, as upstream), and, for ``All``
    given ``base`` (the existing allocations), shared devices without the capacity left are
    left out; given ``node``, a per-device-placed device that does not reach it is left out
    after its selectors ran. A selector that fails on a device raises ``ValueError`` with a one-line reason
    naming the claim, the request and the expression; with ``errors`` given, the device is
    recorded there (and kept in the list) instead, for ``ExactCount`` requests. A missing
    class raises ``ValueError`` too."""
    cls = classes.get(req.device_class)
    if cls is None:
        raise ValueError(
            f"claim {claim.key}, request {request}: DeviceClass {req.device_class!r} not found"
        )
    eats = eats or Consumptions()
    every = req.mode == "All"
    out = []
    selectors = (*cls.selectors, *req.selectors)
    for dev in devices:
        ok = True
        for sel in selectors:
            try:
                if not sel.matches(dev):
                    ok = False
                    break
            except SelectorError as exc:
                why = (
                    f"claim {claim.key}, request {request}: selector {sel.expression!r} "
                    f"failed on device {'/'.join(dev.id)}: {exc}"
                )
                if errors is None or every:
                    raise ValueError(why) from None
                errors[dev.id] = why
                out.append(dev)
                ok = False
                break
        if not ok or not _capacity_matches(dev, req, eats):
            continue
        if node is not None and dev.per_device and not dev.placement.reaches(*node):
            continue
        if not every and not _tolerated(dev, req):
            continue
        if every and base is not None and dev.allow_multiple:
            got = eats(dev, req)
            if got is None or not base.capacity_fits(dev, got):
                continue
        out.append(dev)
    return out


class _Search:
    """Depth-first over the slots. ``upstream``: the devices are in upstream's order and the
    search visits them as upstream's does (no pruning; a failed selector on a device it
    reaches fails the whole allocation, ``_Failed``).

    Each step is on the hot path (a hard case visits millions): the state is updated in place
    (``Usage``'s dicts directly, not through ``take`` / ``release``), picks are plain tuples
    until an allocation is complete, and what does not change during the search (each
    alternative's constraints and errors) is computed once."""

    def __init__(
        self,
        claims: Sequence[ResourceClaim],
        slots: list[_Slot],
        usage: Usage,
        budget: Budget,
        eats: Consumptions,
        *,
        errors: Mapping[tuple[int, int, int], Mapping[DeviceId, str]] | None = None,
    ) -> None:
        self.claims = claims
        self.slots = slots
        self.usage = usage
        self.budget = budget
        self.steps = 0
        self.found = 0
        self.stack: list[_Step] = []
        self.alts: list[int] = []
        self.exhausted = False
        self.upstream = errors is not None
        self.errors = errors or {}
        # Per claim: values fixed by matchAttribute, values used by distinctAttribute.
        self.match: list[dict[int, list[AttrValue]]] = [{} for _ in claims]
        self.distinct: list[dict[int, list[AttrValue]]] = [{} for _ in claims]
        # Per claim: its whole-device picks (admin access may not repeat one of them).
        self.whole: list[dict[DeviceId, int]] = [{} for _ in claims]
        # (claim, request, device) of the shared devices picked: one share per request.
        self.shared: set[tuple[int, str, DeviceId]] = set()
        self._alt_of: list[_Alt] = []  # the alternative of each step on the stack
        self.consumption = eats
        self.walk: list[tuple[_Alt, ...]] = []
        for slot in slots:
            cons = claims[slot.claim].constraints
            alts = []
            for a, (name, req, devices) in enumerate(slot.alternatives):
                index = slot.indices[a] if slot.indices else a
                covering = tuple(
                    (c, con.match_attribute or con.distinct_attribute, bool(con.match_attribute))
                    for c, con in enumerate(cons)
                    if con.covers(name)
                )
                failed = self.errors.get((slot.claim, slot.request_index, index), {})
                alts.append(_Alt(slot.claim, index, name, req, devices, failed, covering))
            self.walk.append(tuple(alts))

    @property
    def picks(self) -> tuple[Pick, ...]:
        """The picks taken now (after ``run`` stopped at an allocation: that allocation's)."""
        return tuple(Pick(*step) for step in self.stack)

    def run(self) -> Iterator[Candidate]:
        try:
            yield from self._slot(0)
        except _Stop:
            return

    def _slot(self, i: int) -> Iterator[Candidate]:
        if i == len(self.walk):
            self.found += 1
            yield Candidate(self.picks, tuple(self.alts))
            if self.found >= self.budget.solutions:
                raise _Stop
            return
        for alt in self.walk[i]:
            self.alts.append(alt.index)
            if alt.req.mode == "All":
                if alt.devices:
                    yield from self._all(i, alt, 0)
            else:
                yield from self._choose(i, alt, 0, alt.req.count)
            self.alts.pop()

    def _all(self, i: int, alt: _Alt, k: int) -> Iterator[Candidate]:
        if k == len(alt.devices):
            yield from self._slot(i + 1)
            return
        self.steps += 1
        if self.steps > self.budget.steps:
            self.exhausted = True
            raise _Stop
        step = self._try(alt, alt.devices[k])
        if step is None:
            return  # "All" needs every matching device
        yield from self._all(i, alt, k + 1)
        self._undo(step)

    def _choose(self, i: int, alt: _Alt, start: int, left: int) -> Iterator[Candidate]:
        if left == 0:
            yield from self._slot(i + 1)
            return
        devices, errors, limit = alt.devices, alt.errors, self.budget.steps
        # Pruned to leave room for the devices still to pick, except in upstream's order
        # (upstream visits every device, and a failing selector on one fails the allocation).
        end = len(devices) if self.upstream else len(devices) - left + 1
        for k in range(start, end):
            self.steps += 1
            if self.steps > limit:
                self.exhausted = True
                raise _Stop
            dev = devices[k]
            if errors and dev.id in errors:
                if self._visible(alt.claim, alt.req, dev):
                    raise _Failed(errors[dev.id])
                continue
            step = self._try(alt, dev)
            if step is None:
                continue
            yield from self._choose(i, alt, k + 1, left - 1)
            self._undo(step)

    def _visible(self, claim: int, req: ExactRequest, dev: Device) -> bool:
        """Whether upstream evaluates the selectors on ``dev``: it skips a device in use
        first (admin access: in use by the same claim)."""
        if req.admin_access:
            return dev.allow_multiple or not self.whole[claim].get(dev.id)
        return not self.usage.exclusive_in_use(dev)

    def _try(self, alt: _Alt, dev: Device) -> _Step | None:
        usage = self.usage
        claim, req, did = alt.claim, alt.req, dev.id
        shared = dev.allow_multiple
        # Upstream's order of checks (allocateDevice): in use, counters, taints, constraints,
        # capacity. Admin access ignores others' allocations but not the claim's own whole
        # devices, and, like any pick, consumes counters and, on a shared device, capacity.
        if req.admin_access:
            if not shared and self.whole[claim].get(did):
                return None
        elif usage.exclusive.get(did, 0) > 0:
            return None
        if shared and (claim, alt.name, did) in self.shared:
            return None  # a shared device serves one request of a claim once
        counters = False
        if dev.consumes and not (shared and usage.shares.get(did, 0) > 0):
            if not usage.counters_room(dev):
                return None
            counters = True
        if req.mode == "All" and dev.taints and not _tolerated(dev, req):
            return None
        if alt.constraints and not self._constraints_ok(alt, dev):
            return None
        consumed: Mapping[str, Amount] = _NONE_USED
        if shared:
            got = self.consumption(dev, req)
            if got is None or not usage.capacity_fits(dev, got):
                return None
            consumed = got
        step = (claim, alt.name, req, dev, consumed, counters)
        self._apply(step, alt)
        return step

    def _constraints_ok(self, alt: _Alt, dev: Device) -> bool:
        attrs = dev.attributes
        match, distinct = self.match[alt.claim], self.distinct[alt.claim]
        for c, attr, is_match in alt.constraints:
            value = attrs.get(attr)
            if value is None:
                return False
            if is_match:
                fixed = match.get(c)
                if fixed and not _common(fixed, value):
                    return False
            elif c in distinct and any(value_set(value) & value_set(v) for v in distinct[c]):
                return False
        return True

    def _apply(self, step: _Step, alt: _Alt) -> None:
        # ``Usage.take(dev, consumed, shared=dev.allow_multiple, counters=...)``, inlined.
        claim, name, _, dev, consumed, counters = step
        usage, did = self.usage, dev.id
        if dev.allow_multiple:
            usage.shares[did] = usage.shares.get(did, 0) + 1
            used = usage.consumed.setdefault(did, {})
            for n, amount in consumed.items():
                used[n] = used.get(n, 0) + amount
            self.shared.add((claim, name, did))
        else:
            usage.exclusive[did] = usage.exclusive.get(did, 0) + 1
            whole = self.whole[claim]
            whole[did] = whole.get(did, 0) + 1
        if counters:
            for sid, taken in usage.consumes(dev):
                used_c = usage.counters.setdefault(sid, {})
                for counter, amount in taken:
                    used_c[counter] = used_c.get(counter, 0) + amount
        if alt.constraints:
            for c, attr, is_match in alt.constraints:
                table = self.match if is_match else self.distinct
                table[claim].setdefault(c, []).append(dev.attributes[attr])
        self.stack.append(step)
        self._alt_of.append(alt)

    def _undo(self, step: _Step) -> None:
        popped = self.stack.pop()
        assert popped is step
        alt = self._alt_of.pop()
        claim, name, _, dev, consumed, counters = step
        usage, did = self.usage, dev.id
        if dev.allow_multiple:
            usage.shares[did] -= 1
            used = usage.consumed[did]
            for n, amount in consumed.items():
                used[n] -= amount
            self.shared.discard((claim, name, did))
        else:
            usage.exclusive[did] -= 1
            self.whole[claim][did] -= 1
        if counters:
            for sid, taken in usage.consumes(dev):
                used_c = usage.counters[sid]
                for counter, amount in taken:
                    used_c[counter] = used_c[counter] - amount
        for c, _attr, is_match in alt.constraints:
            table = self.match if is_match else self.distinct
            table[claim][c].pop()


def _common(fixed: list[AttrValue], value: AttrValue) -> bool:
    """matchAttribute: the values every chosen device shares (a list-type attribute's values
    intersected, as upstream with DRAListTypeAttributes) still meet ``value``."""
    if not isinstance(value, tuple) and not any(isinstance(v, tuple) for v in fixed):
        return value_set(fixed[0]) == value_set(value)
    common = value_set(value)
    for v in fixed:
        common &= value_set(v)
    return bool(common)


def share_id(claim: ResourceClaim, request: str, dev: Device) -> str:
    """A stable shareID for one share of a device (a UUID, unique per claim/request/device)."""
    name = f"{claim.uid or claim.key}/{request}/{'/'.join(dev.id)}"
    return str(uuid.uuid5(uuid.NAMESPACE_URL, name))


def _node_selector(picks: Sequence[Pick], node: str) -> NodeSelector | None:
    """The allocation's node selector, as upstream builds it: a node-local device pins the
    node; network-attached devices contribute their slice's single term; allNodes nothing."""
    reqs: list[NodeSelectorRequirement] = []
    for p in picks:
        place = p.device.placement
        if place.node_name:
            pin = NodeSelectorRequirement("metadata.name", "In", (place.node_name,), field=True)
            return NodeSelector(((pin,),))
        if place.node_selector is not None and place.node_selector.terms:
            for r in place.node_selector.terms[0]:
                if r not in reqs:
                    reqs.append(r)
    return NodeSelector((tuple(reqs),)) if reqs else None


def _claim_allocation(
    claim: ResourceClaim, picks: Sequence[Pick], node: str, classes: Mapping[str, DeviceClass]
) -> ClaimAllocation:
    results = []
    for p in picks:
        shared = p.device.allow_multiple  # admin access too: a share, as upstream
        results.append(
            Result(
                request=p.request,
                driver=p.device.driver,
                pool=p.device.pool,
                device=p.device.name,
                admin_access=p.admin,
                share_id=share_id(claim, p.request, p.device) if shared else "",
                consumed={k: Fraction(v) for k, v in p.consumed.items()} if shared else {},
                tolerations=p.alternative.tolerations,
                binding_conditions=p.device.binding_conditions,
                binding_failure_conditions=p.device.binding_failure_conditions,
            )
        )
    config: list[tuple[str, Config]] = []
    seen: set[str] = set()
    for p in picks:
        if p.request in seen:
            continue
        seen.add(p.request)
        for cfg in classes[p.alternative.device_class].config:
            config.append(("FromClass", Config(cfg.driver, cfg.parameters, (p.request,))))
    config.extend(("FromClaim", cfg) for cfg in claim.config)
    return ClaimAllocation(
        tuple(results),
        tuple((src, cfg) for src, cfg in config),  # type: ignore[misc]
        _node_selector(picks, node),
    )


def _slot_summary(claim: ResourceClaim, slot: _Slot, usage: Usage, eats: Consumptions) -> str:
    """``claim ns/c, request gpu: 3 devices match, 2 in use`` (the first alternative's view:
    what explain shows for a request that cannot be served)."""
    name, req, devices = slot.alternatives[0]
    taken = sum(
        1
        for d in devices
        if not req.admin_access
        and ((not d.allow_multiple and usage.in_use(d)) or not usage.counters_fit(d))
    )
    full = sum(
        1
        for d in devices
        if d.allow_multiple
        and not req.admin_access
        and not usage.capacity_fits(d, eats(d, req) or {})
    )
    want = "all" if req.mode == "All" else str(req.count)
    text = f"claim {claim.key}, request {name}: wants {want}, {len(devices)} devices match"
    if taken:
        text += f", {taken} in use or out of counters"
    if full:
        text += f", {full} without the capacity left"
    return text


def _binding_last(pools: Sequence[Pool]) -> list[Pool]:
    """Pools in upstream's search order: those with a device that has binding conditions
    after the others (GatherPools with DRADeviceBindingConditions), each part in pool order."""
    later = [p for p in pools if any(d.binding_conditions for d in p.devices)]
    if not later:
        return list(pools)
    seen = {id(p) for p in later}
    return [p for p in pools if id(p) not in seen] + later


def _reaches(pool: Pool, node: str, labels: Mapping[str, str]) -> bool:
    # Upstream counts a pool for a node when a slice of it has counter sets or reaches it.
    return bool(pool.counters) or any(d.placement.reaches(node, labels) for d in pool.devices)


def allocate(
    claims: Sequence[ResourceClaim],
    node: str,
    labels: Mapping[str, str],
    inventory: Inventory,
    *,
    policy: Policy,
    budget: Budget | None = None,
) -> Outcome:
    """Allocate a pod's claims on ``node`` (see the module docstring for the semantics)."""
    budget = budget or Budget()
    out = Outcome()
    reserve: list[str] = []
    todo: list[ResourceClaim] = []
    for claim in claims:
        if claim.allocation is None:
            todo.append(claim)
            continue
        sel = claim.allocation.node_selector
        if sel is not None and not sel.matches(node, labels):
            out.reason = f"claim {claim.key}: allocated to devices not reachable from node {node}"
            return out
        reserve.append(claim.key)
    out.reserve_only = tuple(reserve)
    if not todo:
        return out
    devices: list[Device] = []
    for p in _binding_last(inventory.pools):
        here = [d.placement.reaches(node, labels) for d in p.devices]
        # A per-device-placed device of a pool that reaches the node is met by upstream's
        # selectors even where it does not reach (candidates_for then leaves it out).
        devices.extend(
            d for d, h in zip(p.devices, here, strict=True) if h or (d.per_device and any(here))
        )
    usage = Usage(inventory.pools, inventory.allocated)
    base = usage.copy()  # the state without the search's picks, for the policy's key
    incomplete = [p for p in inventory.incomplete if _reaches(p, node, labels)]
    slots: list[_Slot] = []
    upstream_slots: list[_Slot] = []  # the same, devices in upstream's order, failures kept
    errors: dict[tuple[int, int, int], dict[DeviceId, str]] = {}
    eats = Consumptions()
    try:
        for c, claim in enumerate(todo):
            for r, request in enumerate(claim.requests):
                alts, raw = [], []
                for a, (name, req) in enumerate(request.alternatives()):
                    if req.mode == "All" and incomplete:
                        p = incomplete[0]
                        raise ValueError(
                            f"claim {claim.key}, request {name}: asks for all devices, but "
                            f"resource pool {p.driver}/{p.name} is currently being updated"
                        )
                    failed: dict[DeviceId, str] = {}
                    found = candidates_for(
                        claim, name, req, devices, inventory.classes,
                        eats=eats, errors=failed, base=base, node=(node, labels),
                    )  # fmt: skip
                    if failed:
                        errors[(c, r, a)] = failed
                    good = [d for d in found if d.id not in failed]
                    alts.append((name, req, policy.order(good, usage)))
                    raw.append((name, req, found))
                if not any(devs for _, _, devs in alts) and not errors:
                    out.reason = (
                        f"claim {claim.key}, request {request.name}: no device on node {node} "
                        "matches its class, selectors, tolerations and capacity"
                    )
                    return out
                slots.append(_Slot(c, r, tuple(alts)))
                upstream_slots.append(_Slot(c, r, tuple(raw)))
    except ValueError as exc:
        out.reason = str(exc)
        return out
    fallback: Candidate | None = None
    if errors:
        # Upstream evaluates selectors lazily, in its search order: a selector that fails on
        # a device the search reaches before its first allocation fails the pod. Decide as
        # upstream would, then choose by policy among the devices that did not fail.
        probe = _Search(
            todo, upstream_slots, usage, Budget(budget.upstream_steps, 1), eats, errors=errors
        )
        try:
            fallback = next(probe.run(), None)
        except _Failed as exc:
            out.reason = str(exc)
            return out
        finally:
            out.steps += probe.steps
        if fallback is None:
            out.exhausted = probe.exhausted
            out.reason = _no_allocation(
                todo=todo, slots=slots, node=node, base=base, eats=eats, search=probe
            )
            return out
        usage = base.copy()
    search = _Search(todo, slots, usage, budget, eats)
    best, best_key = _best(search, policy, base, inventory, out)
    if best is not None and any(best.alternatives):
        # The bounded collection may have met only higher firstAvailable alternatives: narrow
        # to the lowest that fit and rank those (when they are lower than what it found).
        narrowed = _lowest_alternatives(todo, slots, base, budget, eats)
        lowest = tuple(s.indices[0] if s.indices else 0 for s in narrowed)
        if lowest < best.alternatives:
            search = _Search(todo, narrowed, base.copy(), budget, eats)
            best, best_key = _best(search, policy, base, inventory, out)
    out.exhausted = search.exhausted
    if best is None and search.exhausted and fallback is None:
        # The policy's order ran out of steps: search on in upstream's order (first fit), as
        # far as upstream's own filter budget would let it go.
        first = _Search(
            todo, upstream_slots, base.copy(), Budget(budget.upstream_steps, 1), eats, errors={}
        )
        fallback = next(first.run(), None)
        out.steps += first.steps
        out.exhausted = first.exhausted
        search = first
    if best is None and fallback is not None:
        best = fallback
        scored = policy.key(fallback, base, inventory)
        assert scored is not None  # no bound given
        best_key = (fallback.alternatives, scored)
        out.candidates += 1
    if best is None:
        out.reason = _no_allocation(
            todo=todo, slots=slots, node=node, base=base, eats=eats, search=search
        )
        return out
    out.chosen, out.key = best, best_key
    for c, claim in enumerate(todo):
        picks = [p for p in best.picks if p.claim == c]
        out.allocations[claim.key] = _claim_allocation(claim, picks, node, inventory.classes)
    return out


def _best(
    search: _Search, policy: Policy, base: Usage, inventory: Inventory, out: Outcome
) -> tuple[Candidate | None, tuple[tuple[int, ...], tuple[float, ...]] | None]:
    """The search's allocations ranked (alternatives, then the policy's key): the best (the
    first found among equal keys). A candidate whose alternatives are higher than the best's
    cannot win and is not scored; one with the same alternatives is scored against the best's
    key as a bound (the policy may stop as soon as it cannot be lower)."""
    best: Candidate | None = None
    best_key: tuple[tuple[int, ...], tuple[float, ...]] | None = None
    for cand in search.run():
        out.candidates += 1
        if best_key is not None and cand.alternatives > best_key[0]:
            continue
        beat = best_key[1] if best_key is not None and cand.alternatives == best_key[0] else None
        scored = policy.key(cand, base, inventory, beat=beat)
        if scored is None:
            continue
        key = (cand.alternatives, scored)
        if best_key is None or key < best_key:
            best, best_key = cand, key
    out.steps += search.steps
    return best, best_key


def _lowest_alternatives(
    todo: Sequence[ResourceClaim],
    slots: list[_Slot],
    usage: Usage,
    budget: Budget,
    eats: Consumptions,
) -> list[_Slot]:
    """The slots narrowed to the lowest firstAvailable alternatives that fit, request by
    request in claim order (each the lowest with which the rest can still be allocated): the
    policy's search then ranks allocations of those only. Its bounded collection alone could
    miss them (its first allocations may all take a higher one). A check that runs out of
    ``Budget.steps`` counts as not fitting."""
    if all(len(s.alternatives) == 1 for s in slots):
        return slots
    fixed: list[_Slot] = []
    for i, slot in enumerate(slots):
        if len(slot.alternatives) == 1:
            fixed.append(slot)
            continue
        for a in range(len(slot.alternatives)):
            trial = [*fixed, slot.only(a), *slots[i + 1 :]]
            # A copy: the search stops at its first allocation with the picks still taken.
            probe = _Search(todo, trial, usage.copy(), Budget(budget.steps, 1), eats)
            if next(probe.run(), None) is not None:
                fixed.append(slot.only(a))
                break
        else:
            return slots  # nothing fits: the full search says why
    return fixed


def _no_allocation(
    *,
    todo: Sequence[ResourceClaim],
    slots: Sequence[_Slot],
    node: str,
    base: Usage,
    eats: Consumptions,
    search: _Search,
) -> str:
    bound = (
        f" (search bound reached: {search.steps:,} steps; the search gave up)"
        if search.exhausted
        else ""
    )
    return (
        f"claims {', '.join(c.key for c in todo)}: no allocation on node {node} satisfies "
        f"every request, constraint, counter and capacity together{bound}; "
        + "; ".join(_slot_summary(todo[slot.claim], slot, base, eats) for slot in slots)
    )
