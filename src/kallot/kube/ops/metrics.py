"""Prometheus metrics and the ``/metrics``, ``/healthz``, ``/readyz`` endpoints.

Counters and histograms are updated by the controller and binder as things happen; gauges that
describe the cache (pending pods by reason, GPU allocation by node/model/queue) are computed
when Prometheus scrapes, from the cache itself, so they can never drift from it. The server is
a minimal HTTP/1.1 responder on asyncio (three paths, GET only), which avoids a web framework.

Two listeners, as kube-scheduler has: the secure port (``--secure-address``, 10259 by default)
speaks TLS (``config.tls``) and answers ``/metrics`` only to a bearer token the cluster's RBAC
lets ``get /metrics`` (``k8sclient.delegated``), the probes to anyone; the plain-HTTP port
(``--metrics-address``) is off unless asked for, since the metrics name every queue and node.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable, Iterator
from http import HTTPStatus

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from kallot.core.errors import ConfigError
from kallot.k8sclient.delegated import DelegatedAuth, Verdict
from kallot.kube.state.cache import Cache

logger = logging.getLogger(__name__)

_LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
)  # fmt: skip


class _CacheCollector(Collector):
    def __init__(self, cache: Callable[[], Cache | None]) -> None:
        self._cache = cache

    def collect(self) -> Iterator[GaugeMetricFamily]:
        cache = self._cache()
        pending = GaugeMetricFamily(
            "kallot_pending_pods",
            "Pods with schedulerName kallot waiting to be bound, by why they wait",
            labels=["reason"],
        )
        alloc = GaugeMetricFamily(
            "kallot_gpu_allocated_milli",
            "milli-GPU held by bound or assumed pods (1000 = one GPU)",
            labels=["node", "model", "queue"],
        )
        nodes = GaugeMetricFamily("kallot_nodes", "Nodes in the scheduler's cache")
        if cache is not None:
            for reason, count in sorted(cache.pending_by_reason().items()):
                pending.add_metric([reason], count)
            for (node, model, queue), milli in sorted(cache.gpu_allocation().items()):
                alloc.add_metric([node, model, queue], milli)
            nodes.add_metric([], len(cache.node_names()))
        yield pending
        yield alloc
        yield nodes


class Metrics:
    """The scheduler's metrics, in their own registry."""

    def __init__(self, cache: Callable[[], Cache | None] = lambda: None) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.attempts = Counter(
            "kallot_scheduling_attempts",
            "Pods tried by a session, by result (scheduled, unschedulable, invalid, bind_failed)",
            ["result"],
            registry=r,
        )
        self.pod_latency = Histogram(
            "kallot_pod_scheduling_duration_seconds",
            "From the scheduler first seeing a pod pending to its successful bind",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.session_duration = Histogram(
            "kallot_session_duration_seconds",
            "Wall time of one scheduling session (snapshot, core, assume)",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.bind_duration = Histogram(
            "kallot_binding_duration_seconds",
            "Wall time of one pods/binding request",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.session_pods = Histogram(
            "kallot_session_pods",
            "Pending pods handed to one session",
            buckets=(1, 10, 50, 100, 250, 500, 1000, 2500, 5000, 10000),
            registry=r,
        )
        self.evictions = Counter(
            "kallot_evictions",
            "Pods evicted so that others fit, by action (reclaim, preempt)",
            ["action"],
            registry=r,
        )
        self.session_failures = Counter(
            "kallot_session_failures",
            "Scheduling sessions that raised (no pod was decided by them)",
            registry=r,
        )
        self.task_faults = Counter(
            "kallot_task_faults",
            "Pods or gangs a session could not decide because kallot's code raised for them "
            "(the pod gets a SchedulerError Event and is retried with backoff)",
            registry=r,
        )
        self.mig_relayouts = Counter(
            "kallot_mig_relayouts",
            "Live MIG re-layouts by outcome: planned (kallot.io/mig-plan written), advertised "
            "(the node published the layout), abandoned (refused, failed or timed out)",
            ["outcome"],
            registry=r,
        )
        self.leader = Gauge("kallot_leader", "1 while this replica is the leader", registry=r)
        self.dropped_writes = Counter(
            "kallot_dropped_event_writes",
            "Events or conditions not written because the queue was full",
            registry=r,
        )
        r.register(_CacheCollector(cache))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class HealthServer:
    """Serves ``/metrics``, ``/healthz`` (the loop answers) and ``/readyz`` (caches synced);
    over TLS with ``tls``, and ``/metrics`` only to callers ``auth`` allows."""

    def __init__(
        self,
        metrics: Metrics,
        *,
        host: str,
        port: int,
        ready: Callable[[], bool],
        healthy: Callable[[], bool] = lambda: True,
        tls: ssl.SSLContext | None = None,
        auth: DelegatedAuth | None = None,
        flag: str = "--metrics-address",
    ) -> None:
        self.metrics = metrics
        self.host = host
        self.port = port
        self.ready = ready
        self.healthy = healthy
        self.tls = tls
        self.auth = auth
        self.flag = flag
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        try:
            self._server = await asyncio.start_server(
                self._handle,
                self.host,
                self.port,
                ssl=self.tls,
                ssl_handshake_timeout=5.0 if self.tls is not None else None,
            )
        except OSError as exc:  # in use, or not a local address: bad input, said in one line
            raise ConfigError(
                self.flag,
                f"{self.host}:{self.port}",
                f"a free local address ({exc.strerror or exc})",
            ) from None
        sock = self._server.sockets[0].getsockname()
        self.port = int(sock[1])
        logger.info(
            "serving metrics and health address=%s:%d tls=%s authn=%s",
            self.host,
            self.port,
            self.tls is not None,
            "delegated" if self.auth is not None else "none",
        )

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), 5.0)
            authorization: str | None = None
            for _ in range(100):  # read the headers (at most 100: a client cannot hold us)
                header = await asyncio.wait_for(reader.readline(), 5.0)
                if header in (b"\r\n", b"\n", b""):
                    break
                name, _, value = header.decode("latin-1").partition(":")
                if name.strip().lower() == "authorization":
                    authorization = value.strip()
            parts = line.decode("latin-1").split()
            method = parts[0] if parts else ""
            path = parts[1].split("?")[0] if len(parts) >= 2 else ""
            verdict = (
                await self.auth.check(authorization, path, method.lower())
                if self.auth is not None and method == "GET"
                else Verdict(200)
            )
            if verdict.allowed:
                status, body, ctype = self._answer(method, path)
            else:
                status, body, ctype = _refusal(verdict)
            head = (
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            writer.write(head.encode() + body)
            await writer.drain()
        except (TimeoutError, ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def _answer(self, method: str, path: str) -> tuple[str, bytes, str]:
        text = "text/plain; charset=utf-8"
        if method != "GET":
            return "405 Method Not Allowed", b"GET only\n", text
        if path == "/metrics":
            return "200 OK", self.metrics.render(), "text/plain; version=0.0.4; charset=utf-8"
        if path in ("/healthz", "/livez"):
            ok = self.healthy()
            return (
                ("200 OK", b"ok\n", text)
                if ok
                else ("503 Service Unavailable", b"unhealthy\n", text)
            )
        if path == "/readyz":
            ok = self.ready()
            return (
                ("200 OK", b"ok\n", text)
                if ok
                else ("503 Service Unavailable", b"not ready\n", text)
            )
        return "404 Not Found", b"not found\n", text


def _refusal(verdict: Verdict) -> tuple[str, bytes, str]:
    status = f"{verdict.status} {HTTPStatus(verdict.status).phrase}"
    return status, (verdict.reason + "\n").encode(), "text/plain; charset=utf-8"
