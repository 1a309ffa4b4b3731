"""``JsonClient``: JSON requests to one API server, retried per a ``RetryPolicy``; the base of
the scheduler's ``kube.api.client.KubeClient`` (lists, watches, binds on top) and the node agent's
``node.k8s.NodeClient`` (one try per request).

Retries live here and nowhere else: an answer of 429 or 5xx is retried with exponential
back-off and jitter, honouring ``Retry-After``; a read that got no answer is retried too. A
write that got no answer is not (its outcome is unknown: the caller reads the object to settle
it). What still fails after the retries raises ``k8sclient.errors.ApiError``.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kallot.k8sclient import api as k8s
from kallot.k8sclient.errors import ApiError, error_from_body


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Retries of answers that say "try again" (429, 5xx) and of reads without an answer."""

    attempts: int = 4  # tries in all, the first included
    base_s: float = 0.2  # back-off before the second try; doubles each time
    max_s: float = 5.0
    retry_after_max_s: float = 10.0  # a server's Retry-After is honoured up to this

    def delay(self, attempt: int, retry_after: str | None = None) -> float:
        """Seconds to wait before try ``attempt + 1`` (``attempt`` counts from 0)."""
        if retry_after:
            try:
                return min(self.retry_after_max_s, max(0.0, float(retry_after)))
            except ValueError:
                pass  # an HTTP date: fall back to our own back-off
        full = min(self.max_s, self.base_s * 2.0**attempt)
        return full * (0.5 + random.random() / 2)  # jitter: many clients do not retry in step


RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
NO_RETRY = RetryPolicy(attempts=1)


class JsonClient:
    """Asynchronous JSON requests to one API server (objects stay plain dicts); close it."""

    def __init__(
        self, api: k8s.ApiClient, *, user_agent: str, retry: RetryPolicy | None = None
    ) -> None:
        self._api = api
        self._api.user_agent = user_agent
        self.retry = retry or RetryPolicy()
        #: retries done, by HTTP status (0: no answer)
        self.retries: dict[int, int] = {}
        #: requests made (retries not counted; tests check "only on change")
        self.requests = 0

    async def close(self) -> None:
        await k8s.close(self._api)

    @property
    def server(self) -> str:
        return str(self._api.configuration.host)

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, str]] = (),
        body: Any = None,
        content_type: str = k8s.JSON,
        timeout: float = 30.0,
    ) -> dict[str, Any]:
        """One request, retried per ``retry``; returns the decoded JSON answer or raises
        :class:`ApiError`."""
        self.requests += 1
        attempt = 0
        while True:
            retry_after: str | None = None
            try:
                resp = await k8s.send(
                    self._api,
                    method,
                    path,
                    query=query,
                    body=body,
                    content_type=content_type,
                    timeout=timeout,
                )
                raw = await k8s.read(method, path, resp)
                if 200 <= resp.status < 300:
                    result: dict[str, Any] = json.loads(raw) if raw else {}
                    return result
                error = error_from_body(method, path, resp.status, raw)
                retry_after = resp.getheader("Retry-After")
            except ApiError as exc:
                error = exc
            again = error.status in RETRY_STATUSES or (error.status == 0 and method == "GET")
            if not again or attempt + 1 >= self.retry.attempts:
                raise error
            self.retries[error.status] = self.retries.get(error.status, 0) + 1
            await asyncio.sleep(self.retry.delay(attempt, retry_after))
            attempt += 1
