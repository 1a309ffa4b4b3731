"""Translation between ``resource.k8s.io/v1`` JSON and the core's DRA model.

Where it sits: the edge of DRA allocation. ``slice_from_json``, ``device_class_from_json`` and
``claim_from_json`` turn API objects (dicts as the Kubernetes client returns them with
``to_dict`` camelCase keys, or as kubectl prints them) into ``kallot.core.dra.model`` types,
compiling CEL selectors once (``config.dra_cel``); ``allocation_status`` writes a claim's
``status.allocation`` for the bind step. Bad input raises ``ConfigError`` with one line naming
the object, the field, the value and what was expected; a selector that does not compile names
the claim (or class), the request and the expression.

Long module: reading and writing the DRA objects is one vocabulary (the same field names, the
same one-line errors, the CEL compile cache) for slices, classes, claims and the allocation the
binder writes back; split by object, each part would import the others' helpers.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from fractions import Fraction
from typing import Any, Literal, cast

from kallot.config.dra_cel import compile_selector
from kallot.core.dra.model import (
    AttrValue,
    Capacity,
    ClaimAllocation,
    Config,
    Constraint,
    Device,
    DeviceClass,
    ExactRequest,
    NodeSelector,
    NodeSelectorRequirement,
    Placement,
    Request,
    RequestPolicy,
    ResourceClaim,
    Result,
    Selector,
    Slice,
    Taint,
    Toleration,
    Version,
    parse_quantity,
    qualify,
)
from kallot.core.errors import ConfigError

Json = Mapping[str, Any]


def _map(obj: object, field: str) -> Json:
    if obj is None:
        return {}
    if not isinstance(obj, Mapping):
        raise ConfigError(field, obj, "an object")
    return obj


def _list(obj: object, field: str) -> list[Any]:
    if obj is None:
        return []
    if not isinstance(obj, list):
        raise ConfigError(field, obj, "a list")
    return obj


def _str(obj: object, field: str, *, required: bool = True) -> str:
    if obj is None and not required:
        return ""
    if not isinstance(obj, str) or (required and not obj):
        raise ConfigError(field, obj, "a non-empty string")
    return obj


def _int(obj: object, field: str, default: int | None = None) -> int:
    if obj is None and default is not None:
        return default
    if isinstance(obj, bool) or not isinstance(obj, int):
        raise ConfigError(field, obj, "an integer")
    return obj


def _qty(obj: object, field: str) -> Fraction:
    if isinstance(obj, int | float) and not isinstance(obj, bool):
        return Fraction(str(obj))
    return parse_quantity(cast(str, obj), field)


def _node_selector(obj: object, field: str) -> NodeSelector | None:
    if obj is None:
        return None
    terms = []
    for t, term in enumerate(
        _list(_map(obj, field).get("nodeSelectorTerms"), f"{field}.nodeSelectorTerms")
    ):
        tf = f"{field}.nodeSelectorTerms[{t}]"
        reqs = []
        for kind, is_field in (("matchExpressions", False), ("matchFields", True)):
            for i, raw_r in enumerate(_list(_map(term, tf).get(kind), f"{tf}.{kind}")):
                rf = f"{tf}.{kind}[{i}]"
                r = _map(raw_r, rf)
                op = r.get("operator")
                if op not in ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"):
                    raise ConfigError(
                        f"{rf}.operator", op, "In, NotIn, Exists, DoesNotExist, Gt or Lt"
                    )
                values = tuple(
                    _str(v, f"{rf}.values") for v in _list(r.get("values"), f"{rf}.values")
                )
                reqs.append(
                    NodeSelectorRequirement(_str(r.get("key"), f"{rf}.key"), op, values, is_field)
                )
        terms.append(tuple(reqs))
    return NodeSelector(tuple(terms))


def _placement(spec: Json, field: str) -> Placement | None:
    node = spec.get("nodeName")
    sel = _node_selector(spec.get("nodeSelector"), f"{field}.nodeSelector")
    every = spec.get("allNodes") is True
    if sum((bool(node), sel is not None, every)) > 1:
        raise ConfigError(field, "several", "one of nodeName, nodeSelector, allNodes")
    if not (node or sel is not None or every):
        return None
    return Placement(_str(node, f"{field}.nodeName", required=False), sel, every)


_MISS = object()


@functools.lru_cache(maxsize=4096)
def _version(text: str) -> Version | None:
    # Cached: slices repeat a few driver and CUDA versions on every device.
    try:
        return Version.parse(text)
    except ConfigError:
        return None


def _plain_attribute(obj: object) -> Any:
    """The common attribute shapes (one well-typed scalar) without building field names;
    ``_MISS`` for anything else (``_attribute`` then checks it and words the error)."""
    if type(obj) is not dict or len(obj) != 1:
        return _MISS
    ((kind, value),) = obj.items()
    t = type(value)
    if (kind == "string" and t is str) or (kind == "int" and t is int):
        return value
    if kind == "bool" and t is bool:
        return value
    if kind == "version" and t is str:
        got = _version(value)
        return _MISS if got is None else got
    return _MISS


def _attribute(obj: object, field: str) -> AttrValue:
    a = _map(obj, field)
    kinds = ("int", "bool", "string", "version", "ints", "bools", "strings", "versions")
    if len(a) != 1 or next(iter(a)) not in kinds:
        raise ConfigError(field, dict(a), f"exactly one of {', '.join(kinds)}")
    kind, value = next(iter(a.items()))
    if kind.endswith("s"):
        items = _list(value, f"{field}.{kind}")
        if not items:
            raise ConfigError(f"{field}.{kind}", value, "a non-empty list")
        out: list[Any] = []
        for i, v in enumerate(items):
            got = _attribute({kind[:-1]: v}, f"{field}.{kind}[{i}]")
            assert not isinstance(got, tuple)
            out.append(got)
        return tuple(out)
    if kind == "int":
        return _int(value, f"{field}.int")
    if kind == "bool":
        if not isinstance(value, bool):
            raise ConfigError(f"{field}.bool", value, "true or false")
        return value
    if kind == "version":
        return Version.parse(_str(value, f"{field}.version"), f"{field}.version")
    return _str(value, f"{field}.string", required=False)


def _policy(obj: object, field: str) -> RequestPolicy | None:
    if obj is None:
        return None
    p = _map(obj, field)
    default = _qty(p["default"], f"{field}.default") if p.get("default") is not None else None
    values = tuple(
        sorted(
            _qty(v, f"{field}.validValues[{i}]")
            for i, v in enumerate(_list(p.get("validValues"), f"{field}.validValues"))
        )
    )
    rng = _map(p.get("validRange"), f"{field}.validRange")

    def q(key: str) -> Fraction | None:
        return _qty(rng[key], f"{field}.validRange.{key}") if rng.get(key) is not None else None

    if rng and q("min") is None:
        raise ConfigError(f"{field}.validRange.min", None, "a quantity")
    return RequestPolicy(default, values, q("min"), q("max"), q("step"))


def _taint(obj: object, field: str) -> Taint:
    t = _map(obj, field)
    effect = t.get("effect")
    if effect not in ("NoSchedule", "NoExecute", "None"):
        raise ConfigError(f"{field}.effect", effect, "NoSchedule, NoExecute or None")
    return Taint(
        _str(t.get("key"), f"{field}.key"),
        _str(t.get("value"), f"{field}.value", required=False),
        effect,
    )


def _counters(obj: object, field: str) -> dict[str, Fraction]:
    return {
        _str(name, field): _qty(_map(c, f"{field}.{name}").get("value"), f"{field}.{name}.value")
        for name, c in _map(obj, field).items()
    }


def _device(obj: object, field: str, driver: str, pool: str, placement: Placement | None) -> Device:
    d = _map(obj, field)
    name = _str(d.get("name"), f"{field}.name")
    own = _placement(d, field)
    where = own or placement
    if where is None:
        raise ConfigError(f"{field}.nodeName", None, "a node placement (perDeviceNodeSelection)")
    attrs: dict[str, AttrValue] = {}
    for k, v in _map(d.get("attributes"), f"{field}.attributes").items():
        got = _plain_attribute(v)
        if got is _MISS:
            got = _attribute(v, f"{field}.attributes.{k}")
        attrs[qualify(_str(k, f"{field}.attributes"), driver)] = got
    caps = {}
    for k, v in _map(d.get("capacity"), f"{field}.capacity").items():
        cf = f"{field}.capacity.{k}"
        c = _map(v, cf)
        caps[qualify(k, driver)] = Capacity(
            _qty(c.get("value"), f"{cf}.value"),
            _policy(c.get("requestPolicy"), f"{cf}.requestPolicy"),
        )
    consumes = {}
    for i, raw_c in enumerate(_list(d.get("consumesCounters"), f"{field}.consumesCounters")):
        cf = f"{field}.consumesCounters[{i}]"
        c = _map(raw_c, cf)
        consumes[_str(c.get("counterSet"), f"{cf}.counterSet")] = _counters(
            c.get("counters"), f"{cf}.counters"
        )
    taints = tuple(
        _taint(t, f"{field}.taints[{i}]")
        for i, t in enumerate(_list(d.get("taints"), f"{field}.taints"))
    )
    return Device(
        driver,
        pool,
        name,
        where,
        attrs,
        caps,
        consumes,
        d.get("allowMultipleAllocations") is True,
        taints,
        placement is None,
        _names(d.get("bindingConditions"), f"{field}.bindingConditions"),
        _names(d.get("bindingFailureConditions"), f"{field}.bindingFailureConditions"),
    )


def _names(obj: object, field: str) -> tuple[str, ...]:
    return tuple(_str(x, f"{field}[{i}]") for i, x in enumerate(_list(obj, field)))


def slice_from_json(obj: Json) -> Slice:
    """A ResourceSlice; ``core.dra.model.assemble_pools`` makes pools of them."""
    meta = _map(obj.get("metadata"), "metadata")
    where = f"ResourceSlice {meta.get('name', '?')}: spec"
    spec = _map(obj.get("spec"), where)
    driver = _str(spec.get("driver"), f"{where}.driver")
    pool = _map(spec.get("pool"), f"{where}.pool")
    pool_name = _str(pool.get("name"), f"{where}.pool.name")
    per_device = spec.get("perDeviceNodeSelection") is True
    placement = None if per_device else _placement(spec, where)
    if placement is None and not per_device and not spec.get("sharedCounters"):
        raise ConfigError(
            f"{where}.nodeName",
            None,
            "one of nodeName, nodeSelector, allNodes, perDeviceNodeSelection",
        )
    devices = tuple(
        _device(d, f"{where}.devices[{i}]", driver, pool_name, placement)
        for i, d in enumerate(_list(spec.get("devices"), f"{where}.devices"))
    )
    counters = {}
    for i, raw_s in enumerate(_list(spec.get("sharedCounters"), f"{where}.sharedCounters")):
        sf = f"{where}.sharedCounters[{i}]"
        s = _map(raw_s, sf)
        counters[_str(s.get("name"), f"{sf}.name")] = _counters(s.get("counters"), f"{sf}.counters")
    return Slice(
        _str(meta.get("name"), "ResourceSlice metadata.name"),
        driver,
        pool_name,
        _int(pool.get("generation"), f"{where}.pool.generation", 0),
        _int(pool.get("resourceSliceCount"), f"{where}.pool.resourceSliceCount", 1),
        devices,
        counters,
    )


def _selectors(obj: object, field: str) -> tuple[Selector, ...]:
    out: list[Selector] = []
    for i, s in enumerate(_list(obj, field)):
        sf = f"{field}[{i}].cel.expression"
        expr = _str(
            _map(_map(s, f"{field}[{i}]").get("cel"), f"{field}[{i}].cel").get("expression"), sf
        )
        out.append(compile_selector(expr, sf))
    return tuple(out)


def _config(obj: object, field: str) -> tuple[Config, ...]:
    out = []
    for i, raw_c in enumerate(_list(obj, field)):
        cf = f"{field}[{i}]"
        c = _map(raw_c, cf)
        opaque = _map(c.get("opaque"), f"{cf}.opaque")
        requests = tuple(
            _str(r, f"{cf}.requests") for r in _list(c.get("requests"), f"{cf}.requests")
        )
        out.append(
            Config(
                _str(opaque.get("driver"), f"{cf}.opaque.driver"),
                _map(opaque.get("parameters"), f"{cf}.opaque.parameters"),
                requests,
            )
        )
    return tuple(out)


def device_class_from_json(obj: Json) -> DeviceClass:
    meta = _map(obj.get("metadata"), "metadata")
    name = _str(meta.get("name"), "DeviceClass metadata.name")
    where = f"DeviceClass {name}: spec"
    spec = _map(obj.get("spec"), where)
    return DeviceClass(
        name,
        _selectors(spec.get("selectors"), f"{where}.selectors"),
        _config(spec.get("config"), f"{where}.config"),
        _str(spec.get("extendedResourceName"), f"{where}.extendedResourceName", required=False),
        str(meta.get("creationTimestamp") or ""),
    )


def _toleration(obj: object, field: str) -> Toleration:
    t = _map(obj, field)
    op = t.get("operator") or "Equal"
    if op not in {"Exists", "Equal"}:
        raise ConfigError(f"{field}.operator", op, "Exists or Equal")
    return Toleration(
        _str(t.get("key"), f"{field}.key", required=False),
        cast(Literal["Exists", "Equal"], op),
        _str(t.get("value"), f"{field}.value", required=False),
        _str(t.get("effect"), f"{field}.effect", required=False),
    )


def _exact(obj: object, field: str, name: str) -> ExactRequest:
    e = _map(obj, field)
    mode = e.get("allocationMode") or "ExactCount"
    if mode not in ("ExactCount", "All"):
        raise ConfigError(f"{field}.allocationMode", mode, "ExactCount or All")
    count = _int(e.get("count"), f"{field}.count", 1)
    if count < 1:
        raise ConfigError(f"{field}.count", count, "at least 1")
    cap = _map(
        _map(e.get("capacity"), f"{field}.capacity").get("requests"), f"{field}.capacity.requests"
    )
    return ExactRequest(
        name,
        _str(e.get("deviceClassName"), f"{field}.deviceClassName"),
        _selectors(e.get("selectors"), f"{field}.selectors"),
        cast(Literal["ExactCount", "All"], mode),
        count,
        e.get("adminAccess") is True,
        tuple(
            _toleration(t, f"{field}.tolerations[{i}]")
            for i, t in enumerate(_list(e.get("tolerations"), f"{field}.tolerations"))
        ),
        {k: _qty(v, f"{field}.capacity.requests.{k}") for k, v in cap.items()},
    )


def _result(obj: object, field: str) -> Result:
    r = _map(obj, field)
    consumed = _map(r.get("consumedCapacity"), f"{field}.consumedCapacity")
    return Result(
        _str(r.get("request"), f"{field}.request"),
        _str(r.get("driver"), f"{field}.driver"),
        _str(r.get("pool"), f"{field}.pool"),
        _str(r.get("device"), f"{field}.device"),
        r.get("adminAccess") is True,
        _str(r.get("shareID"), f"{field}.shareID", required=False),
        {
            qualify(k, _str(r.get("driver"), f"{field}.driver")): _qty(
                v, f"{field}.consumedCapacity.{k}"
            )
            for k, v in consumed.items()
        },
        (),
        _names(r.get("bindingConditions"), f"{field}.bindingConditions"),
        _names(r.get("bindingFailureConditions"), f"{field}.bindingFailureConditions"),
    )


def allocation_from_json(obj: object, field: str) -> ClaimAllocation:
    a = _map(obj, field)
    devices = _map(a.get("devices"), f"{field}.devices")
    results = tuple(
        _result(r, f"{field}.devices.results[{i}]")
        for i, r in enumerate(_list(devices.get("results"), f"{field}.devices.results"))
    )
    return ClaimAllocation(
        results, (), _node_selector(a.get("nodeSelector"), f"{field}.nodeSelector")
    )


def claim_from_json(obj: Json) -> ResourceClaim:
    """A ResourceClaim with its allocation and reservations, if any."""
    meta = _map(obj.get("metadata"), "metadata")
    ns = _str(meta.get("namespace") or "default", "ResourceClaim metadata.namespace")
    name = _str(meta.get("name"), "ResourceClaim metadata.name")
    where = f"claim {ns}/{name}: spec.devices"
    devices = _map(_map(obj.get("spec"), f"claim {ns}/{name}: spec").get("devices"), where)
    requests = []
    for i, raw_r in enumerate(_list(devices.get("requests"), f"{where}.requests")):
        rf = f"{where}.requests[{i}]"
        r = _map(raw_r, rf)
        rname = _str(r.get("name"), f"{rf}.name")
        rf = f"claim {ns}/{name}, request {rname}: spec.devices.requests[{i}]"
        if (r.get("exactly") is None) == (not r.get("firstAvailable")):
            raise ConfigError(rf, dict(r), "exactly one of exactly, firstAvailable")
        if r.get("exactly") is not None:
            requests.append(Request(rname, exactly=_exact(r["exactly"], f"{rf}.exactly", rname)))
        else:
            subs = []
            for j, s in enumerate(_list(r.get("firstAvailable"), f"{rf}.firstAvailable")):
                sf = f"{rf}.firstAvailable[{j}]"
                subs.append(_exact(s, sf, _str(_map(s, sf).get("name"), f"{sf}.name")))
            requests.append(Request(rname, first_available=tuple(subs)))
    constraints = []
    for i, raw_c in enumerate(_list(devices.get("constraints"), f"{where}.constraints")):
        cf = f"{where}.constraints[{i}]"
        c = _map(raw_c, cf)
        match = _str(c.get("matchAttribute"), f"{cf}.matchAttribute", required=False)
        distinct = _str(c.get("distinctAttribute"), f"{cf}.distinctAttribute", required=False)
        if bool(match) == bool(distinct):
            raise ConfigError(cf, dict(c), "exactly one of matchAttribute, distinctAttribute")
        for attr, key in ((match, "matchAttribute"), (distinct, "distinctAttribute")):
            if attr and "/" not in attr:
                raise ConfigError(
                    f"{cf}.{key}", attr, "a fully qualified attribute name (domain/name)"
                )
        requests_named = tuple(
            _str(r, f"{cf}.requests") for r in _list(c.get("requests"), f"{cf}.requests")
        )
        constraints.append(Constraint(requests_named, match, distinct))
    status = _map(obj.get("status"), f"claim {ns}/{name}: status")
    allocation = None
    if status.get("allocation") is not None:
        allocation = allocation_from_json(
            status["allocation"], f"claim {ns}/{name}: status.allocation"
        )
    reserved = tuple(
        str(_map(r, "status.reservedFor").get("uid", ""))
        for r in _list(status.get("reservedFor"), f"claim {ns}/{name}: status.reservedFor")
    )
    return ResourceClaim(
        ns,
        name,
        str(meta.get("uid") or ""),
        tuple(requests),
        tuple(constraints),
        _config(devices.get("config"), f"{where}.config"),
        allocation,
        reserved,
    )


_BINARY = (("Ei", 60), ("Pi", 50), ("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10))


def format_quantity(q: Fraction) -> str:
    """A quantity's canonical-ish text: ``20Gi``, ``100``, ``500m`` (exact)."""
    if q.denominator == 1:
        n = q.numerator
        for suffix, bits in _BINARY:
            if n and n % (1 << bits) == 0:
                return f"{n >> bits}{suffix}"
        return str(n)
    milli = q * 1000
    if milli.denominator == 1:
        return f"{milli.numerator}m"
    nano = q * 10**9
    return f"{round(nano)}n"


def _selector_json(sel: NodeSelector) -> dict[str, Any]:
    terms = []
    for term in sel.terms:
        t: dict[str, list[dict[str, Any]]] = {}
        for r in term:
            entry: dict[str, Any] = {"key": r.key, "operator": r.operator}
            if r.values:
                entry["values"] = list(r.values)
            t.setdefault("matchFields" if r.field else "matchExpressions", []).append(entry)
        terms.append(t)
    return {"nodeSelectorTerms": terms}


def allocation_status(alloc: ClaimAllocation) -> dict[str, Any]:
    """The claim's ``status.allocation`` for the bind step (resource.k8s.io/v1 shape)."""
    results = []
    for r in alloc.results:
        entry: dict[str, Any] = {
            "request": r.request,
            "driver": r.driver,
            "pool": r.pool,
            "device": r.device,
        }
        if r.admin_access:
            entry["adminAccess"] = True
        if r.tolerations:
            entry["tolerations"] = [
                {
                    k: v
                    for k, v in (
                        ("key", t.key),
                        ("operator", t.operator),
                        ("value", t.value),
                        ("effect", t.effect),
                    )
                    if v
                }
                for t in r.tolerations
            ]
        if r.share_id:
            entry["shareID"] = r.share_id
        if r.consumed:
            entry["consumedCapacity"] = {
                (n.split("/", 1)[1] if n.startswith(f"{r.driver}/") else n): format_quantity(v)
                for n, v in r.consumed.items()
            }
        if r.binding_conditions:
            entry["bindingConditions"] = list(r.binding_conditions)
        if r.binding_failure_conditions:
            entry["bindingFailureConditions"] = list(r.binding_failure_conditions)
        results.append(entry)
    config = [
        {
            "source": source,
            **({"requests": list(cfg.requests)} if cfg.requests else {}),
            "opaque": {"driver": cfg.driver, "parameters": dict(cfg.parameters)},
        }
        for source, cfg in alloc.config
    ]
    out: dict[str, Any] = {"devices": {"results": results, "config": config}}
    if alloc.node_selector is not None:
        out["nodeSelector"] = _selector_json(alloc.node_selector)
    return out
