"""Delegated authentication and authorization of a secure port, as kube-scheduler does it.

Where it sits: between a request to the scheduler's secure port (``kube.ops.metrics``) or the node
agent's exporter (``node.exporter``) and its answer. The caller's bearer token is sent to the
API server as a TokenReview (who is this?), then the user it names as a SubjectAccessReview
for the request's non-resource path and verb (may they ``get /metrics``?), so the cluster's
own RBAC decides: bind the ClusterRole the chart ships (``<release>-metrics-reader``) to
Prometheus's service account, exactly as for kube-scheduler's ``/metrics``.

Answers are cached for ``ttl_s`` seconds (kube-scheduler's defaults: 10 s for tokens, 10 s for
allowed and denied decisions), in bounded LRU maps keyed by a token's SHA-256, never the token.
A review the API server cannot answer is a 503 for that request and is not cached.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from kallot.k8sclient.client import JsonClient
from kallot.k8sclient.errors import ApiError

ALWAYS_ALLOW_PATHS = frozenset({"/healthz", "/readyz", "/livez"})  # kube-scheduler's default

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class Verdict:
    """An HTTP status for the request (200, 401, 403 or 503) and why, for the body."""

    status: int
    reason: str = ""

    @property
    def allowed(self) -> bool:
        return self.status == 200


@dataclass(frozen=True, slots=True)
class User:
    name: str
    uid: str
    groups: tuple[str, ...]
    extra: tuple[tuple[str, tuple[str, ...]], ...]


class _TtlCache(Generic[K, V]):
    """At most ``size`` entries, each for ``ttl_s`` seconds; least recently used go first."""

    def __init__(self, ttl_s: float, size: int, clock: Callable[[], float]) -> None:
        self.ttl_s, self.size, self.clock = ttl_s, size, clock
        self._data: OrderedDict[K, tuple[float, V]] = OrderedDict()

    def get(self, key: K) -> V | None:
        hit = self._data.get(key)
        if hit is None:
            return None
        if hit[0] < self.clock():
            del self._data[key]
            return None
        self._data.move_to_end(key)
        return hit[1]

    def put(self, key: K, value: V) -> None:
        self._data[key] = (self.clock() + self.ttl_s, value)
        self._data.move_to_end(key)
        while len(self._data) > self.size:
            self._data.popitem(last=False)

    def __len__(self) -> int:
        return len(self._data)


class DelegatedAuth:
    """Decides a request by bearer token through the API server's TokenReview and
    SubjectAccessReview. ``always_allow`` paths (the probes) need no token."""

    def __init__(
        self,
        client: JsonClient,
        *,
        always_allow: frozenset[str] = ALWAYS_ALLOW_PATHS,
        ttl_s: float = 10.0,
        size: int = 1024,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.always_allow = always_allow
        # token digest -> the user it names, or the 401 it got
        self._users: _TtlCache[str, User | Verdict] = _TtlCache(ttl_s, size, clock)
        self._decisions: _TtlCache[tuple[User, str, str], Verdict] = _TtlCache(ttl_s, size, clock)
        #: reviews sent to the API server (tests check that the caches work)
        self.reviews = 0

    async def check(self, authorization: str | None, path: str, verb: str = "get") -> Verdict:
        """The verdict for a request to ``path`` carrying this ``Authorization`` header."""
        if path in self.always_allow:
            return Verdict(200)
        scheme, _, token = (authorization or "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return Verdict(401, "Unauthorized: a bearer token is required")
        key = hashlib.sha256(token.encode()).hexdigest()
        user = self._users.get(key)
        if user is None:
            try:
                user = await self._token_review(token)
            except ApiError as exc:
                return Verdict(503, f"authentication is unavailable: {exc}")
            self._users.put(key, user)
        if isinstance(user, Verdict):
            return user
        decision = self._decisions.get((user, path, verb))
        if decision is None:
            try:
                decision = await self._access_review(user, path, verb)
            except ApiError as exc:
                return Verdict(503, f"authorization is unavailable: {exc}")
            self._decisions.put((user, path, verb), decision)
        return decision

    async def _token_review(self, token: str) -> User | Verdict:
        self.reviews += 1
        answer = await self.client.request(
            "POST",
            "/apis/authentication.k8s.io/v1/tokenreviews",
            body={
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenReview",
                "spec": {"token": token},
            },
        )
        status: dict[str, Any] = answer.get("status") or {}
        if not status.get("authenticated"):
            why = status.get("error") or "not accepted by the API server"
            return Verdict(401, f"Unauthorized: the bearer token was refused ({why})")
        u: dict[str, Any] = status.get("user") or {}
        extra = u.get("extra") or {}
        return User(
            name=str(u.get("username", "")),
            uid=str(u.get("uid", "")),
            groups=tuple(str(g) for g in u.get("groups") or ()),
            extra=tuple(sorted((str(k), tuple(str(x) for x in v)) for k, v in extra.items())),
        )

    async def _access_review(self, user: User, path: str, verb: str) -> Verdict:
        self.reviews += 1
        answer = await self.client.request(
            "POST",
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            body={
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": {
                    "user": user.name,
                    "uid": user.uid,
                    "groups": list(user.groups),
                    "extra": {k: list(v) for k, v in user.extra},
                    "nonResourceAttributes": {"path": path, "verb": verb},
                },
            },
        )
        status: dict[str, Any] = answer.get("status") or {}
        if status.get("allowed") and not status.get("denied"):
            return Verdict(200)
        why = status.get("reason") or "no RBAC rule allows it"
        return Verdict(403, f'Forbidden: user "{user.name}" may not {verb} {path} ({why})')
