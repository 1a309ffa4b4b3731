"""CEL library functions of kube-scheduler's selector environment that the ``cel`` crate lacks.

Where it sits: beside ``config.dra_cel`` (which registers ``EXTENSIONS`` with every compiled
selector and refuses, at compile time, a call of any function outside them). These are
cel-go's ``ext.Strings`` (v2), ``ext.Sets`` and ``ext.Lists`` (v3) and Kubernetes' list and
regex libraries (k8s.io/apiserver/pkg/cel/library), cel-go's optional helpers (``first``,
``last``, ``unwrapOpt``: the crate's ``OptionalValue``), the helpers ``config.dra_cel_syntax``'s
rewrites call (``_keys``, ``_pairs_map``, ``_sort_by``, ``_opt_select``, ``_size``, ...) and, from
``config.dra_cel_net`` / ``dra_cel_format``, the IP, CIDR, URL and format libraries, as plain
Python over the values the crate passes (str, int, float, bool, list, dict). Namespaced names (``sets.contains``) are called through
``NAMESPACED``: ``config.dra_cel`` rewrites ``sets.contains(`` to ``sets_contains(`` before
compiling. Regular expressions are Python's, which accept every RE2 pattern a selector is
likely to hold (RE2 is a subset, less backreferences and lookaround, which Python accepts and
upstream refuses). docs/dra.md "CEL functions" lists what is and is not here.
"""

from __future__ import annotations

import datetime
import re
import zoneinfo
from collections.abc import Callable
from typing import Any

from kallot.config import dra_cel_crate
from kallot.config.dra_cel_format import NAMESPACED_FORMATS, validate
from kallot.config.dra_cel_net import CIDR, IP, NET, ip_is_canonical, ip_of_cidr
from kallot.core.dra.model import Version
from kallot.core.errors import ConfigError


def _fail(msg: str) -> Any:
    raise ValueError(msg)


def semver(text: str, normalize: bool = False) -> Version:
    """Kubernetes' ``semver(s[, normalize])``: the version, or ``ValueError`` naming the text.

    Here, below both evaluators, so that the crate path (``config.dra_cel``) and the fast path
    (``config.dra_cel_fast``) parse with one function and neither imports the other's module.
    """
    if normalize:
        parts = [str(int(p)) for p in re.findall(r"\d+", text.lstrip("v"))[:3]]
        text = ".".join(parts + ["0"] * (3 - len(parts)))
    try:
        return Version.parse(text)
    except ConfigError:
        raise ValueError(f"semver: {text!r} is not a semantic version") from None


def _index_of(target: Any, x: Any, start: int = 0) -> int:
    if isinstance(target, str):
        if start < 0 or start > len(target):
            _fail(f"index out of range: {start}")
        return target.find(x, start)
    return next((i for i, v in enumerate(target) if _eq(v, x)), -1)


def _last_index_of(target: Any, x: Any, *end: int) -> int:
    if isinstance(target, str):
        return target.rfind(x, 0, end[0] + len(x)) if end else target.rfind(x)
    return next((i for i in range(len(target) - 1, -1, -1) if _eq(target[i], x)), -1)


def _eq(a: Any, b: Any) -> bool:
    # CEL equality: a bool is never an int; an int and a double compare by value.
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return bool(a == b)


def _replace(s: str, old: str, new: str, n: int = -1) -> str:
    return s.replace(old, new, n if n >= 0 else -1)


def _split(s: str, sep: str, n: int = -1) -> list[str]:
    if n == 0:
        return []
    if sep == "":
        parts = list(s)
        return parts if n < 0 else [*parts[: n - 1], "".join(parts[n - 1 :])]
    return s.split(sep, n - 1 if n > 0 else -1)


def _substring(s: str, start: int, *end: int) -> str:
    stop = end[0] if end else len(s)
    if not 0 <= start <= stop <= len(s):
        _fail(f"substring out of range: {start}, {stop}")
    return s[start:stop]


def _char_at(s: str, i: int) -> str:
    if not 0 <= i <= len(s):
        _fail(f"index out of range: {i}")
    return s[i] if i < len(s) else ""


def _quote(s: str) -> str:
    out = s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
    return f'"{out}"'


def _flatten(xs: list[Any], depth: int = 1) -> list[Any]:
    if depth < 0:
        _fail("flatten: negative depth")
    out: list[Any] = []
    for x in xs:
        if isinstance(x, list) and depth > 0:
            out.extend(_flatten(x, depth - 1))
        else:
            out.append(x)
    return out


def _distinct(xs: list[Any]) -> list[Any]:
    out: list[Any] = []
    for x in xs:
        if not any(_eq(x, y) for y in out):
            out.append(x)
    return out


def _slice(xs: list[Any], start: int, end: int) -> list[Any]:
    if not 0 <= start <= end <= len(xs):
        _fail(f"slice out of range: {start}, {end}")
    return xs[start:end]


def _sorted(xs: list[Any]) -> list[Any]:
    return sorted(xs)


def _reverse(x: Any) -> Any:
    if isinstance(x, str):  # ext.Strings v3's; kube-scheduler 1.36 has v2 (lists only)
        _fail("no such overload: reverse(string)")
    return x[::-1]


def _is_sorted(xs: list[Any]) -> bool:
    return all(xs[i] <= xs[i + 1] for i in range(len(xs) - 1))


def _sum(xs: list[Any]) -> Any:
    return sum(xs) if xs else 0


def _min(xs: list[Any]) -> Any:
    return min(xs) if xs else _fail("min called on an empty list")


def _max(xs: list[Any]) -> Any:
    return max(xs) if xs else _fail("max called on an empty list")


def _find(s: str, pattern: str) -> str:
    m = re.search(pattern, s)
    return m.group(0) if m else ""


def _find_all(s: str, pattern: str, *n: int) -> list[str]:
    found = [m.group(0) for m in re.finditer(pattern, s)]
    return found[: n[0]] if n and n[0] >= 0 else found


def _sets_contains(a: list[Any], b: list[Any]) -> bool:
    return all(any(_eq(x, y) for y in a) for x in b)


def _sets_equivalent(a: list[Any], b: list[Any]) -> bool:
    return _sets_contains(a, b) and _sets_contains(b, a)


def _sets_intersects(a: list[Any], b: list[Any]) -> bool:
    return any(any(_eq(x, y) for y in a) for x in b)


def _bool(x: Any) -> bool:
    if isinstance(x, bool):
        return x
    if x in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if x in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    return bool(_fail(f"type conversion error from string to bool: {x!r}"))


def _range(n: int) -> list[int]:
    return list(range(n))


def _keys(r: Any) -> list[Any]:
    """The iteration keys of a two-variable comprehension (``config.dra_cel_syntax``)."""
    if isinstance(r, dict):
        return list(r)
    if isinstance(r, list):
        return list(range(len(r)))
    return list(
        _fail(f"expression of type {type(r).__name__!r} cannot be range of a comprehension")
    )


def _insert(out: dict[Any, Any], key: Any, value: Any) -> None:
    if any(_eq(key, k) for k in out):
        _fail(f"insert failed: key {key} already exists")
    out[key] = value


def _pairs_map(pairs: list[list[Any]]) -> dict[Any, Any]:
    out: dict[Any, Any] = {}
    for key, value in pairs:
        _insert(out, key, value)
    return out


def _entries_map(entries: list[Any]) -> dict[Any, Any]:
    out: dict[Any, Any] = {}
    for entry in entries:
        if not isinstance(entry, dict):
            _fail("transformMapEntry() expects a map literal as its transform")
        for key, value in entry.items():
            _insert(out, key, value)
    return out


def _sort_by(xs: list[Any], keys: list[Any]) -> list[Any]:
    kinds = {type(k) for k in keys}
    if len(kinds) > 1:
        _fail("list elements must have the same type")
    order = sorted(range(len(xs)), key=lambda i: keys[i])
    return [xs[i] for i in order]


def _opt() -> Any:
    return dra_cel_crate.load().OptionalValue  # the crate's optional type, loaded late


def _opt_select(x: Any, name: str) -> Any:
    opt = _opt()
    if isinstance(x, opt):
        if not x.has_value():
            return x
        x = x.value()
    if not isinstance(x, dict):
        return _fail(f"no such field {name!r}")
    return opt.of(x[name]) if name in x else opt.none()


def _opt_index(x: Any, key: Any) -> Any:
    opt = _opt()
    if isinstance(x, opt):
        if not x.has_value():
            return x
        x = x.value()
    if isinstance(x, list):
        if isinstance(key, bool) or not isinstance(key, int | float) or key != int(key):
            return _fail(f"unsupported index type {type(key).__name__!r} in list")
        return opt.of(x[int(key)]) if 0 <= key < len(x) else opt.none()
    if isinstance(x, dict):
        return next((opt.of(v) for k, v in x.items() if _eq(k, key)), opt.none())
    return _fail(f"type {type(x).__name__!r} does not support indexing")


def _opt_map(entries: list[list[Any]]) -> dict[Any, Any]:
    """A map literal with optional entries (``{?k: o}``): the entries whose value is set."""
    out: dict[Any, Any] = {}
    for key, value in entries:
        if value.has_value():
            _insert(out, key, value.value())
    return out


def _first(xs: list[Any]) -> Any:
    return _opt().of(xs[0]) if xs else _opt().none()


def _last(xs: list[Any]) -> Any:
    return _opt().of(xs[-1]) if xs else _opt().none()


def _unwrap_opt(xs: list[Any]) -> list[Any]:
    return [x.value() for x in xs if x.has_value()]


def _ip(x: Any) -> str:
    """``ip(string)``, and ``cidr.ip()`` (one name, two receivers)."""
    if isinstance(x, str) and x.startswith(CIDR):
        return ip_of_cidr(x)
    return str(NET["ip"](x))


def _size(x: Any) -> int:
    """CEL's ``size``: a string's code points (the crate counts UTF-8 bytes)."""
    if isinstance(x, str | bytes | list | dict):
        return len(x)
    return int(_fail(f"no such overload: size({type(x).__name__})"))


def _zone(name: str) -> datetime.tzinfo:
    m = re.fullmatch(r"([+-])(\d{2}):(\d{2})", name)
    if m:
        delta = datetime.timedelta(hours=int(m[2]), minutes=int(m[3]))
        return datetime.timezone(-delta if m[1] == "-" else delta)
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {name!r}") from None


def _ts_get(t: Any, getter: str, zone: str) -> int:
    """A timestamp getter in a time zone (CEL's ``getHours('America/New_York')``)."""
    if not isinstance(t, datetime.datetime):
        _fail(f"no such overload: {getter}({type(t).__name__}, string)")
    d = t.astimezone(_zone(zone))
    fields: dict[str, int] = {
        "getFullYear": d.year,
        "getMonth": d.month - 1,
        "getDate": d.day,
        "getDayOfMonth": d.day - 1,
        "getDayOfWeek": (d.weekday() + 1) % 7,
        "getDayOfYear": d.timetuple().tm_yday - 1,
        "getHours": d.hour,
        "getMinutes": d.minute,
        "getSeconds": d.second,
        "getMilliseconds": d.microsecond // 1000,
    }
    return fields[getter]


def _untag(s: str) -> str:
    for tag in (IP, CIDR):
        if s.startswith(tag):
            return s[len(tag) :]
    return s


EXTENSIONS: dict[str, Callable[..., Any]] = {
    "bool": _bool,  # the standard conversion, missing from the crate
    # ext.Strings v2 (reverse is also ext.Lists')
    "charAt": _char_at,
    "indexOf": _index_of,  # strings, and Kubernetes' lists library
    "lastIndexOf": _last_index_of,
    "lowerAscii": lambda s: "".join(c.lower() if c.isascii() else c for c in s),
    "upperAscii": lambda s: "".join(c.upper() if c.isascii() else c for c in s),
    "replace": _replace,
    "split": _split,
    "substring": _substring,
    "trim": lambda s: s.strip(),
    "join": lambda xs, sep="": sep.join(xs),
    "reverse": _reverse,
    # ext.Lists v3
    "slice": _slice,
    "flatten": _flatten,
    "distinct": _distinct,
    "sort": _sorted,
    # Kubernetes' lists and regex libraries
    "isSorted": _is_sorted,
    "sum": _sum,
    "min": _min,
    "max": _max,
    "find": _find,
    "findAll": _find_all,
    # helpers of config.dra_cel_syntax's rewrites (two-variable comprehensions, sortBy,
    # optionals, string of an IP/CIDR)
    "_keys": _keys,
    "_pairs_map": _pairs_map,
    "_entries_map": _entries_map,
    "_sort_by": _sort_by,
    "_opt_select": _opt_select,
    "_opt_index": _opt_index,
    "_opt_map": _opt_map,
    "_untag": _untag,
    "_size": _size,
    "_ts_get": _ts_get,
    # cel-go optional types v2
    "first": _first,
    "last": _last,
    "unwrapOpt": _unwrap_opt,
    # Kubernetes' IP, CIDR, URL libraries and ext.Strings' format (config.dra_cel_net)
    **NET,
    "ip": _ip,
    "validate": validate,  # Kubernetes' format library (config.dra_cel_format)
}

# ``namespace.function`` -> the name registered for it.
NAMESPACED: dict[str, tuple[str, Callable[..., Any]]] = {
    "sets.contains": ("sets_contains", _sets_contains),
    "sets.equivalent": ("sets_equivalent", _sets_equivalent),
    "sets.intersects": ("sets_intersects", _sets_intersects),
    "strings.quote": ("strings_quote", _quote),
    "lists.range": ("lists_range", _range),
    "ip.isCanonical": ("ip_isCanonical", ip_is_canonical),
    "optional.unwrap": ("optional_unwrap", _unwrap_opt),
    **NAMESPACED_FORMATS,
}

# What the ``cel`` crate itself provides and kallot has checked against upstream (the CEL
# standard library's functions and macros, timestamps and durations).
BUILTIN = frozenset(
    {
        "size", "contains", "startsWith", "endsWith", "matches", "int", "uint", "double",
        "string", "bytes", "timestamp", "duration", "type", "dyn", "has", "all", "exists",
        "exists_one", "map", "filter", "getFullYear", "getMonth", "getDate", "getDayOfMonth",
        "getDayOfWeek", "getDayOfYear", "getHours", "getMinutes", "getSeconds",
        "getMilliseconds", "of", "none", "hasValue", "value", "orValue", "or",
        "ofNonZeroValue",
    }
)  # fmt: skip
