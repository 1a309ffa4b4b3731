"""Kubernetes quantities ('500m', '16Gi', '1e3'), durations ('1h30m') and RFC 3339 times, read
into exact numbers for the kube shell's translation (``kube.translate``).

Bottom of the translation flow: the pod, node and queue translators (and ``kube.translate.models``,
``kube.state.volumes``) parse every quantity through ``parse_quantity``, which names the field on
bad input. Kallot keeps its own parser rather than the client's
``kubernetes.utils.parse_quantity``: that one accepts what the API server rejects ('1K', 'NaN',
'Infinity'), and importing it loads the whole ``kubernetes`` package, which the scheduler
otherwise imports only when it first talks to the API server (start-up time). A test checks
that both give the same value on every quantity kallot accepts.
"""

from __future__ import annotations

import datetime as dt
import functools
import re
from decimal import Decimal, InvalidOperation

from kallot.core.errors import ConfigError

# -- quantities ------------------------------------------------------------------------------

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
}
_QUANTITY = re.compile(
    r"^(?P<num>[+-]?(?:\d+\.?\d*|\.\d+))(?:(?P<exp>[eE][+-]?\d+)|(?P<suf>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?$"
)
MIB = 2**20


def parse_quantity(text: object, field_name: str) -> Decimal:
    """A Kubernetes quantity ('500m', '16Gi', '1e3', 2) as a Decimal; ConfigError if malformed."""
    value = _quantity(str(text).strip())
    if value is None:
        raise ConfigError(field_name, text, "a Kubernetes quantity such as 2, 500m or 16Gi")
    return value


@functools.lru_cache(maxsize=4096)
def _quantity(raw: str) -> Decimal | None:
    # Cached: a cluster's pods repeat a handful of quantities ('1', '100m', '128Mi') thousands
    # of times, and every pod is read at start-up (Decimal is immutable, so sharing is safe).
    m = _QUANTITY.match(raw)
    if m is None:
        return None
    try:
        value = Decimal(m.group("num"))
    except InvalidOperation:  # pragma: no cover - the regex admits only numbers
        return None
    if m.group("exp"):
        value *= Decimal(10) ** int(m.group("exp")[1:])
    suffix = m.group("suf") or ""
    value *= _BINARY.get(suffix) or _DECIMAL[suffix]
    return value


def ceil_int(value: Decimal) -> int:
    return int(value.to_integral_value(rounding="ROUND_CEILING"))


def cpu_milli(text: object, field_name: str) -> int:
    return ceil_int(parse_quantity(text, field_name) * 1000)


def mem_mib(text: object, field_name: str) -> int:
    return ceil_int(parse_quantity(text, field_name) / MIB)


def parse_duration(text: str, field_name: str, *, at_most: float | None = None) -> float:
    """'90s', '15m', '1h30m', '2h' or plain seconds ('600') as seconds.

    Only plain decimal digits are read: ``inf``, ``nan``, exponents and signs are refused,
    since a tenant's annotation must not buy unbounded protection (docs/security.md).
    ``at_most``: the largest duration accepted (seconds)."""
    raw = text.strip()
    expected = "a duration such as 90s, 15m or 1h30m"
    if at_most is not None:
        expected += f", at most {_seconds_text(at_most)}"
    if not raw:
        return 0.0
    if re.fullmatch(r"\d{1,9}(?:\.\d{1,9})?", raw):
        value = float(raw)
    else:
        parts = re.findall(r"(\d{1,9}(?:\.\d{1,9})?)(h|m|s)", raw)
        if not parts or "".join(n + u for n, u in parts) != raw:
            raise ConfigError(field_name, text, expected)
        scale = {"h": 3600.0, "m": 60.0, "s": 1.0}
        value = sum(float(n) * scale[u] for n, u in parts)
    if at_most is not None and value > at_most:
        raise ConfigError(field_name, text, expected)
    return value


def _seconds_text(seconds: float) -> str:
    """``86400`` -> ``24h``, ``90`` -> ``90s``: a cap as the user writes durations."""
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{int(seconds // 3600)}h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{int(seconds // 60)}m"
    return f"{seconds:g}s"


def parse_time(text: object) -> float:
    """RFC 3339 time ('2026-12-03T08:30:00Z') as unix seconds; 0.0 when absent."""
    if not text:
        return 0.0
    return dt.datetime.fromisoformat(str(text).replace("Z", "+00:00")).timestamp()
