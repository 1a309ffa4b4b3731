"""CEL device selectors with the Kubernetes DRA environment, compiled once and cached.

Where it sits: the edge between the API's selector strings and the pure DRA core.
``kallot.config.dra`` compiles every ``cel.expression`` of classes and claims here; the core
(``core.dra.allocator``) only calls ``Selector.matches(device)``. The CEL library
(``common-expression-language``, Rust bindings of the ``cel`` crate) stays out of
``kallot.core`` (import-linter ``core-is-pure``): the core receives compiled predicates.
Chosen over ``cel-python`` (pure Python) because it compiles once and evaluates ~40x faster
(88 us vs 3.5 ms per selector on this machine, see docs/design/009-dra-allocator.md), and it
takes Python functions as receiver-style CEL functions, which the Kubernetes extensions need.

The environment (k8s.io/dynamic-resource-allocation/cel; docs/dra.md "CEL functions" lists
every function and what kallot has): ``device.driver``, ``device.allowMultipleAllocations``,
``device.attributes['<domain>'].<name>`` (int, bool, string, version, and lists of them),
``device.capacity['<domain>'].<name>`` (quantity); an unknown domain is an empty map, an unknown
name an error. Kubernetes' library functions are here as plain CEL functions over tagged values
(a version or quantity is a string with a private prefix, so ``==`` compares canonical forms):
``semver(s)``, ``isSemver(s)``, ``major/minor/patch()``, ``quantity(s)``, ``isQuantity(s)``,
``compareTo``, ``isGreaterThan``, ``isLessThan``, ``asInteger``, ``asApproximateFloat``,
``isInteger``, ``add``, ``sub``, and ``includes`` for list attributes; cel-go's string, set, list,
optional and regex extensions are in ``config.dra_cel_lib``, Kubernetes' IP, CIDR and URL
libraries and ``format`` in ``config.dra_cel_net``, its ``format`` library in
``config.dra_cel_format``. Syntax the crate lacks (optionals, ``cel.bind``, two-variable
comprehensions, ``sortBy``, ``size`` in code points...) is rewritten before compiling
(``config.dra_cel_syntax.rewrite``); a call of a function outside the environment is refused
at compile time.

Cost limits (a tenant's selector must not stall the scheduler; docs/dra.md "Selector cost
limits"). Kubernetes refuses a selector longer than ``CELSelectorExpressionMaxLength`` (10,240
characters) or whose estimated worst-case cost exceeds ``CELSelectorExpressionMaxCost``
(1,000,000 cost units, also the runtime limit; k8s.io/api/resource and
k8s.io/dynamic-resource-allocation/cel). The ``cel`` crate has neither a cost estimator nor a
runtime cost hook, so ``compile_selector`` refuses, with a one-line ``ConfigError``:

* an expression over ``MAX_EXPRESSION_CHARS`` (10,240) characters;
* brackets nested deeper than ``MAX_NESTING`` (32);
* comprehension macros (``all``, ``exists``, ``exists_one``, ``map``, ``filter``) nested
  deeper than ``MAX_COMPREHENSION_NESTING`` (2);
* an estimated worst-case cost over ``MAX_COST`` (1,000,000): every token costs 1, times the
  size of each comprehension's range around it: a list literal's element count; otherwise
  ``UNKNOWN_RANGE_SIZE`` = 128 (above Kubernetes' 32 attributes and capacities per device), or
  all list literals' elements together times one plus the count of ``+``, if larger.

At run time every library call is charged upstream's runtime cost (``config.dra_cel_cost``;
past 1,000,000 the evaluation fails as upstream's does), and one evaluation of one selector on
one device that takes longer than
``MAX_EVALUATION_SECONDS`` (0.1 s of this thread's CPU time: wall clock failed trivial selectors
on a loaded machine) raises ``SelectorError``: the allocator fails that
claim only, at its first device. Compiled selectors are kept in an LRU of ``MAX_COMPILED`` (4,096)
expressions, and each selector memoizes at most ``MAX_MEMO_DEVICES`` (65,536) answers (the memo
is cleared when full): by the values of the device fields it reads when each is a literal path
(``dra_cel_fast.reads``: devices alike in those share one evaluation, also across snapshots),
else by device.

Long module: the environment's compile-time checks (calls, cost estimate) and the compiled
selector with its memos; each check is small, and they share the token helpers.
"""

from __future__ import annotations

import re
import time
from collections import OrderedDict
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from kallot.config import dra_cel_cost, dra_cel_crate
from kallot.config.dra_cel_fast import Unsure, compile_fast, content, reads
from kallot.config.dra_cel_lib import BUILTIN, EXTENSIONS, NAMESPACED, semver
from kallot.config.dra_cel_syntax import (
    CLOSE,
    OPEN,
    TOKEN,
    TWO_VAR,
    is_name,
    matching,
    rewrite,
)
from kallot.core.dra.model import Device, DeviceId, SelectorError, Version, parse_quantity
from kallot.core.errors import ConfigError

_V = "\x00semver:"
_Q = "\x00quantity:"
# Limits: see the module docstring (Kubernetes' values where it has one).
MAX_EXPRESSION_CHARS = 10_240  # resource.k8s.io CELSelectorExpressionMaxLength
MAX_COST = 1_000_000  # resource.k8s.io CELSelectorExpressionMaxCost (= cel.PerCallLimit)
MAX_NESTING = 32
MAX_COMPREHENSION_NESTING = 2
UNKNOWN_RANGE_SIZE = 128
MAX_EVALUATION_SECONDS = 0.1
MAX_COMPILED = 4_096
MAX_MEMO_DEVICES = 65_536
MAX_LIST_VALUES = 48  # resource.k8s.io ResourceSliceMaxAttributeValuesPerDevice
MACROS = frozenset({"all", "exists", "exists_one", "map", "filter"})
# Every macro that iterates, for the cost estimate (two-variable ones and sortBy included).
LOOPS = MACROS | TWO_VAR | {"sortBy"}
_clock: Callable[[], float] = time.thread_time  # a test replaces it (no sleeps)

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
    return _version(semver(text, normalize))


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


def _includes(target: Any, arg: Any) -> bool:
    """Kubernetes' ``includes`` (list-type attributes): a list holds the value, or a scalar
    equals it."""
    if isinstance(target, list):
        if len(target) > MAX_LIST_VALUES:
            raise ValueError(
                f"'includes' function cannot be applied to lists longer than {MAX_LIST_VALUES} values"
            )
        return any(_same(x, arg) for x in target)
    return _same(target, arg)


def _same(a: Any, b: Any) -> bool:
    # CEL equality: a bool is never equal to an int (Python's True == 1 is not CEL's).
    return type(a) is type(b) and a == b


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
    "add": lambda a, b: _quantity(_qarg(a) + _qarg(b)),
    "sub": lambda a, b: _quantity(_qarg(a) - _qarg(b)),
    "includes": _includes,
}


def _fail(msg: str) -> Any:
    raise ValueError(msg)


def _value(v: object) -> Any:
    if isinstance(v, Version):
        return _version(v)
    if isinstance(v, tuple):
        return [_value(x) for x in v]
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
    return {
        "driver": dev.driver,
        "allowMultipleAllocations": dev.allow_multiple,
        "attributes": attrs,
        "capacity": caps,
    }


# The ``device`` value per (device id, domains), holding the device (an identity check, as the
# selectors' memo): the selectors of a class and a request share it. At most MAX_MEMO_DEVICES.
_VALUES: dict[tuple[DeviceId, frozenset[str]], tuple[Device, dict[str, Any]]] = {}


def _list_literals(tokens: list[str]) -> dict[int, int]:
    """Index of each list literal's closing ``]`` -> its element count."""
    stack: list[list[Any]] = []  # [closer, list literal, commas]
    out: dict[int, int] = {}
    for i, tok in enumerate(tokens):
        if tok in OPEN:
            prev = tokens[i - 1] if i else ""
            is_list = tok == "[" and not (prev in {")", "]", "}"} or is_name(prev))
            stack.append([OPEN[tok], is_list, 0])
        elif stack and tok == stack[-1][0]:
            _, is_list, commas = stack.pop()
            if is_list:
                out[i] = commas + (tokens[i - 1] not in {"[", ","})
        elif tok == "," and stack and stack[-1][1]:
            stack[-1][2] += 1
    return out


def estimate_cost(expression: str) -> tuple[int, int, int]:
    """``(cost, nesting, comprehension nesting)`` of a parsed expression, conservatively: each
    token costs 1 times the range size of every comprehension around it. A range written as a
    list literal has its element count; any other (an attribute map, a variable, a list built
    by ``+`` or ``map``) the most a list can have here: ``UNKNOWN_RANGE_SIZE``, or all list
    literals' elements together times one plus the count of ``+`` (each ``+`` may concatenate
    them again), whichever is larger."""
    tokens = TOKEN.findall(expression)
    literals = _list_literals(tokens)
    unknown = max(UNKNOWN_RANGE_SIZE, sum(literals.values()) * (1 + tokens.count("+")))
    sizes: list[int] = []  # per open bracket: its comprehension's range size, 0 if none
    cost = 0
    mult = 1
    depth = comprehensions = 0
    for i, tok in enumerate(tokens):
        cost += mult
        if tok in OPEN:
            size = 0
            if tok == "(" and i >= 2 and tokens[i - 1] in LOOPS and tokens[i - 2] == ".":
                size = max(literals.get(i - 3, unknown), 1)  # an empty range: still nested
            sizes.append(size)
            depth = max(depth, len(sizes))
            if size:
                mult *= size
                comprehensions = max(comprehensions, sum(1 for z in sizes if z))
        elif sizes and tok in CLOSE:
            size = sizes.pop()
            if size:
                mult //= size
    return cost, depth, comprehensions


# Every library function, charging upstream's runtime cost (config.dra_cel_cost).
_METERED: dict[str, Callable[..., Any]] = {
    name: dra_cel_cost.metered(name, fn)
    for name, fn in [*FUNCTIONS.items(), *EXTENSIONS.items(), *NAMESPACED.values()]
}
_KNOWN = BUILTIN | FUNCTIONS.keys() | EXTENSIONS.keys() | {n for n, _ in NAMESPACED.values()}


def _check_regex(tokens: list[str], i: int, expression: str, field: str) -> None:
    """A constant pattern is compiled when the selector is, as upstream's regex validator
    does (``'a'.matches('[')`` is a compile error there, not a runtime one)."""
    pattern = tokens[i + 2] if i + 3 < len(tokens) else ""
    if tokens[i + 3 : i + 4] not in ([")"], [","]) or pattern[:1] not in ("'", '"'):
        return
    body = pattern[1:-1]
    if "\\" in body or len(pattern) < 2 or pattern[:3] in ("'" * 3, '"' * 3):
        return  # escapes, triple quotes: left to the run time
    try:
        re.compile(body)
    except re.error as exc:
        raise ConfigError(
            field, expression, f"a CEL expression (invalid regular expression {body!r}: {exc})"
        ) from None


def _check_calls(source: str, expression: str, field: str) -> None:
    """Refuses a call of a function kallot's environment lacks (docs/dra.md "CEL functions"),
    and two-variable comprehensions, at compile time: the crate would only fail when the
    selector runs."""
    tokens = TOKEN.findall(source)
    for i in range(len(tokens) - 1):
        name = tokens[i]
        if tokens[i + 1] != "(" or not is_name(name) or name in {"in", "true", "false", "null"}:
            continue
        if name in {"matches", "find", "findAll"}:
            _check_regex(tokens, i, expression, field)
        if name not in _KNOWN:
            raise ConfigError(
                field,
                expression,
                f"a CEL expression of kallot's environment (no function {name!r})",
            )
        if name in MACROS and i and tokens[i - 1] == ".":
            close = matching(tokens, i + 1, 1)
            depth, commas = 0, 0
            for tok in tokens[i + 2 : close]:
                depth += tok in OPEN
                depth -= tok in CLOSE
                commas += tok == "," and depth == 0
            if commas >= (3 if name == "map" else 2):
                raise ConfigError(
                    field, expression, f"a CEL expression without two-variable {name}()"
                )


def _check_budget(expression: str, field: str) -> None:
    cost, depth, comprehensions = estimate_cost(expression)
    if depth > MAX_NESTING:
        raise ConfigError(
            field, expression, f"brackets nested at most {MAX_NESTING} deep (got {depth})"
        )
    if comprehensions > MAX_COMPREHENSION_NESTING:
        raise ConfigError(
            field,
            expression,
            f"comprehensions ({', '.join(sorted(LOOPS))}) nested at most "
            f"{MAX_COMPREHENSION_NESTING} deep (got {comprehensions})",
        )
    if cost > MAX_COST:
        raise ConfigError(
            field,
            expression,
            f"an estimated worst-case cost of at most {MAX_COST:,} (got {cost:,}, too complex)",
        )


class CelSelector:
    """One compiled expression; results are memoized per device (devices are immutable)."""

    __slots__ = (
        "_by_content",
        "_cache",
        "_ctx",
        "_domains",
        "_fast",
        "_paths",
        "_program",
        "expression",
    )

    def __init__(self, expression: str, program: Any, source: str | None = None) -> None:
        self.expression = expression
        self._program = program
        self._domains = frozenset(a or b for a, b in _DOMAIN.findall(expression))
        # Python closures for the common subset (config.dra_cel_fast); the crate otherwise,
        # and wherever they are unsure (errors included: the crate words them).
        self._fast = compile_fast(source if source is not None else expression, self._domains)
        # By device id, holding the device (an identity check: the device asked again, the
        # cheapest hit); a new snapshot's device of the same id goes on to the memo by
        # content below, or is evaluated afresh. Cleared when it reaches MAX_MEMO_DEVICES.
        self._cache: dict[DeviceId, tuple[Device, bool]] = {}
        # By the values of the fields the expression reads (``dra_cel_fast.reads``; None: it
        # reads the device in a way no list of fields captures): a device alike in those is
        # answered without evaluating (a new snapshot's devices too, and a pool's GPUs that
        # differ only in uuid and PCI address). A bool, or the error's message. Cleared when
        # it reaches MAX_MEMO_DEVICES.
        self._paths = reads(source if source is not None else expression)
        self._by_content: dict[tuple[Any, ...], bool | str] = {}
        self._ctx = _cel().Context()
        for name, fn in _METERED.items():
            self._ctx.add_function(name, fn)

    def matches(self, device: Device) -> bool:
        hit = self._cache.get(device.id)
        if hit is not None and hit[0] is device:
            return hit[1]
        if self._paths is not None:
            key = content(device, self._paths)
            got = self._by_content.get(key)
            if got is None:
                got = self._evaluate(device)
                if len(self._by_content) >= MAX_MEMO_DEVICES:
                    self._by_content.clear()
                self._by_content[key] = got
            result = got
        else:
            result = self._evaluate(device)
        if isinstance(result, str):
            raise SelectorError(result)
        if len(self._cache) >= MAX_MEMO_DEVICES and device.id not in self._cache:
            self._cache.clear()
        self._cache[device.id] = (device, result)
        return result

    def _evaluate(self, device: Device) -> bool | str:
        """One evaluation: the answer, or the error's message (a deterministic error: the
        content memo keeps it); over the CPU budget raises (not kept: it depends on the
        machine, not the device)."""
        start = _clock()
        result = None
        if self._fast is not None:
            try:
                result = self._fast(device)
            except Unsure:
                result = None
        if result is None:
            try:
                result = self._crate(device)
            except SelectorError as exc:
                return str(exc)
        took = _clock() - start
        if took > MAX_EVALUATION_SECONDS:
            raise SelectorError(
                f"evaluation took {took:.3f} s, over the budget of "
                f"{MAX_EVALUATION_SECONDS} s for one selector on one device"
            )
        return result

    def crate(self, device: Device) -> bool:
        """One evaluation through the ``cel`` crate alone (the authoritative one; the fast
        path's test compares with it)."""
        return self._crate(device)

    def _crate(self, device: Device) -> bool:
        key = (device.id, self._domains)
        seen = _VALUES.get(key)
        if seen is None or seen[0] is not device:
            if len(_VALUES) >= MAX_MEMO_DEVICES:
                _VALUES.clear()
            seen = _VALUES[key] = (device, device_value(device, self._domains))
        self._ctx.add_variable("device", seen[1])
        dra_cel_cost.reset()
        try:
            result = self._program.execute(self._ctx)
        except Exception as exc:  # the library raises KeyError/ValueError/RuntimeError
            raise SelectorError(_one_line(exc)) from None
        if not isinstance(result, bool):
            raise SelectorError(f"evaluated to {result!r}, expected a bool")
        return result

    @property
    def fast(self) -> bool:
        """Whether the expression is in the fast path's subset (``config.dra_cel_fast``)."""
        return self._fast is not None


def clear_memos() -> None:
    """Forget every compiled selector's answers (kept compiled): a benchmark's case is then
    evaluated as if its devices were new, as upstream's allocator evaluates every call."""
    for sel in _COMPILED.values():
        sel._cache.clear()
        sel._by_content.clear()
    _VALUES.clear()


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else type(exc).__name__
    first = first.split("ERROR: <input>:", 1)[-1]  # the parser repeats the expression first
    return f"no such key {first}" if isinstance(exc, KeyError) else first


# LRU of compiled selectors by expression text, at most MAX_COMPILED.
_COMPILED: OrderedDict[str, CelSelector] = OrderedDict()


def _cel() -> Any:
    """The CEL library, loaded on first use without its package's interactive shell
    (``config.dra_cel_crate``: prompt_toolkit and pygments are about 0.2 s of CPU)."""
    return dra_cel_crate.load()


def compile_selector(expression: str, field: str) -> CelSelector:
    """The compiled selector for ``expression`` (cached by text). ``field`` names where it
    came from for the one-line error (``claim default/x, request gpu: selectors[0]...``).
    Refuses expressions over the cost limits (module docstring)."""
    hit = _COMPILED.get(expression)
    if hit is not None:
        _COMPILED.move_to_end(expression)
        return hit
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ConfigError(
            field,
            expression,
            f"a CEL expression of at most {MAX_EXPRESSION_CHARS} characters "
            f"(got {len(expression)})",
        )
    source = rewrite(expression)
    _check_calls(source, expression, field)
    try:
        program = _cel().compile(source)
    except Exception as exc:
        raise ConfigError(field, expression, f"a CEL expression ({_one_line(exc)})") from None
    _check_budget(expression, field)
    sel = CelSelector(expression, program, source)
    _COMPILED[expression] = sel
    while len(_COMPILED) > MAX_COMPILED:
        _COMPILED.popitem(last=False)
    return sel
