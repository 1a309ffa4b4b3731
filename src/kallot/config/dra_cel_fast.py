"""A fast path for common CEL selectors: Python closures straight over the device model.

Where it sits: inside ``config.dra_cel``'s ``CelSelector``. Evaluating a selector through the
``cel`` crate converts the whole ``device`` value to CEL values first (``add_variable``, about
60 us per device and selector on the differential suite: the largest single cost of kallot's
allocation, BENCHMARKS.md "DRA allocator vs upstream's"). Most selectors in the wild are a few
comparisons of attributes (``device.driver == 'gpu.nvidia.com' &&
device.attributes['gpu.nvidia.com'].type == 'gpu'``), so ``compile_fast`` turns the subset
below into nested closures that read ``Device.attributes`` / ``capacity`` directly (a few us).

The subset (anything else: ``compile_fast`` answers None and the crate evaluates):
literals ``true``, ``false``, decimal ints (and ``-`` before one), quoted strings without
escapes, lists of those; ``device`` and its fields ``driver``, ``allowMultipleAllocations``,
``attributes``, ``capacity``, a domain ``['<domain>']`` and a name ``.name`` / ``['name']``;
``&&``, ``||``, ``!``, ``? :``, ``==``, ``!=``, ``<``, ``<=``, ``>``, ``>=``, ``in``;
``has(...)``; ``startsWith``, ``endsWith``, ``contains``, ``compareTo``, ``isGreaterThan``,
``isLessThan``, ``includes``; ``semver(...)``, ``quantity(...)``; the one-variable macros
``exists`` and ``all``. The optional syntax arrives already rewritten to ``has()`` and ``?:``
(``dra_cel_syntax.rewrite_optional``).

Trust: the closures answer only a bool they are sure of, with CEL's semantics as the crate
implements them (checked per expression and device against the crate in
tests/dra/test_dra_cel_fast.py, and against upstream by the differential suite). Whatever is
unsure or an error in CEL (a missing attribute, mismatched types, cross-type numbers, lists
compared whole) raises ``Unsure``, and ``CelSelector`` asks the crate, which gives the
authoritative answer and error message. ``&&`` and ``||`` absorb an error the way CEL does
(``error && false`` is false), which is exact: CEL's answer there does not depend on the other
operand's value.

``reads`` lists the device fields an expression can read when each use of ``device`` is a
literal path, and ``content`` their typed values on a device: ``CelSelector``'s memo by
content (any expression, fast or not: CEL is pure, so the answer is a function of those).

Long module: one small CEL parser whose every node compiles to its closure; split, the
grammar and the semantics of each node would sit apart (``reads`` walks the same tokens).
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from typing import Any

from kallot.config.dra_cel_lib import semver
from kallot.config.dra_cel_syntax import TOKEN
from kallot.core.dra.model import Device, Version, parse_quantity
from kallot.core.errors import ConfigError

Env = dict[str, Any]
Fn = Callable[[Device, Env], Any]
MAX_LIST_VALUES = 48  # as config.dra_cel (includes on longer lists is an error)


class Unsure(Exception):
    """The fast path cannot answer this evaluation (an error in CEL, or outside its subset)."""


class _Unsupported(Exception):
    """The expression is outside the fast path's subset (at compile time)."""


class _Map:
    """``device.attributes`` or ``device.capacity`` of one device."""

    __slots__ = ("capacity", "dev", "domains")

    def __init__(self, dev: Device, capacity: bool, domains: frozenset[str]) -> None:
        self.dev, self.capacity, self.domains = dev, capacity, domains

    def names(self) -> Any:
        return self.dev.capacity if self.capacity else self.dev.attributes


class _Domain:
    """One domain's map of a device's attributes or capacities (maybe empty)."""

    __slots__ = ("domain", "map")

    def __init__(self, map_: _Map, domain: str) -> None:
        self.map, self.domain = map_, domain

    def get(self, name: str) -> Any:
        names = self.map.names()
        got = names.get(f"{self.domain}/{name}")
        if got is None:
            raise Unsure(f"no such key: {name}")
        return Fraction(got.value) if self.map.capacity else got

    def has(self, name: str) -> bool:
        return f"{self.domain}/{name}" in self.map.names()

    def keys(self) -> list[str]:
        prefix = self.domain + "/"
        return [n[len(prefix) :] for n in self.map.names() if n.rpartition("/")[0] == self.domain]


def _domains(m: _Map) -> set[str]:
    return set(m.domains) | {n.rpartition("/")[0] for n in m.names()}


def _select(x: Any, name: str) -> Any:
    if isinstance(x, _Domain):
        return x.get(name)
    if isinstance(x, Device):
        if name == "driver":
            return x.driver
        if name == "allowMultipleAllocations":
            return x.allow_multiple
    raise Unsure(f"no field {name}")


def _plain(x: Any) -> bool:
    return type(x) in (bool, int, str)


def _eq(a: Any, b: Any) -> bool:
    ta, tb = type(a), type(b)
    if ta is tb and ta in (bool, int, str, Version, Fraction):
        return bool(a == b)
    if _plain(a) and _plain(b):
        return False  # CEL: values of different plain types are never equal
    raise Unsure("equality outside the fast path")


def _in(x: Any, coll: Any) -> bool:
    if isinstance(coll, _Map):
        if type(x) is not str:
            raise Unsure("in: key")
        return x in _domains(coll)
    if isinstance(coll, _Domain):
        if type(x) is not str:
            raise Unsure("in: key")
        return coll.has(x)
    if isinstance(coll, (list, tuple)):
        return any(_eq(x, e) for e in coll)
    raise Unsure("in: collection")


def _ordered(a: Any, b: Any) -> tuple[Any, Any]:
    ta, tb = type(a), type(b)
    if ta is tb and ta in (int, str):
        return a, b
    raise Unsure("comparison outside the fast path")


_REL: dict[str, Callable[[Any, Any], bool]] = {
    "<": lambda a, b: bool(a < b),
    "<=": lambda a, b: bool(a <= b),
    ">": lambda a, b: bool(a > b),
    ">=": lambda a, b: bool(a >= b),
}


def _cmp(a: Any, b: Any) -> int:
    if type(a) is Version and type(b) is Version:
        return a.compare(b)
    if type(a) is Fraction and type(b) is Fraction:
        return (a > b) - (a < b)
    raise Unsure("compareTo needs two versions or two quantities")


def _str2(a: Any, b: Any) -> tuple[str, str]:
    if type(a) is str and type(b) is str:
        return a, b
    raise Unsure("string function on other types")


def _includes(target: Any, arg: Any) -> bool:
    if isinstance(target, tuple):
        if len(target) > MAX_LIST_VALUES:
            raise Unsure("includes on a long list")
        return any(type(x) is type(arg) and x == arg for x in target)
    if isinstance(target, (_Map, _Domain, list)):
        raise Unsure("includes on a map or list value")
    return type(target) is type(arg) and bool(target == arg)


def _starts(s: Any, p: Any) -> bool:
    a, b = _str2(s, p)
    return a.startswith(b)


def _ends(s: Any, p: Any) -> bool:
    a, b = _str2(s, p)
    return a.endswith(b)


def _contains(s: Any, p: Any) -> bool:
    a, b = _str2(s, p)
    return b in a


_METHODS: dict[str, tuple[int, Callable[..., Any]]] = {
    "startsWith": (1, _starts),
    "endsWith": (1, _ends),
    "contains": (1, _contains),
    "compareTo": (1, _cmp),
    "isGreaterThan": (1, lambda a, b: _cmp(a, b) > 0),
    "isLessThan": (1, lambda a, b: _cmp(a, b) < 0),
    "includes": (1, _includes),
}


def _semver(text: Any, normalize: Any = False) -> Version:
    if type(text) is not str or type(normalize) is not bool:
        raise Unsure("semver arguments")
    try:
        return semver(text, normalize)  # the crate path's parser (config.dra_cel_lib)
    except ValueError as exc:
        raise Unsure(str(exc)) from None


def _quantity(text: Any) -> Fraction:
    if type(text) is not str:
        raise Unsure("quantity argument")
    try:
        return parse_quantity(text)
    except ConfigError:
        raise Unsure("not a quantity") from None


_GLOBALS: dict[str, tuple[tuple[int, ...], Callable[..., Any]]] = {
    "semver": ((1, 2), _semver),
    "quantity": ((1,), _quantity),
}


def _bool(x: Any) -> bool:
    if type(x) is not bool:
        raise Unsure("not a bool")
    return x


def _and(a: Fn, b: Fn) -> Fn:
    def f(dev: Device, env: Env) -> bool:
        try:
            left = _bool(a(dev, env))
        except Unsure:
            if _bool(b(dev, env)) is False:
                return False
            raise
        if not left:
            return False
        return _bool(b(dev, env))

    return f


def _or(a: Fn, b: Fn) -> Fn:
    def f(dev: Device, env: Env) -> bool:
        try:
            left = _bool(a(dev, env))
        except Unsure:
            if _bool(b(dev, env)) is True:
                return True
            raise
        if left:
            return True
        return _bool(b(dev, env))

    return f


class _Parser:
    """Recursive descent over ``TOKEN``'s tokens, CEL's precedence; closures out."""

    def __init__(self, source: str, domains: frozenset[str]) -> None:
        self.toks = TOKEN.findall(source)
        self.i = 0
        self.domains = domains
        self.vars: list[str] = []

    def peek(self, k: int = 0) -> str:
        j = self.i + k
        return self.toks[j] if j < len(self.toks) else ""

    def take(self, want: str | None = None) -> str:
        tok = self.peek()
        if not tok or (want is not None and tok != want):
            raise _Unsupported(tok)
        self.i += 1
        return tok

    def parse(self) -> Fn:
        f = self.expr()
        if self.i != len(self.toks):
            raise _Unsupported(self.peek())
        return f

    def expr(self) -> Fn:
        cond = self.or_()
        if self.peek() != "?":
            return cond
        self.take("?")
        yes = self.or_()
        self.take(":")
        no = self.expr()
        return lambda d, e: yes(d, e) if _bool(cond(d, e)) else no(d, e)

    def or_(self) -> Fn:
        f = self.and_()
        while self.peek() == "||":
            self.take()
            f = _or(f, self.and_())
        return f

    def and_(self) -> Fn:
        f = self.rel()
        while self.peek() == "&&":
            self.take()
            f = _and(f, self.rel())
        return f

    def rel(self) -> Fn:
        f = self.unary()
        while self.peek() in ("==", "!=", "<", "<=", ">", ">=", "in"):
            op = self.take()
            g = self.unary()
            f = self._binary(op, f, g)
        return f

    @staticmethod
    def _binary(op: str, a: Fn, b: Fn) -> Fn:
        if op == "==":
            return lambda d, e: _eq(a(d, e), b(d, e))
        if op == "!=":
            return lambda d, e: not _eq(a(d, e), b(d, e))
        if op == "in":
            return lambda d, e: _in(a(d, e), b(d, e))
        rel = _REL[op]
        return lambda d, e: rel(*_ordered(a(d, e), b(d, e)))

    def unary(self) -> Fn:
        if self.peek() == "!":
            self.take()
            f = self.unary()
            return lambda d, e: not _bool(f(d, e))
        if self.peek() == "-" and self.peek(1).isdigit():
            self.take()
            value = -self._int(self.take())
            return lambda d, e: value
        return self.member()

    @staticmethod
    def _int(tok: str) -> int:
        if not tok.isdigit():
            raise _Unsupported(tok)  # floats, uints, hex: the crate's
        return int(tok)

    def member(self) -> Fn:
        f = self.primary()
        while self.peek() in (".", "["):
            if self.take() == "[":
                key = self.expr()
                self.take("]")
                f = self._index(f, key)
                continue
            name = self.take()
            if not name.isidentifier():
                raise _Unsupported(name)
            if self.peek() != "(":
                f = self._select(f, name)
                continue
            f = self._method(f, name)
        return f

    def _select(self, f: Fn, name: str) -> Fn:
        domains = self.domains
        if name in ("attributes", "capacity"):
            cap = name == "capacity"

            def field(d: Device, e: Env) -> Any:
                x = f(d, e)
                if isinstance(x, Device):
                    return _Map(x, cap, domains)
                raise Unsure(f"no field {name}")

            return field
        return lambda d, e: _select(f(d, e), name)

    @staticmethod
    def _index(f: Fn, key: Fn) -> Fn:
        def index(d: Device, e: Env) -> Any:
            x, k = f(d, e), key(d, e)
            if type(k) is not str or "/" in k:
                raise Unsure("index")
            if isinstance(x, _Map):
                return _Domain(x, k)
            if isinstance(x, _Domain):
                return x.get(k)
            raise Unsure("index")

        return index

    def _method(self, recv: Fn, name: str) -> Fn:
        if name in ("exists", "all"):
            return self._macro(recv, name)
        if name not in _METHODS:
            raise _Unsupported(name)
        arity, fn = _METHODS[name]
        args = self._args()
        if len(args) != arity:
            raise _Unsupported(name)
        (arg,) = args
        return lambda d, e: fn(recv(d, e), arg(d, e))

    def _macro(self, recv: Fn, name: str) -> Fn:
        self.take("(")
        var = self.take()
        if not var.isidentifier() or var == "device":
            raise _Unsupported(var)
        self.take(",")
        self.vars.append(var)
        pred = self.expr()
        self.vars.pop()
        self.take(")")
        want = name == "exists"  # the value that decides the fold

        def fold(d: Device, e: Env) -> bool:
            coll = recv(d, e)
            if isinstance(coll, _Domain):
                items: Any = coll.keys()
            elif isinstance(coll, _Map):
                items = sorted(_domains(coll))
            elif isinstance(coll, (tuple, list)):
                items = coll
            else:
                raise Unsure("macro range")
            failed = False
            inner = dict(e)
            for item in items:
                inner[var] = item
                try:
                    if _bool(pred(d, inner)) is want:
                        return want
                except Unsure:
                    failed = True
            if failed:
                raise Unsure("error in a macro")
            return not want

        return fold

    def _args(self) -> list[Fn]:
        self.take("(")
        args: list[Fn] = []
        while self.peek() != ")":
            args.append(self.expr())
            if self.peek() == ",":
                self.take()
            elif self.peek() != ")":
                raise _Unsupported(self.peek())
        self.take(")")
        return args

    def primary(self) -> Fn:
        tok = self.take()
        if tok == "(":
            f = self.expr()
            self.take(")")
            return f
        if tok == "[":
            items: list[Any] = []
            while self.peek() != "]":
                items.append(self._literal(self.take()))
                if self.peek() == ",":
                    self.take()
                elif self.peek() != "]":
                    raise _Unsupported(self.peek())
            self.take("]")
            value = tuple(items)
            return lambda d, e: value
        if tok in self.vars:
            return lambda d, e: e[tok]
        if tok == "device":
            return lambda d, e: d
        if tok == "has" and self.peek() == "(":
            return self._has()
        if tok in _GLOBALS and self.peek() == "(":
            arities, fn = _GLOBALS[tok]
            args = self._args()
            if len(args) not in arities:
                raise _Unsupported(tok)
            return lambda d, e: fn(*(a(d, e) for a in args))
        value = self._literal(tok)
        return lambda d, e: value

    def _has(self) -> Fn:
        self.take("(")
        start = self.i
        depth = 0
        # has(E.name): E up to the last top-level ``.``.
        while True:
            tok = self.peek()
            if not tok:
                raise _Unsupported("has")
            if tok in "([{":
                depth += 1
            elif tok in ")]}":
                if depth == 0:
                    break
                depth -= 1
            self.i += 1
        end = self.i
        if end - start < 3 or self.toks[end - 2] != "." or not self.toks[end - 1].isidentifier():
            raise _Unsupported("has")
        name = self.toks[end - 1]
        inner = _Parser("", self.domains)
        inner.toks, inner.vars = self.toks[start : end - 2], list(self.vars)
        recv = inner.parse()
        self.take(")")

        def has(d: Device, e: Env) -> bool:
            x = recv(d, e)
            if isinstance(x, _Domain):
                return x.has(name)
            raise Unsure("has")

        return has

    @staticmethod
    def _literal(tok: str) -> Any:
        if tok == "true":
            return True
        if tok == "false":
            return False
        if tok.isdigit():
            return int(tok)
        if len(tok) >= 2 and tok[0] == tok[-1] and tok[0] in "'\"":
            body = tok[1:-1]
            if "\\" in body or tok.startswith(("'''", '"""')):
                raise _Unsupported(tok)
            return body
        raise _Unsupported(tok)


def compile_fast(source: str, domains: frozenset[str]) -> Callable[[Device], bool] | None:
    """The closure for ``source`` (the crate's source, optional syntax already rewritten), or
    None when it is outside the subset. It answers a bool or raises ``Unsure``."""
    try:
        f = _Parser(source, domains).parse()
    except (_Unsupported, ValueError):
        return None
    empty: Env = {}

    def run(dev: Device) -> bool:
        try:
            return _bool(f(dev, empty))
        except Unsure:
            raise
        except Exception as exc:  # anything unexpected: the crate decides
            raise Unsure(str(exc)) from None

    return run


# What ``reads`` names: a path the expression reads from the device.
DRIVER, ALLOW, ATTRIBUTE, CAPACITY = 0, 1, 2, 3
Path = tuple[int, str]  # (kind, qualified name; "" for driver and allowMultipleAllocations)


def _plain_string(tok: str) -> str | None:
    if (
        len(tok) >= 2
        and tok[0] == tok[-1]
        and tok[0] in "'\""
        and not tok.startswith(("'''", '"""'))
    ):
        body = tok[1:-1]
        if "\\" not in body and "/" not in body:
            return body
    return None


def reads(source: str) -> tuple[Path, ...] | None:
    """Every device field ``source`` (the crate's source) can read, when each use of
    ``device`` is a literal path: ``device.driver``, ``device.allowMultipleAllocations``,
    ``device.attributes['<domain>'].<name>`` (or ``['<name>']``) and the same of ``capacity``;
    None when any use is not (a map iterated, a key computed, ``'d' in device.attributes``,
    ``device`` compared or passed whole). Why: a selector's answer (its error included) is then
    a function of those fields' values (CEL is pure), so devices alike in them share one
    evaluation (``CelSelector``'s content memo): the GPUs of a pool differ in their uuid and
    PCI address, rarely in what a selector reads."""
    toks = TOKEN.findall(source)
    out: list[Path] = []
    i = 0
    while i < len(toks):
        if toks[i] != "device":
            i += 1
            continue
        if i and toks[i - 1] == ".":
            return None  # a field named device of something else: not the variable
        nxt = toks[i + 1 : i + 9] + [""] * 8
        if nxt[0] != ".":
            return None
        if nxt[1] in ("driver", "allowMultipleAllocations") and nxt[2] != "(":
            out.append((DRIVER if nxt[1] == "driver" else ALLOW, ""))
            i += 3
            continue
        if nxt[1] not in ("attributes", "capacity") or nxt[2] != "[" or nxt[4] != "]":
            return None
        domain = _plain_string(nxt[3])
        if domain is None:
            return None
        if nxt[5] == "." and nxt[6].isidentifier() and nxt[7] != "(":
            name: str | None = nxt[6]
            i += 8
        elif nxt[5] == "[" and nxt[7] == "]":
            name = _plain_string(nxt[6])
            i += 9
        else:
            return None
        if name is None:
            return None
        out.append((ATTRIBUTE if nxt[1] == "attributes" else CAPACITY, f"{domain}/{name}"))
    return tuple(dict.fromkeys(out))


_MISSING = object()


def content(dev: Device, paths: tuple[Path, ...]) -> tuple[Any, ...]:
    """The values of ``paths`` on ``dev``, each with its type (``True`` and ``1`` are equal
    in Python, not in CEL; a list with its elements' types)."""
    out: list[Any] = []
    attributes, capacity = dev.attributes, dev.capacity
    for kind, name in paths:
        if kind == ATTRIBUTE:
            value: Any = attributes.get(name, _MISSING)
        elif kind == DRIVER:
            value = dev.driver
        elif kind == ALLOW:
            value = dev.allow_multiple
        else:
            cap = capacity.get(name)
            value = _MISSING if cap is None else cap.value
        kind_of = type(value)
        if kind_of is tuple:
            out.append(tuple(type(x) for x in value))
        out.append(kind_of)
        out.append(value)
    return tuple(out)
