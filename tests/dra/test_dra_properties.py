"""Properties of the DRA allocator against a brute-force oracle on small random worlds.

The oracle enumerates every assignment (each request's alternative, any device combination)
and keeps those the independent checker ``valid`` accepts; the checker re-derives every rule
from the model (selectors, taints, All mode, constraints, exclusivity, counters, consumable
capacity with request policies) without the allocator's incremental bookkeeping.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from fractions import Fraction

from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from kallot.config.dra_cel import compile_selector
from kallot.core.dra.allocator import Budget, Inventory, allocate
from kallot.core.dra.model import (
    Capacity,
    ClaimAllocation,
    Constraint,
    Device,
    DeviceClass,
    ExactRequest,
    Placement,
    Pool,
    Request,
    RequestPolicy,
    ResourceClaim,
    Result,
    Taint,
    Toleration,
)
from kallot.core.dra.policy import FirstFit, KallotPolicy

D = "d.io"
NODE = "n"
SELECTORS = (
    "",
    f"has(device.attributes['{D}'].a) && device.attributes['{D}'].a >= 1",
    f"device.attributes['{D}'].s == 'x'",
    f"device.capacity['{D}'].memory.compareTo(quantity('2')) >= 0",
)
CLASSES = {
    "any": DeviceClass("any", ()),
    "x": DeviceClass("x", (compile_selector(SELECTORS[2], "class x"),)),
}
TAINT = Taint("bad", "yes", "NoSchedule")
TOLERATE = Toleration("bad", "Exists")

policies = st.one_of(
    st.none(),
    st.builds(lambda d: RequestPolicy(default=Fraction(d)), st.integers(1, 3)),
    st.builds(
        lambda vs: RequestPolicy(valid_values=tuple(sorted(Fraction(v) for v in set(vs)))),
        st.lists(st.integers(1, 4), min_size=1, max_size=3),
    ),
    st.builds(
        lambda step, mx: RequestPolicy(min=Fraction(1), step=Fraction(step), max=mx),
        st.integers(1, 2),
        st.sampled_from([None, Fraction(3)]),
    ),
)


@st.composite
def devices(draw: st.DrawFn, k: int) -> Device:
    attrs: dict[str, int | str] = {f"{D}/s": draw(st.sampled_from(["x", "y"]))}
    if draw(st.booleans()) or k == 0:
        attrs[f"{D}/a"] = draw(st.integers(0, 2))
    multi = draw(st.booleans())
    memory = Fraction(draw(st.integers(1, 4)))
    cap = {f"{D}/memory": Capacity(memory, draw(policies) if multi else None)}
    consumes = {}
    if draw(st.booleans()):
        consumes = {"cs": {"c": Fraction(draw(st.integers(1, 2)))}}
    where = Placement(node_name=NODE) if draw(st.integers(0, 7)) else Placement(node_name="other")
    taints = (TAINT,) if draw(st.integers(0, 7)) == 0 else ()
    return Device(D, "p", f"dev{k}", where, attrs, cap, consumes, multi, taints)


@st.composite
def exact(draw: st.DrawFn, name: str) -> ExactRequest:
    sel = draw(st.sampled_from(SELECTORS))
    cap = {}
    if draw(st.booleans()):
        cap = {"memory": Fraction(draw(st.integers(1, 3)))}
    return ExactRequest(
        name,
        draw(st.sampled_from(sorted(CLASSES))),
        (compile_selector(sel, "sel"),) if sel else (),
        draw(st.sampled_from(["ExactCount"] * 4 + ["All"])),
        draw(st.sampled_from([1, 1, 2])),
        draw(st.integers(0, 6)) == 0,
        (TOLERATE,) if draw(st.booleans()) else (),
        cap,
    )


@st.composite
def claims(draw: st.DrawFn, c: int) -> ResourceClaim:
    requests = []
    for r in range(draw(st.integers(1, 2))):
        name = f"r{r}"
        if draw(st.booleans()):
            requests.append(Request(name, exactly=draw(exact(name))))
        else:
            requests.append(Request(name, first_available=(draw(exact("p")), draw(exact("q")))))
    constraints = []
    kind = draw(st.sampled_from(["", "match", "distinct"]))
    if kind:
        scope = draw(st.sampled_from([(), ("r0",)]))
        constraints.append(
            Constraint(
                scope, f"{D}/a" if kind == "match" else "", f"{D}/a" if kind == "distinct" else ""
            )
        )
    return ResourceClaim("ns", f"c{c}", f"u{c}", tuple(requests), tuple(constraints))


@st.composite
def worlds(draw: st.DrawFn) -> tuple[Inventory, list[ResourceClaim]]:
    devs = [draw(devices(k)) for k in range(draw(st.integers(1, 4)))]
    pool = Pool(D, "p", 1, tuple(devs), {"cs": {"c": Fraction(draw(st.integers(1, 4)))}})
    allocated = []
    for dev in devs:
        if draw(st.integers(0, 3)) == 0:
            consumed = (
                {f"{D}/memory": Fraction(draw(st.integers(1, 2)))} if dev.allow_multiple else {}
            )
            allocated.append(ClaimAllocation((Result("old", D, "p", dev.name, consumed=consumed),)))
    inv = Inventory([pool], CLASSES, allocated)
    assume(valid(inv, [], []))  # the existing allocations are consistent
    cs = [draw(claims(c)) for c in range(draw(st.integers(1, 2)))]
    if sum(len(c.requests) for c in cs) > 3:
        cs = cs[:1]
    return inv, cs


# ---------------------------------------------------------------- independent checker


def rounded(policy: RequestPolicy | None, amount: Fraction) -> Fraction | None:
    if policy is None:
        return amount
    if policy.valid_values:
        bigger = [v for v in policy.valid_values if v >= amount]
        return min(bigger) if bigger else None
    if policy.min is not None:
        v = max(amount, policy.min)
        step = policy.step or Fraction(1)
        while (v - policy.min) % step:
            v += Fraction(1, 2) if step.denominator == 2 else Fraction(1)
        return None if policy.max is not None and v > policy.max else v
    return amount


def consumed_by(dev: Device, req: ExactRequest) -> dict[str, Fraction] | None:
    out = {}
    for name, cap in dev.capacity.items():
        short = name.split("/", 1)[1]
        if short in req.capacity:
            got = rounded(cap.policy, req.capacity[short])
            if got is None:
                return None
            out[name] = got
        elif cap.policy is not None and cap.policy.default is not None:
            out[name] = cap.policy.default
        else:
            out[name] = cap.value
    return out


def tolerated(dev: Device, req: ExactRequest) -> bool:
    return not dev.taints or any(t.tolerates(x) for x in dev.taints for t in req.tolerations)


def matches(dev: Device, req: ExactRequest) -> bool:
    """Selectors and capacity (upstream's CmpRequestOverCapacity, for every device: requested
    capacities exist, the amounts consumed are valid for the policy and, on a whole device,
    within capacity)."""
    if dev.placement.node_name != NODE:
        return False
    sels = (*CLASSES[req.device_class].selectors, *req.selectors)
    if not all(s.matches(dev) for s in sels):
        return False
    if any(f"{D}/{short}" not in dev.capacity for short in req.capacity):
        return False
    got = consumed_by(dev, req)
    if got is None:
        return False
    return dev.allow_multiple or all(got[n] <= c.value for n, c in dev.capacity.items())


def eligible(dev: Device, req: ExactRequest) -> bool:
    return matches(dev, req) and tolerated(dev, req)


def existing(inv: Inventory) -> dict[str, list[dict[str, Fraction]]]:
    uses: dict[str, list[dict[str, Fraction]]] = {d.name: [] for p in inv.pools for d in p.devices}
    for alloc in inv.allocated:
        for r in alloc.results:
            uses[r.device].append(dict(r.consumed))
    return uses


def all_devices(inv: Inventory, req: ExactRequest) -> list[Device]:
    """What ``All`` takes: every matching device (taints not filtered: an untolerated one
    fails the request), less shared devices the existing allocations left too little."""
    uses = existing(inv)
    out = []
    for d in (d for p in inv.pools for d in p.devices):
        if not matches(d, req):
            continue
        if d.allow_multiple:
            got = consumed_by(d, req) or {}
            if any(
                sum((u.get(n, Fraction(0)) for u in uses[d.name]), Fraction(0)) + got[n] > c.value
                for n, c in d.capacity.items()
            ):
                continue
        out.append(d)
    return out


Assignment = list[list[tuple[str, ExactRequest, tuple[Device, ...]]]]  # per claim, per request


def valid(inv: Inventory, cs: Sequence[ResourceClaim], assignment: Assignment) -> bool:
    """Upstream's rules, re-derived pick by pick in search order (claims, requests, devices):
    a device allocated whole (existing or new, admin access included) is not picked again,
    except by admin access, which only avoids its own claim's whole devices; every new pick
    consumes counters (a shared device already shared excepted) and, on a shared device,
    capacity; an existing allocation consumes its device's counters once."""
    devs = [d for p in inv.pools for d in p.devices]
    by_name = {d.name: d for d in devs}
    uses = existing(inv)
    whole = {n for n, u in uses.items() if u and not by_name[n].allow_multiple}
    if any(len(u) > 1 for n, u in uses.items() if not by_name[n].allow_multiple):
        return False
    counters = sum(
        (by_name[n].consumes.get("cs", {}).get("c", Fraction(0)) for n, u in uses.items() if u),
        Fraction(0),
    )
    for claim, reqs in zip(cs, assignment, strict=True):
        mine: set[str] = set()  # the claim's whole devices
        shared_seen: set[tuple[str, str]] = set()
        for rname, req, chosen in reqs:
            if req.mode == "All":
                want = all_devices(inv, req)
                if not want or sorted(d.name for d in chosen) != sorted(d.name for d in want):
                    return False
                if not all(tolerated(d, req) for d in want):
                    return False
            elif len({d.name for d in chosen}) != req.count or len(chosen) != req.count:
                return False
            for dev in chosen:
                if req.mode != "All" and not eligible(dev, req):
                    return False
                if dev.allow_multiple:
                    if (dev.name, rname) in shared_seen:
                        return False
                    shared_seen.add((dev.name, rname))
                    if not uses[dev.name]:
                        counters += dev.consumes.get("cs", {}).get("c", Fraction(0))
                    uses[dev.name].append(consumed_by(dev, req) or {})
                    continue
                if req.admin_access:
                    if dev.name in mine:
                        return False
                elif dev.name in whole:
                    return False
                whole.add(dev.name)
                mine.add(dev.name)
                counters += dev.consumes.get("cs", {}).get("c", Fraction(0))
        for con in claim.constraints:
            attr = con.match_attribute or con.distinct_attribute
            values = []
            for rname, _, chosen in reqs:
                if con.covers(rname):
                    values += [d.attributes.get(attr) for d in chosen]
            if any(v is None for v in values):
                return False
            if con.match_attribute and len(set(values)) > 1:
                return False
            if con.distinct_attribute and len(set(values)) != len(values):
                return False
    for name, u in uses.items():
        dev = by_name[name]
        if dev.allow_multiple:
            for cname, cap in dev.capacity.items():
                if sum((x.get(cname, Fraction(0)) for x in u), Fraction(0)) > cap.value:
                    return False
    return counters <= inv.pools[0].counters["cs"]["c"]


def assignments(inv: Inventory, cs: Sequence[ResourceClaim]):  # type: ignore[no-untyped-def]
    devs = [d for p in inv.pools for d in p.devices]
    slots = []
    for claim in cs:
        for request in claim.requests:
            options = []
            for a, (rname, req) in enumerate(request.alternatives()):
                if req.mode == "All":
                    combos = [tuple(all_devices(inv, req))]
                else:
                    combos = list(itertools.combinations(devs, req.count))
                options += [(a, rname, req, combo) for combo in combos]
            slots.append(options)
    for pick in itertools.product(*slots):
        out: Assignment = []
        k = 0
        for claim in cs:
            out.append(
                [(rname, req, combo) for _, rname, req, combo in pick[k : k + len(claim.requests)]]
            )
            k += len(claim.requests)
        yield tuple(p[0] for p in pick), out


def from_outcome(inv: Inventory, cs: Sequence[ResourceClaim], outcome) -> Assignment:  # type: ignore[no-untyped-def]
    by_name = {d.name: d for p in inv.pools for d in p.devices}
    out: Assignment = []
    for claim in cs:
        results = outcome.allocations[claim.key].results
        reqs = []
        for request in claim.requests:
            for rname, req in request.alternatives():
                chosen = tuple(by_name[r.device] for r in results if r.request == rname)
                if chosen:
                    reqs.append((rname, req, chosen))
        out.append(reqs)
    return out


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(worlds(), st.booleans())
def test_allocator_agrees_with_the_brute_force_oracle(world, first_fit: bool) -> None:  # type: ignore[no-untyped-def]
    inv, cs = world
    policy = FirstFit() if first_fit else KallotPolicy()
    out = allocate(cs, NODE, {}, inv, policy=policy, budget=Budget(steps=10**6, solutions=10**6))
    valid_alts = [alts for alts, a in assignments(inv, cs) if valid(inv, cs, a)]
    event("allocatable" if valid_alts else "not allocatable")
    if not valid_alts:
        assert not out.ok, "the allocator found an allocation the oracle rejects"
        return
    assert out.ok, f"the oracle finds {len(valid_alts)} allocations, the allocator: {out.reason}"
    got = from_outcome(inv, cs, out)
    assert valid(inv, cs, got)
    # firstAvailable: the lowest alternatives that can be satisfied win
    assert out.chosen is not None and out.chosen.alternatives == min(valid_alts)
    for claim in cs:
        for r in out.allocations[claim.key].results:
            dev = next(d for p in inv.pools for d in p.devices if d.name == r.device)
            if dev.allow_multiple:  # admin access too: a share, as upstream
                req = next(
                    q for rq in claim.requests for n, q in rq.alternatives() if n == r.request
                )
                assert r.consumed == consumed_by(dev, req) and r.share_id
