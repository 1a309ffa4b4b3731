"""CEL device selectors with the Kubernetes DRA environment, compiled once and cached.

Where it sits: the edge between the API's selector strings and the pure DRA core.
``kallot.config.dra`` compiles every ``cel.expression`` of classes and claims here; the core
(``core.dra.allocator``) only calls ``Selector.matches(device)``. The CEL library
(``common-expression-language``, Rust bindings of the ``cel`` crate) stays out of
``kallot.core`` (import-linter ``core-is-pure``): the core receives compiled predicates.
Chosen over ``cel-python`` (pure Python) because it compiles once and evaluates ~40x faster
(88 us vs 3.5 ms per selector on this machine, see docs/design/009-dra-allocator.md), and it
takes Python functions as receiver-style CEL functions, which the Kubernetes extensions need.

The environment (k8s.io/dynamic-resource-allocation/cel): ``device.driver``,
``device.attributes['<domain>'].<name>`` (int, bool, string, version),
``device.capacity['<domain>'].<name>`` (quantity); an unknown domain is an empty map, an unknown
name an error. Kubernetes' library functions are here as plain CEL functions over tagged values
(a version or quantity is a string with a private prefix, so ``==`` compares canonical forms):
``semver(s)``, ``isSemver(s)``, ``major/minor/patch()``, ``quantity(s)``, ``isQuantity(s)``,
``compareTo``, ``isGreaterThan``, ``isLessThan``, ``asInteger``, ``asApproximateFloat``,
``sign``, ``isInteger``, ``add``, ``sub``, and ``includes`` for list attributes.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from kallot.core.dra.model import Device, DeviceId, SelectorError, Version, parse_quantity
from kallot.core.errors import ConfigError

_V = "\x00semver:"
_Q = "\x00quantity:"
_DOMAIN = re.compile(r"device\.(?:attributes|capacity)\[\s*(?:'([^']*)'|\"([^\"]*)\")\s*\]")


def _version(v: Version) -> str:
    return _V + str(v)


def _quantity(q: Fraction) -> str:
    return f"{_Q}{q.numerator}/{q.denominator}"


def _unwrap(x: Any) -> Version | Fraction:
    if isinstance(x, str) and x.startswith(_V):
        return Version.parse(x[len(_V) :])
    if isinstance(x, str) and x.startswith(_Q):
        return Fraction(x[len(_Q) :])
    raise ValueError(f"{x!r} is not a version or quantity")


def _cmp(a: Any, b: Any) -> int:
    x, y = _unwrap(a), _unwrap(b)
    if isinstance(x, Version) and isinstance(y, Version):
        return x.compare(y)
    if isinstance(x, Fraction) and isinstance(y, Fraction):
        return (x > y) - (x < y)
    raise ValueError("compareTo needs two versions or two quantities")


def _semver(text: str, normalize: bool = False) -> str:
    if normalize:
        parts = [str(int(p)) for p in re.findall(r"\d+", text.lstrip("v"))[:3]]
        text = ".".join(parts + ["0"] * (3 - len(parts)))
    try:
        return _version(Version.parse(text))
    except ConfigError:
        raise ValueError(f"semver: {text!r} is not a semantic version") from None


def _is(parse: Callable[[str], object]) -> Callable[[str], bool]:
    def check(text: str) -> bool:
        try:
            parse(text)
        except (ConfigError, ValueError):
            return False
        return True

    return check


def _q(text: str) -> str:
    try:
        return _quantity(parse_quantity(text))
    except ConfigError:
        raise ValueError(f"quantity: {text!r} is not a quantity") from None


def _qarg(x: Any) -> Fraction:
    if isinstance(x, int):
        return Fraction(x)
    q = _unwrap(x)
    if not isinstance(q, Fraction):
        raise ValueError("expected a quantity")
    return q


def _part(i: int) -> Callable[[Any], int]:
    def get(x: Any) -> int:
        v = _unwrap(x)
        if not isinstance(v, Version):
            raise ValueError("expected a version")
        return (v.major, v.minor, v.patch)[i]

    return get


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "semver": _semver,
    "isSemver": _is(Version.parse),
    "quantity": _q,
    "isQuantity": _is(parse_quantity),
    "compareTo": _cmp,
    "isGreaterThan": lambda a, b: _cmp(a, b) > 0,
    "isLessThan": lambda a, b: _cmp(a, b) < 0,
    "major": _part(0),
    "minor": _part(1),
    "patch": _part(2),
    "asInteger": lambda q: int(_qarg(q)) if _qarg(q).denominator == 1 else _fail("not an integer"),
    "isInteger": lambda q: _qarg(q).denominator == 1,
    "asApproximateFloat": lambda q: float(_qarg(q)),
    "sign": lambda q: (_qarg(q) > 0) - (_qarg(q) < 0),
    "add": lambda a, b: _quantity(_qarg(a) + _qarg(b)),
    "sub": lambda a, b: _quantity(_qarg(a) - _qarg(b)),
    "includes": lambda xs, x: x in xs,
}


def _fail(msg: str) -> Any:
    raise ValueError(msg)


def _value(v: object) -> Any:
    if isinstance(v, Version):
        return _version(v)
    return v


def device_value(dev: Device, domains: frozenset[str]) -> dict[str, Any]:
    """The CEL ``device`` variable; every domain the expression names exists (maybe empty)."""
    attrs: dict[str, dict[str, Any]] = {d: {} for d in domains}
    for name, value in dev.attributes.items():
        domain, _, short = name.rpartition("/")
        attrs.setdefault(domain, {})[short] = _value(value)
    caps: dict[str, dict[str, Any]] = {d: {} for d in domains}
    for name, cap in dev.capacity.items():
        domain, _, short = name.rpartition("/")
        caps.setdefault(domain, {})[short] = _quantity(cap.value)
    return {"driver": dev.driver, "attributes": attrs, "capacity": caps}


class CelSelector:
    """One compiled expression; results are memoized per device (devices are immutable)."""

    __slots__ = ("_cache", "_ctx", "_domains", "_program", "expression")

    def __init__(self, expression: str, program: Any) -> None:
        self.expression = expression
        self._program = program
        self._domains = frozenset(a or b for a, b in _DOMAIN.findall(expression))
        # By device id, holding the device: a new snapshot's device of the same id is
        # evaluated afresh (identity check), an unchanged one is not.
        self._cache: dict[DeviceId, tuple[Device, bool]] = {}
        self._ctx = _cel().Context()
        for name, fn in FUNCTIONS.items():
            self._ctx.add_function(name, fn)

    def matches(self, device: Device) -> bool:
        hit = self._cache.get(device.id)
        if hit is not None and hit[0] is device:
            return hit[1]
        self._ctx.add_variable("device", device_value(device, self._domains))
        try:
            result = self._program.execute(self._ctx)
        except Exception as exc:  # the library raises KeyError/ValueError/RuntimeError
            raise SelectorError(_one_line(exc)) from None
        if not isinstance(result, bool):
            raise SelectorError(f"evaluated to {result!r}, expected a bool")
        self._cache[device.id] = (device, result)
        return result


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else type(exc).__name__
    first = first.split("ERROR: <input>:", 1)[-1]  # the parser repeats the expression first
    return f"no such key {first}" if isinstance(exc, KeyError) else first


_COMPILED: dict[str, CelSelector] = {}


def _cel() -> Any:
    """The CEL library, imported on first use: its package also loads its interactive shell
    (prompt_toolkit, pygments), about 0.17 s of CPU that the live scheduler's start-up would
    pay even on a cluster without a CEL selector."""
    import cel

    return cel


def compile_selector(expression: str, field: str) -> CelSelector:
    """The compiled selector for ``expression`` (cached by text). ``field`` names where it
    came from for the one-line error (``claim default/x, request gpu: selectors[0]...``)."""
    hit = _COMPILED.get(expression)
    if hit is not None:
        return hit
    try:
        program = _cel().compile(expression)
    except Exception as exc:
        raise ConfigError(field, expression, f"a CEL expression ({_one_line(exc)})") from None
    sel = CelSelector(expression, program)
    _COMPILED[expression] = sel
    return sel
