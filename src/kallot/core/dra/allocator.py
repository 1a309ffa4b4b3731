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
``capacity.requests``; ``ExactCount`` takes ``count`` distinct devices, ``All`` every candidate
(none may be in use, at least one must exist); ``firstAvailable`` takes the first subrequest for
which the whole pod can be allocated; ``matchAttribute`` / ``distinctAttribute`` hold over the
devices of the requests they name; a device is in at most one allocation unless it
``allowMultipleAllocations``, in which case the sum of consumed capacity (request policies
applied) stays within its capacity; a device that ``consumesCounters`` fits only while its
counter sets have room (counted once per device however many shares it has); ``adminAccess``
allocations use a device without occupying it.

The search (bounded): depth-first over requests in claim order, alternatives in order, devices
of an ``ExactCount`` request as increasing index combinations (no permutations), pruned when a
request has fewer candidates left than devices to pick, with feasibility (occupancy, counters,
capacity, constraints) checked incrementally and undone on backtrack. It collects up to
``Budget.solutions`` complete allocations and visits at most ``Budget.steps`` search nodes; the
policy scores every collected allocation and the best wins (a lower ``firstAvailable``
alternative always beats a higher one, as upstream). Until the first allocation is found the
search runs to ``Budget.steps``; an outcome that hit the bound says so (``exhausted``).

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
)


@dataclass(frozen=True, slots=True)
class Inventory:
    """The cluster's DRA state: complete pools, classes, and every allocation that occupies
    devices (claims allocated by anyone, plus allocations in flight)."""

    pools: Sequence[Pool]
    classes: Mapping[str, DeviceClass]
    allocated: Sequence[ClaimAllocation] = ()


@dataclass(frozen=True, slots=True)
class Budget:
    steps: int = 20_000  # search nodes visited, in all
    solutions: int = 64  # complete allocations collected for the policy to choose from


class Usage:
    """What the existing allocations occupy: exclusive devices, consumed capacity of shared
    devices, counters. Mutable during the search (``take`` / ``release`` undo each other)."""

    def __init__(self, pools: Sequence[Pool], allocated: Sequence[ClaimAllocation]) -> None:
        self.devices: dict[DeviceId, Device] = {d.id: d for p in pools for d in p.devices}
        self.counter_sets: dict[tuple[str, str, str], Mapping[str, Fraction]] = {
            (p.driver, p.name, s): c for p in pools for s, c in p.counters.items()
        }
        self.exclusive: set[DeviceId] = set()
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
                if r.admin_access:
                    continue
                dev = self.devices.get(r.device_id)
                if dev is None:  # a device that is gone occupies nothing
                    continue
                self.take(dev, {k: exact(v) for k, v in r.consumed.items()})

    def copy(self) -> Usage:
        """The same state, independent of this one (cheaper than replaying the allocations)."""
        out = Usage.__new__(Usage)
        out.devices = self.devices
        out.counter_sets = self.counter_sets
        out.exclusive = set(self.exclusive)
        out.shares = dict(self.shares)
        out.consumed = {k: dict(v) for k, v in self.consumed.items()}
        out.counters = {k: dict(v) for k, v in self.counters.items()}
        out.capacity = self.capacity
        out.memo = {}
        return out

    def in_use(self, dev: Device) -> bool:
        return dev.id in self.exclusive or self.shares.get(dev.id, 0) > 0

    def take(self, dev: Device, consumed: Mapping[str, Amount]) -> None:
        first = not self.in_use(dev)
        if dev.allow_multiple:
            self.shares[dev.id] = self.shares.get(dev.id, 0) + 1
            used = self.consumed.setdefault(dev.id, {})
            for name, amount in consumed.items():
                used[name] = used.get(name, 0) + amount
        else:
            self.exclusive.add(dev.id)
        if first:
            for s, counters in dev.consumes.items():
                used_c = self.counters.setdefault((dev.driver, dev.pool, s), {})
                for c, amount in counters.items():
                    used_c[c] = exact(used_c.get(c, 0) + amount)

    def release(self, dev: Device, consumed: Mapping[str, Amount]) -> None:
        if dev.allow_multiple:
            self.shares[dev.id] -= 1
            used = self.consumed[dev.id]
            for name, amount in consumed.items():
                used[name] -= amount
        else:
            self.exclusive.discard(dev.id)
        if not self.in_use(dev):
            for s, counters in dev.consumes.items():
                used_c = self.counters[(dev.driver, dev.pool, s)]
                for c, amount in counters.items():
                    used_c[c] = exact(used_c[c] - amount)

    def counters_fit(self, dev: Device) -> bool:
        if self.in_use(dev):
            return True  # a shared device's counters are already counted
        for s, counters in dev.consumes.items():
            total = self.counter_sets.get((dev.driver, dev.pool, s))
            if total is None:
                return False
            used = self.counters.get((dev.driver, dev.pool, s), {})
            for c, amount in counters.items():
                if c not in total or used.get(c, 0) + amount > total[c]:
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

    def key(self, candidate: Candidate, usage: Usage, inventory: Inventory) -> tuple[float, ...]:
        """``usage`` is what existed before the candidate (its picks not taken)."""
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


@dataclass(frozen=True, slots=True)
class _Alt:
    claim: int
    name: str
    req: ExactRequest
    devices: list[Device]


class _Stop(Exception):
    pass


def _tolerated(dev: Device, req: ExactRequest) -> bool:
    return all(
        t.effect == "None" or any(tol.tolerates(t) for tol in req.tolerations) for t in dev.taints
    )


def _capacity_matches(dev: Device, req: ExactRequest, eats: Consumptions) -> bool:
    for name, amount in req.capacity.items():
        cap = dev.capacity.get(qualify(name, dev.driver))
        if cap is None:
            return False
        if not dev.allow_multiple and cap.value < amount:
            return False
    return not dev.allow_multiple or eats(dev, req) is not None


def candidates_for(
    claim: ResourceClaim,
    request: str,
    req: ExactRequest,
    devices: Sequence[Device],
    classes: Mapping[str, DeviceClass],
    *,
    eats: Consumptions | None = None,
) -> list[Device]:
    """The devices that may serve ``req`` (before occupancy): class and request selectors,
    taints, capacity. Raises ``ValueError`` with a one-line reason naming the claim, the
    request and the expression when a class is missing or a selector fails."""
    cls = classes.get(req.device_class)
    if cls is None:
        raise ValueError(
            f"claim {claim.key}, request {request}: DeviceClass {req.device_class!r} not found"
        )
    eats = eats or Consumptions()
    out = []
    for dev in devices:
        if not _tolerated(dev, req) or not _capacity_matches(dev, req, eats):
            continue
        ok = True
        for sel in (*cls.selectors, *req.selectors):
            try:
                if not sel.matches(dev):
                    ok = False
                    break
            except SelectorError as exc:
                raise ValueError(
                    f"claim {claim.key}, request {request}: selector {sel.expression!r} "
                    f"failed on device {'/'.join(dev.id)}: {exc}"
                ) from None
        if ok:
            out.append(dev)
    return out


class _Search:
    def __init__(
        self,
        claims: Sequence[ResourceClaim],
        slots: list[_Slot],
        usage: Usage,
        budget: Budget,
        eats: Consumptions,
    ) -> None:
        self.claims = claims
        self.slots = slots
        self.usage = usage
        self.budget = budget
        self.steps = 0
        self.found = 0
        self.picks: list[Pick] = []
        self.alts: list[int] = []
        self.exhausted = False
        # Per claim: values fixed by matchAttribute, values used by distinctAttribute.
        self.match: list[dict[int, list[AttrValue]]] = [{} for _ in claims]
        self.distinct: list[dict[int, list[AttrValue]]] = [{} for _ in claims]
        self.consumption = eats

    def run(self) -> Iterator[Candidate]:
        try:
            yield from self._slot(0)
        except _Stop:
            return

    def _tick(self) -> None:
        self.steps += 1
        if self.steps > self.budget.steps:
            self.exhausted = True
            raise _Stop

    def _slot(self, i: int) -> Iterator[Candidate]:
        if i == len(self.slots):
            self.found += 1
            yield Candidate(tuple(self.picks), tuple(self.alts))
            if self.found >= self.budget.solutions:
                raise _Stop
            return
        slot = self.slots[i]
        for a, (name, req, devices) in enumerate(slot.alternatives):
            self.alts.append(a)
            alt = _Alt(slot.claim, name, req, devices)
            if req.mode == "All":
                if devices:
                    yield from self._all(i, alt, 0)
            else:
                yield from self._choose(i, alt, 0, req.count)
            self.alts.pop()

    def _all(self, i: int, alt: _Alt, k: int) -> Iterator[Candidate]:
        if k == len(alt.devices):
            yield from self._slot(i + 1)
            return
        self._tick()
        pick = self._try(alt.claim, alt.name, alt.req, alt.devices[k])
        if pick is None:
            return  # "All" needs every matching device
        yield from self._all(i, alt, k + 1)
        self._undo(pick)

    def _choose(self, i: int, alt: _Alt, start: int, left: int) -> Iterator[Candidate]:
        if left == 0:
            yield from self._slot(i + 1)
            return
        for k in range(start, len(alt.devices) - left + 1):
            self._tick()
            pick = self._try(alt.claim, alt.name, alt.req, alt.devices[k])
            if pick is None:
                continue
            yield from self._choose(i, alt, k + 1, left - 1)
            self._undo(pick)

    def _try(self, claim: int, name: str, req: ExactRequest, dev: Device) -> Pick | None:
        usage = self.usage
        mine = [p for p in self.picks if p.claim == claim]
        if any(
            p.device.id == dev.id and (p.request == name or not dev.allow_multiple) for p in mine
        ):
            return None  # a device serves one request of a claim once (shared: once per request)
        consumed: Mapping[str, Amount] = {}
        if not req.admin_access:
            if dev.allow_multiple:
                got = self.consumption(dev, req)
                if got is None or not usage.capacity_fits(dev, got):
                    return None
                consumed = got
            elif usage.in_use(dev):
                return None
            if not usage.counters_fit(dev):
                return None
        elif any(p.device.id == dev.id for p in mine):
            return None  # admin access: once per claim; other claims' allocations don't count
        if not self._constraints_ok(claim, name, dev):
            return None
        pick = Pick(claim, name, req, dev, consumed)
        self._apply(pick)
        return pick

    def _constraints_ok(self, claim: int, name: str, dev: Device) -> bool:
        for c, con in enumerate(self.claims[claim].constraints):
            if not con.covers(name):
                continue
            attr = con.match_attribute or con.distinct_attribute
            value = dev.attributes.get(attr)
            if value is None:
                return False
            if con.match_attribute:
                fixed = self.match[claim].get(c)
                if fixed and fixed[0] != value:
                    return False
            elif value in self.distinct[claim].get(c, ()):
                return False
        return True

    def _apply(self, pick: Pick) -> None:
        if not pick.admin:
            self.usage.take(pick.device, pick.consumed)
        for c, con in enumerate(self.claims[pick.claim].constraints):
            if con.covers(pick.request):
                attr = con.match_attribute or con.distinct_attribute
                table = self.match if con.match_attribute else self.distinct
                table[pick.claim].setdefault(c, []).append(pick.device.attributes[attr])
        self.picks.append(pick)

    def _undo(self, pick: Pick) -> None:
        popped = self.picks.pop()
        assert popped is pick
        if not pick.admin:
            self.usage.release(pick.device, pick.consumed)
        for c, con in enumerate(self.claims[pick.claim].constraints):
            if con.covers(pick.request):
                table = self.match if con.match_attribute else self.distinct
                table[pick.claim][c].pop()


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
        shared = p.device.allow_multiple and not p.admin
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
    devices = [d for p in inventory.pools for d in p.devices if d.placement.reaches(node, labels)]
    usage = Usage(inventory.pools, inventory.allocated)
    base = usage.copy()  # the state without the search's picks, for the policy's key
    slots: list[_Slot] = []
    eats = Consumptions()
    try:
        for c, claim in enumerate(todo):
            for r, request in enumerate(claim.requests):
                alts = []
                for name, req in request.alternatives():
                    found = candidates_for(claim, name, req, devices, inventory.classes, eats=eats)
                    alts.append((name, req, policy.order(found, usage)))
                if not any(devs for _, _, devs in alts):
                    out.reason = (
                        f"claim {claim.key}, request {request.name}: no device on node {node} "
                        "matches its class, selectors, tolerations and capacity"
                    )
                    return out
                slots.append(_Slot(c, r, tuple(alts)))
    except ValueError as exc:
        out.reason = str(exc)
        return out
    search = _Search(todo, slots, usage, budget, eats)
    best: Candidate | None = None
    best_key: tuple[tuple[int, ...], tuple[float, ...]] | None = None
    for cand in search.run():
        out.candidates += 1
        key = (cand.alternatives, policy.key(cand, base, inventory))
        if best_key is None or key < best_key:
            best, best_key = cand, key
    out.steps, out.exhausted = search.steps, search.exhausted
    if best is None:
        bound = " (search bound reached)" if search.exhausted else ""
        out.reason = (
            f"claims {', '.join(c.key for c in todo)}: no allocation on node {node} satisfies "
            f"every request, constraint, counter and capacity together{bound}; "
            + "; ".join(_slot_summary(todo[slot.claim], slot, base, eats) for slot in slots)
        )
        return out
    out.chosen, out.key = best, best_key
    for c, claim in enumerate(todo):
        picks = [p for p in best.picks if p.claim == c]
        out.allocations[claim.key] = _claim_allocation(claim, picks, node, inventory.classes)
    return out
