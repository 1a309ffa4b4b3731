"""The DRA model of the core: devices, pools, classes, claims and existing allocations.

Where it sits: the typed, pure image of ``resource.k8s.io/v1`` objects that the DRA allocator
(``core.dra.allocator``) works on. ``kallot.config.dra`` parses the API's JSON into these types
(and compiles CEL selectors through ``kallot.config.dra_cel``); nothing here does I/O or knows
JSON. Names follow the API: a device is ``(driver, pool, name)``; attribute and capacity names
are fully qualified (``gpu.nvidia.com/type``, ``resource.kubernetes.io/pcieRoot``: a short name in
a slice belongs to the driver's domain); quantities are exact ``Fraction`` s of the base unit
(``80Gi`` -> 85899345920, ``500m`` -> 1/2). The allocator's search keeps amounts as ``Amount``
(an ``int`` when whole: the same numbers in cheaper arithmetic).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Literal, Protocol

from kallot.core.errors import ConfigError

AttrKind = Literal["int", "bool", "string", "version"]
AllocationMode = Literal["ExactCount", "All"]
TaintEffect = Literal["NoSchedule", "NoExecute", "None"]

_SUFFIX: dict[str, Fraction] = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    "Ki": Fraction(2**10),
    "Mi": Fraction(2**20),
    "Gi": Fraction(2**30),
    "Ti": Fraction(2**40),
    "Pi": Fraction(2**50),
    "Ei": Fraction(2**60),
}
_QUANTITY = re.compile(
    r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?)$"
)
_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)


# An exact amount as the search keeps it: an ``int`` when whole (capacities in bytes, counters),
# else the ``Fraction``. Same values, same comparisons; int arithmetic is many times cheaper
# than Fraction's, and the search adds and compares amounts at every step.
Amount = Fraction | int


def exact(value: Fraction | int) -> Amount:
    """``value`` as an ``int`` when it is whole (the same number)."""
    if isinstance(value, int):
        return value
    return value.numerator if value.denominator == 1 else value


def parse_quantity(text: str, field_name: str = "quantity") -> Fraction:
    """A Kubernetes quantity (``80Gi``, ``1.5``, ``500m``, ``1e3``) as an exact number."""
    got = _quantity(text) if isinstance(text, str) else None
    if got is None:
        raise ConfigError(field_name, text, "a Kubernetes quantity such as 80Gi, 100 or 500m")
    return got


@functools.lru_cache(maxsize=4096)
def _quantity(text: str) -> Fraction | None:
    # Cached: a cluster's slices repeat a few quantities thousands of times.
    m = _QUANTITY.match(text.strip())
    if m is None:
        return None
    number = Fraction(m.group(1))
    if m.group(2):
        return number * Fraction(10) ** int(m.group(2)[1:])
    return number * _SUFFIX[m.group(3) or ""]


@dataclass(frozen=True, slots=True, order=False)
class Version:
    """A semantic version (``570.124.6``): ordered by semver precedence, build metadata ignored."""

    major: int
    minor: int
    patch: int
    pre: tuple[int | str, ...] = ()

    @staticmethod
    def parse(text: str, field_name: str = "version") -> Version:
        m = _SEMVER.match(text) if isinstance(text, str) else None
        if m is None:
            raise ConfigError(field_name, text, "a semantic version such as 1.2.3")
        pre: tuple[int | str, ...] = ()
        if m.group(4):
            pre = tuple(int(p) if p.isdigit() else p for p in m.group(4).split("."))
        return Version(int(m.group(1)), int(m.group(2)), int(m.group(3)), pre)

    def key(self) -> tuple[int, int, int, int, tuple[tuple[int, int | str], ...]]:
        # A release sorts after its pre-releases; numeric identifiers before alphanumeric ones.
        pre = tuple((0, p) if isinstance(p, int) else (1, p) for p in self.pre)
        return (self.major, self.minor, self.patch, 0 if self.pre else 1, pre)

    def compare(self, other: Version) -> int:
        a, b = self.key(), other.key()
        return (a > b) - (a < b)

    def __str__(self) -> str:
        tail = "-" + ".".join(str(p) for p in self.pre) if self.pre else ""
        return f"{self.major}.{self.minor}.{self.patch}{tail}"


Scalar = int | bool | str | Version
# A list-type attribute (``ints``, ``bools``, ``strings``, ``versions``; DRAListTypeAttributes)
# is a tuple of one kind's values.
AttrValue = Scalar | tuple[Scalar, ...]


def value_set(value: AttrValue) -> frozenset[tuple[str, Scalar]]:
    """An attribute's values as a set tagged by kind (a scalar is a one-element set; ``True``
    and ``1`` stay apart): what matchAttribute intersects and distinctAttribute keeps
    disjoint for list-type attributes."""
    items = value if isinstance(value, tuple) else (value,)
    return frozenset((type(v).__name__, v) for v in items)


def qualify(name: str, driver: str) -> str:
    """An attribute or capacity name with its domain (a short name is in the driver's)."""
    return name if "/" in name else f"{driver}/{name}"


@dataclass(frozen=True, slots=True)
class RequestPolicy:
    """How a request's amount of a consumable capacity is rounded (``requestPolicy``)."""

    default: Fraction | None = None
    valid_values: tuple[Fraction, ...] = ()  # sorted
    min: Fraction | None = None  # validRange
    max: Fraction | None = None
    step: Fraction | None = None

    def rounds(self, amount: Fraction) -> Fraction | None:
        """The amount actually consumed for a request of ``amount``; None when none is valid."""
        if self.valid_values:
            return next((v for v in self.valid_values if v >= amount), None)
        if self.min is not None:
            # Whole amounts in int arithmetic (the same numbers, cheaper than Fraction's).
            low, got = exact(self.min), exact(amount)
            value = max(got, low)
            if self.step:
                step = exact(self.step)
                steps = -(-(value - low) // step)
                value = low + steps * step
            if self.max is not None and value > self.max:
                return None
            return Fraction(value)
        return amount


@dataclass(frozen=True, slots=True)
class Capacity:
    value: Fraction
    policy: RequestPolicy | None = None


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str = ""
    effect: TaintEffect = "NoSchedule"


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str = ""  # empty with Exists: every key
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str = ""
    effect: str = ""  # empty: every effect

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator == "Exists":
            return True
        return self.value == taint.value


@dataclass(frozen=True, slots=True)
class NodeSelectorRequirement:
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    values: tuple[str, ...] = ()
    field: bool = False  # a matchFields requirement (key metadata.name)

    def matches(self, node: str, labels: Mapping[str, str]) -> bool:
        have = node if self.field else labels.get(self.key)
        op = self.operator
        if op == "Exists":
            return have is not None
        if op == "DoesNotExist":
            return have is None
        if op == "In":
            return have is not None and have in self.values
        if op == "NotIn":
            return have is None or have not in self.values
        try:
            number, bound = int(have or ""), int(self.values[0])
        except (ValueError, IndexError):
            return False
        return number > bound if op == "Gt" else number < bound


@dataclass(frozen=True, slots=True)
class NodeSelector:
    """A ``v1.NodeSelector``: the terms are ORed, a term's requirements ANDed."""

    terms: tuple[tuple[NodeSelectorRequirement, ...], ...]

    def matches(self, node: str, labels: Mapping[str, str]) -> bool:
        return any(all(r.matches(node, labels) for r in term) for term in self.terms)


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a slice's (or a device's) devices can be used: exactly one of these is set."""

    node_name: str = ""
    node_selector: NodeSelector | None = None
    all_nodes: bool = False

    def reaches(self, node: str, labels: Mapping[str, str]) -> bool:
        if self.all_nodes:
            return True
        if self.node_selector is not None:
            return self.node_selector.matches(node, labels)
        return self.node_name == node


DeviceId = tuple[str, str, str]  # (driver, pool, device name)


@dataclass(frozen=True, slots=True)
class Device:
    driver: str
    pool: str
    name: str
    placement: Placement
    attributes: Mapping[str, AttrValue] = field(default_factory=dict)  # qualified names
    capacity: Mapping[str, Capacity] = field(default_factory=dict)  # qualified names
    consumes: Mapping[str, Mapping[str, Fraction]] = field(default_factory=dict)  # set -> counters
    allow_multiple: bool = False
    taints: tuple[Taint, ...] = ()
    # Placed per device (a slice with ``perDeviceNodeSelection``): upstream evaluates the
    # selectors before the device's node, so a selector failing here counts on every node.
    per_device: bool = False
    # KEP-5007: conditions the device needs before the pod binds (upstream tries pools with
    # such devices after the others and records both lists in the allocation result).
    binding_conditions: tuple[str, ...] = ()
    binding_failure_conditions: tuple[str, ...] = ()
    # (driver, pool, name), built once: the search looks devices up by it at every step (a
    # slot, not a property: a property call costs as much as the lookup it feeds).
    id: DeviceId = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "id", (self.driver, self.pool, self.name))


@dataclass(frozen=True, slots=True)
class Pool:
    """One complete pool at its newest generation: its devices and counter sets."""

    driver: str
    name: str
    generation: int
    devices: tuple[Device, ...]
    counters: Mapping[str, Mapping[str, Fraction]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Slice:
    """A ResourceSlice as the core needs it (``assemble_pools`` groups them into pools)."""

    name: str
    driver: str
    pool: str
    generation: int
    slice_count: int
    devices: tuple[Device, ...] = ()
    counters: Mapping[str, Mapping[str, Fraction]] = field(default_factory=dict)


def assemble_pools(slices: list[Slice]) -> tuple[list[Pool], list[str]]:
    """Pools from slices, as kube-scheduler reads them: only slices of a pool's newest
    generation count, and a pool is used only once all ``resourceSliceCount`` of them are
    there. Returns the pools and one line per pool left out (for explain)."""
    groups: dict[tuple[str, str], list[Slice]] = {}
    for s in slices:
        groups.setdefault((s.driver, s.pool), []).append(s)
    pools: list[Pool] = []
    skipped: list[str] = []
    for (driver, name), group in sorted(groups.items()):
        newest = max(s.generation for s in group)
        current = [s for s in group if s.generation == newest]
        want = max(s.slice_count for s in current)
        if len(current) < want:
            skipped.append(
                f"pool {driver}/{name}: {len(current)} of {want} slices at generation {newest}"
            )
            continue
        devices = tuple(d for s in sorted(current, key=lambda s: s.name) for d in s.devices)
        counters: dict[str, Mapping[str, Fraction]] = {}
        for s in current:
            counters.update(s.counters)
        pools.append(Pool(driver, name, newest, devices, counters))
    return pools, skipped


def incomplete_pools(slices: list[Slice]) -> tuple[Pool, ...]:
    """The pools ``assemble_pools`` leaves out for missing slices, with the devices and counter
    sets of the slices there are: an ``allocationMode: All`` request on a node such a pool
    reaches cannot be allocated (upstream: "resource pool ... is currently being updated")."""
    groups: dict[tuple[str, str], list[Slice]] = {}
    for s in slices:
        groups.setdefault((s.driver, s.pool), []).append(s)
    out = []
    for (driver, name), group in sorted(groups.items()):
        newest = max(s.generation for s in group)
        current = [s for s in group if s.generation == newest]
        if len(current) < max(s.slice_count for s in current):
            devices = tuple(d for s in sorted(current, key=lambda s: s.name) for d in s.devices)
            counters = {k: v for s in current for k, v in s.counters.items()}
            out.append(Pool(driver, name, newest, devices, counters))
    return tuple(out)


class Selector(Protocol):
    """A compiled CEL selector (``kallot.config.dra_cel``): the core only calls it."""

    @property
    def expression(self) -> str: ...

    def matches(self, device: Device) -> bool:
        """Whether the device is selected; raises ``SelectorError`` on a runtime error."""
        ...


class SelectorError(Exception):
    """A selector failed on a device (runtime error): the claim cannot be allocated."""


@dataclass(frozen=True, slots=True)
class Config:
    """An opaque configuration for a driver, for some requests (none listed: all)."""

    driver: str
    parameters: Mapping[str, object]
    requests: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class DeviceClass:
    name: str
    selectors: tuple[Selector, ...] = ()
    config: tuple[Config, ...] = ()
    extended_resource_name: str = ""
    created: str = ""  # metadata.creationTimestamp (RFC 3339, sorts as text)


@dataclass(frozen=True, slots=True)
class ExactRequest:
    """``exactly`` of a request, or one ``firstAvailable`` subrequest (``name`` is its own)."""

    name: str
    device_class: str
    selectors: tuple[Selector, ...] = ()
    mode: AllocationMode = "ExactCount"
    count: int = 1
    admin_access: bool = False
    tolerations: tuple[Toleration, ...] = ()
    capacity: Mapping[str, Fraction] = field(default_factory=dict)  # qualified? see note
    # Capacity request names are matched against a device's capacity names qualified with the
    # device's driver (a short name is in the driver's domain, as in slices).


@dataclass(frozen=True, slots=True)
class Request:
    """A claim's request: ``exactly`` xor ``first_available`` (tried in order)."""

    name: str
    exactly: ExactRequest | None = None
    first_available: tuple[ExactRequest, ...] = ()

    def alternatives(self) -> tuple[tuple[str, ExactRequest], ...]:
        """(result request name, request) per alternative: ``req`` or ``req/sub``."""
        if self.exactly is not None:
            return ((self.name, self.exactly),)
        return tuple((f"{self.name}/{s.name}", s) for s in self.first_available)


@dataclass(frozen=True, slots=True)
class Constraint:
    """``matchAttribute`` xor ``distinctAttribute`` over the listed requests (none: all)."""

    requests: tuple[str, ...] = ()
    match_attribute: str = ""
    distinct_attribute: str = ""

    def covers(self, result_request: str) -> bool:
        if not self.requests:
            return True
        parent = result_request.split("/", 1)[0]
        return result_request in self.requests or parent in self.requests


@dataclass(frozen=True, slots=True)
class Result:
    """One allocated device of a claim (``status.allocation.devices.results[]``)."""

    request: str  # "req" or "req/sub"
    driver: str
    pool: str
    device: str
    admin_access: bool = False
    share_id: str = ""
    consumed: Mapping[str, Fraction] = field(default_factory=dict)  # qualified capacity names
    tolerations: tuple[Toleration, ...] = ()
    binding_conditions: tuple[str, ...] = ()  # the device's, as upstream records them
    binding_failure_conditions: tuple[str, ...] = ()

    @property
    def device_id(self) -> DeviceId:
        return (self.driver, self.pool, self.device)


@dataclass(frozen=True, slots=True)
class ClaimAllocation:
    results: tuple[Result, ...]
    config: tuple[tuple[Literal["FromClass", "FromClaim"], Config], ...] = ()
    node_selector: NodeSelector | None = None


@dataclass(frozen=True, slots=True)
class ResourceClaim:
    namespace: str
    name: str
    uid: str = ""
    requests: tuple[Request, ...] = ()
    constraints: tuple[Constraint, ...] = ()
    config: tuple[Config, ...] = ()
    allocation: ClaimAllocation | None = None
    reserved_for: tuple[str, ...] = ()  # pod UIDs

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"
