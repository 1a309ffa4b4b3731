"""A minimal client of the Prometheus HTTP API (``/api/v1/query_range``, ``/api/v1/label/
__name__/values``): what the reports need, on the standard library, so it works against any
Prometheus-compatible server (Prometheus, Thanos, Mimir, VictoriaMetrics).

Errors are ``PromError`` with one line naming the URL and what went wrong: unreachable, an
HTTP error, a response that is not the API's JSON, or a query the server rejected.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from kallot.core.errors import KallotError

F64 = NDArray[np.float64]

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h|d|w)$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


class PromError(KallotError):
    """Prometheus could not answer: the message is one line for the user."""


def parse_duration(text: str, field: str = "--since") -> float:
    """'90s', '15m', '6h', '7d', '2w' -> seconds."""
    m = _DURATION.match(text.strip())
    if m is None or float(m.group(1)) <= 0:
        raise PromError(f"{field}: got {text!r}, expected a duration such as 30m, 6h, 7d or 2w")
    return float(m.group(1)) * _UNIT_S[m.group(2)]


@dataclass(frozen=True, slots=True)
class Series:
    """One series of a range query: its labels (without ``__name__``), times and values."""

    labels: dict[str, str]
    t: F64
    v: F64


class Prometheus:
    def __init__(self, url: str, *, timeout_s: float = 30.0) -> None:
        parts = urllib.parse.urlparse(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise PromError(f"--prometheus: got {url!r}, expected an http(s)://host:port URL")
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    def _get(self, path: str, params: dict[str, str]) -> Any:
        url = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=self.timeout_s) as resp:
                body = resp.read()
        except urllib.error.HTTPError as exc:
            detail = _error_of(exc.read())
            raise PromError(
                f"Prometheus at {self.url}: HTTP {exc.code} {detail}".rstrip()
            ) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise PromError(f"Prometheus at {self.url} is unreachable: {reason}") from None
        try:
            data = json.loads(body)
        except ValueError:
            raise PromError(
                f"Prometheus at {self.url}: {path} did not answer with the API's JSON"
            ) from None
        if not isinstance(data, dict) or data.get("status") != "success":
            raise PromError(f"Prometheus at {self.url}: {_error_of(body)}")
        return data.get("data")

    def metric_names(self) -> set[str]:
        data = self._get("/api/v1/label/__name__/values", {})
        return {str(x) for x in data or ()}

    def query_range(self, query: str, start: float, end: float, step: float) -> list[Series]:
        data = self._get(
            "/api/v1/query_range",
            {"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"},
        )
        out = []
        for r in (data or {}).get("result", ()):
            values = r.get("values", ())
            t = np.array([float(x[0]) for x in values])
            v = np.array([float(x[1]) for x in values])
            labels = {k: str(x) for k, x in r.get("metric", {}).items() if k != "__name__"}
            out.append(Series(labels, t, v))
        return out


def _error_of(body: bytes) -> str:
    try:
        data = json.loads(body)
        return f"{data.get('errorType', 'error')}: {data.get('error', '')}"
    except ValueError:
        return body[:120].decode(errors="replace").replace("\n", " ")
