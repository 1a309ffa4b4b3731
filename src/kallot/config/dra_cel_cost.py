"""Runtime cost of kallot's own CEL library functions, counted as upstream counts them.

Where it sits: between ``config.dra_cel`` (which registers every library function through
``metered`` and calls ``reset`` before each evaluation) and the functions of
``config.dra_cel_lib`` / ``dra_cel_net`` / ``dra_cel_format``. Upstream evaluates a DRA selector
with a runtime cost limit of 1,000,000 (``CELSelectorExpressionMaxCost``) and charges library
calls by k8s.io/apiserver/pkg/cel/library/cost.go (``CallCost``) and cel-go's ext.Lists v3
trackers: string functions by length x 0.1, regexes by string x pattern, list builders by their
output, the rest 1. Each call here adds the same charge to a per-thread counter; past the limit
the call fails with upstream's words (``operation cancelled: actual cost limit exceeded``), so
``lists.range(2000000)`` is refused as upstream refuses it. The crate's own operators and
macros are not counted here: the compile-time estimate and the CPU budget bound them
(``config.dra_cel``).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any

LIMIT = 1_000_000  # resource.k8s.io CELSelectorExpressionMaxCost
STRING = 0.1  # cel-go common.StringTraversalCostFactor
REGEX = 0.25  # cel-go common.RegexStringLengthCostFactor
# format.<name>'s MaxRegexSize (k8s.io/apiserver/pkg/cel/library/format.go)
FORMAT_REGEX = {
    "dns1123Label": 30, "dns1123Subdomain": 60, "dns1035Label": 30, "qualifiedName": 60,
    "dns1123LabelPrefix": 30, "dns1123SubdomainPrefix": 60, "dns1035LabelPrefix": 30,
    "labelValue": 40, "uri": 1103, "uuid": 70, "byte": 84, "date": 76, "datetime": 76,
}  # fmt: skip

_local = threading.local()


def reset() -> None:
    _local.spent = 0


def _size(x: Any) -> int:
    if isinstance(x, str):
        if x.startswith("\x00ip:") or x.startswith("\x00cidr:"):
            return 16 if ":" in x.split(":", 1)[1] else 4
        return len(x)
    if isinstance(x, list | dict | bytes):
        return len(x)
    return 1


def _traversal(x: Any) -> int:
    if isinstance(x, str | bytes):
        return int(len(x) * STRING)
    if isinstance(x, list):
        return sum(_traversal(v) for v in x)
    if isinstance(x, dict):
        return sum(_traversal(k) + _traversal(v) for k, v in x.items())
    return 1


def _up(x: float) -> int:
    return math.ceil(x)


def _sort_cost(n: int) -> int:
    return n * max(1, _up(math.log2(n))) if n > 1 else 1


_STRING1 = {
    "url", "lowerAscii", "upperAscii", "substring", "trim", "cidr", "isIP", "isCIDR",
    "quantity", "isQuantity", "semver", "isSemver",
}  # fmt: skip


def call_cost(name: str, args: tuple[Any, ...], result: Any) -> int:
    """What upstream charges for one call of ``name`` (``CallCost``; 1 when it has no rule)."""
    a0 = args[0] if args else None
    if name in {"isSorted", "sum", "max", "min", "indexOf", "lastIndexOf"}:
        return _traversal(a0)
    if name in _STRING1 or (name == "ip" and isinstance(a0, str) and not a0.startswith("\x00")):
        return _up(_size(a0) * STRING)
    if name in {"replace", "split", "ip_isCanonical"}:
        return _up(_size(a0) * 2 * STRING)
    if name == "join":
        return _up(_size(result) * 2 * STRING)
    if name in {"find", "findAll"} and len(args) >= 2:
        return _up((1 + _size(a0)) * STRING) * _up(_size(args[1]) * REGEX)
    if name in {"containsIP", "containsCIDR"} and len(args) >= 2:
        cost = _up(2 * _size(a0) * STRING)
        if name == "containsCIDR":
            cost += _up(_size(a0) * STRING) + 1
        if isinstance(args[1], str) and not args[1].startswith("\x00"):
            cost += _up(_size(args[1]) * STRING)
        return cost
    if name == "validate" and len(args) >= 2 and isinstance(a0, str):
        regex = FORMAT_REGEX.get(a0.rpartition(":")[2], 60)
        return _up((1 + _size(args[1])) * STRING) * _up(regex * REGEX)
    if name in {"slice", "lists_range", "reverse", "flatten"}:
        return max(1, _size(result))
    if name == "distinct":
        return max(1, _size(a0) * _size(a0))
    if name in {"sort", "_sort_by"}:
        return _sort_cost(_size(a0))
    return 1


def metered(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` charging ``call_cost`` to this thread's evaluation, failing past ``LIMIT``."""

    def call(*args: Any) -> Any:
        if name == "lists_range" and args and isinstance(args[0], int) and args[0] > LIMIT:
            raise ValueError("operation cancelled: actual cost limit exceeded")  # before building
        result = fn(*args)
        spent = getattr(_local, "spent", 0) + call_cost(name, args, result)
        _local.spent = spent
        if spent > LIMIT:
            raise ValueError("operation cancelled: actual cost limit exceeded")
        return result

    return call
