"""API faults for tests of the live scheduler: a loopback HTTP proxy in front of the real
kube-apiserver that answers some requests with errors, delays others, and cuts watches.

Where it sits: test support next to ``kallot.testing.live`` (the scheduler subprocess and the
audit helpers). The scheduler talks to the proxy through a kubeconfig that names it
(``FaultProxy.kubeconfig``); the proxy forwards every request to the API server over TLS with
the caller's own token, so authentication and RBAC are the real ones. Faults follow a seeded
``random.Random`` and can be switched off (``enabled``) to let the cluster settle.

The fault mix (``FaultMix``), after the scenario of issue 27:
- ``error_rate`` of the requests are answered 500, 503 or 429; half of the 500/503s on writes
  are sent on to the API server first and their answer thrown away (a lost response: the write
  happened, the client is told it failed); a 429 carries ``Retry-After``;
- ``conflict_rate`` of the writes (POST, PUT, PATCH, DELETE) are answered 409 without being sent;
- ``delay_rate`` of the requests wait ``delay_s`` before being sent;
- every watch is cut after ``watch_cut_s`` seconds, half by a clean end of the stream, half by
  aborting the connection mid-stream.

``FaultProxy.counts`` says what was injected, by kind. Apart from the mix, ``hold_watches``
holds back the events of some watches (a lagging informer, on demand) until
``release_watches``, whether faults are enabled or not.

Long module: the proxy and the churn run that drives it (``churn``, its report and audits) are
one fixture: the run switches faults on and off and reads what the proxy injected.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import random
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp import web

from kallot.config import wire

__all__ = ["FaultMix", "FaultProxy"]

WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# Hop-by-hop headers, and those the proxy recomputes.
_SKIP_HEADERS = frozenset(
    {
        "host",
        "connection",
        "keep-alive",
        "transfer-encoding",
        "content-length",
        "content-encoding",
        "upgrade",
        "proxy-connection",
    }
)


@dataclass(frozen=True, slots=True)
class FaultMix:
    """What the proxy injects (see the module docstring)."""

    error_rate: float = 0.05
    applied_fraction: float = 0.5  # of the 500/503s on writes: sent first, answer lost
    conflict_rate: float = 0.05
    delay_rate: float = 0.10
    delay_s: tuple[float, float] = (0.02, 0.5)
    watch_cut_s: tuple[float, float] = (10.0, 30.0)
    abort_fraction: float = 0.5  # of the watch cuts: abort the connection (else a clean end)


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


_REASONS = {
    500: "InternalError",
    503: "ServiceUnavailable",
    429: "TooManyRequests",
    409: "Conflict",
}


class FaultProxy:
    """A fault-injecting HTTP proxy on 127.0.0.1 in front of ``upstream`` (https), in a
    thread of its own. Use as a context manager, or ``start()`` / ``stop()``."""

    def __init__(
        self,
        upstream: str,
        ca_path: str | Path,
        *,
        seed: int = 0,
        mix: FaultMix | None = None,
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.ca_path = str(ca_path)
        self.mix = mix or FaultMix()
        self.rng = random.Random(seed)
        #: faults are injected only while this is True
        self.enabled = True
        #: injected faults by kind, e.g. "500-applied", "503", "429", "409", "delay",
        #: "watch-eof", "watch-abort"
        self.counts: collections.Counter[str] = collections.Counter()
        #: requests seen, by method
        self.requests: collections.Counter[str] = collections.Counter()
        #: (path, resourceVersion) of every watch request, in order
        self.watches: list[tuple[str, str]] = []
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._lock = threading.Lock()
        # Watch paths (substrings) whose events wait for ``_release`` (``hold_watches``).
        self._held: tuple[str, ...] = ()
        self._release: asyncio.Event | None = None
        #: events held back so far (a test waits for one: the watch did lag)
        self.held_events = 0

    # -- life cycle ----------------------------------------------------------------------------

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FaultProxy:
        started = threading.Event()
        self._loop = asyncio.new_event_loop()

        def run() -> None:
            assert self._loop is not None
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(self._start())
            started.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="fault-proxy", daemon=True)
        self._thread.start()
        if not started.wait(30):
            raise RuntimeError("the fault proxy did not start")
        return self

    def stop(self) -> None:
        if self._loop is None:
            return
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(30)
        self._loop.close()
        self._loop = None

    def hold_watches(self, fragment: str) -> None:
        """From now on, hold back the events of every watch whose path contains ``fragment``
        (open ones too) until ``release_watches``: the scheduler's view of those objects
        stops while the API server's goes on."""

        async def hold() -> None:
            assert self._release is not None
            self._held = (*self._held, fragment)
            self._release.clear()

        assert self._loop is not None
        asyncio.run_coroutine_threadsafe(hold(), self._loop).result(30)

    def release_watches(self) -> None:
        """Let held watch events through, in order."""

        async def release() -> None:
            assert self._release is not None
            self._held = ()
            self._release.set()

        assert self._loop is not None
        asyncio.run_coroutine_threadsafe(release(), self._loop).result(30)

    async def _start(self) -> None:
        self._release = asyncio.Event()
        self._release.set()
        ctx = ssl.create_default_context(cafile=self.ca_path)
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=ctx, limit=256),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            auto_decompress=False,
        )
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        # Open watches are cut at shutdown rather than waited for.
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = int(self._runner.addresses[0][1])

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()
        # Streams still open (watches of a scheduler that outlives the proxy) end here.
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in others:
            t.cancel()
        await asyncio.gather(*others, return_exceptions=True)

    def kubeconfig(self, source: str | Path, dest: str | Path) -> Path:
        """A copy of kubeconfig ``source`` whose server is this proxy, written to ``dest``."""
        config = yaml.safe_load(Path(source).read_text())
        for c in config.get("clusters") or []:
            c["cluster"]["server"] = self.url
        out = Path(dest)
        out.write_text(yaml.safe_dump(config, sort_keys=False))
        out.chmod(0o600)
        return out

    # -- faults --------------------------------------------------------------------------------

    def _draw(self, method: str, watch: bool) -> tuple[str, float, float]:
        """(fault, delay before sending, watch cut after) for one request."""
        with self._lock:
            self.requests[method] += 1
            if not self.enabled:
                return "", 0.0, 0.0
            m, r = self.mix, self.rng
            delay = r.uniform(*m.delay_s) if r.random() < m.delay_rate else 0.0
            cut = r.uniform(*m.watch_cut_s) if watch else 0.0
            fault = ""
            x = r.random()
            if x < m.error_rate:
                code = r.choice((500, 503, 429))
                applied = code != 429 and method in WRITES and r.random() < m.applied_fraction
                fault = f"{code}-applied" if applied else str(code)
            elif method in WRITES and x < m.error_rate + m.conflict_rate:
                fault = "409"
            if delay:
                self.counts["delay"] += 1
            if fault:
                self.counts[fault] += 1
            return fault, delay, cut

    def _count(self, kind: str) -> None:
        with self._lock:
            self.counts[kind] += 1

    # -- forwarding ----------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        watch = request.query.get("watch") in ("1", "true")
        if watch:
            self.watches.append((request.path, request.query.get("resourceVersion", "")))
        fault, delay, cut = self._draw(request.method, watch)
        if delay:
            await asyncio.sleep(delay)
        if fault and not fault.endswith("-applied"):
            return self._error(int(fault))
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _SKIP_HEADERS}
        assert self._session is not None
        url = self.upstream + request.rel_url.path_qs
        upstream = await self._session.request(
            request.method, url, headers=headers, data=body or None
        )
        try:
            if fault:  # applied, and the answer is lost
                await upstream.read()
                return self._error(int(fault.split("-")[0]))
            if watch and upstream.status == 200:
                return await self._stream(request, upstream, cut)
            data = await upstream.read()
            out = web.Response(status=upstream.status, body=data)
            for k, v in upstream.headers.items():
                if k.lower() not in _SKIP_HEADERS:
                    out.headers[k] = v
            return out
        finally:
            upstream.release()

    def _error(self, code: int) -> web.Response:
        reason = _REASONS[code]
        out = web.Response(
            status=code,
            body=json.dumps(_status(code, reason, f"injected by the fault proxy ({code})")),
            content_type="application/json",
        )
        if code == 429:
            out.headers["Retry-After"] = "1"
        return out

    async def _stream(
        self, request: web.Request, upstream: aiohttp.ClientResponse, cut: float
    ) -> web.StreamResponse:
        out = web.StreamResponse(status=200)
        out.content_type = upstream.headers.get("Content-Type", "application/json")
        await out.prepare(request)
        deadline = asyncio.get_running_loop().time() + cut if cut else None
        while True:
            timeout = None
            if deadline is not None:
                timeout = max(0.0, deadline - asyncio.get_running_loop().time())
            try:
                line = await asyncio.wait_for(upstream.content.readline(), timeout)
            except TimeoutError:
                break
            except aiohttp.ClientError:
                return out
            if not line:
                return out  # the API server ended the watch
            if self._held and any(f in request.path for f in self._held):
                with self._lock:
                    self.held_events += 1
                assert self._release is not None
                await self._release.wait()
            await out.write(line)
        # Cut (only while faults are on: a watch started before they were switched off is
        # cut too, which is what a real network would do).
        with self._lock:
            abort = self.rng.random() < self.mix.abort_fraction
        if abort:
            self._count("watch-abort")
            with contextlib.suppress(Exception):
                await out.write(b'{"type":"MODIFIED","object":{"metadata":')  # mid-event
            transport = request.transport
            if transport is not None:
                transport.abort()
            return out
        self._count("watch-eof")
        await out.write_eof()
        return out


# -- the churn scenario of issue 27 ------------------------------------------------------------

# Whole GPUs, shares and MIG instances, as a user would ask for them.
CHURN_MIX: tuple[dict[str, str], ...] = (
    {wire.RESOURCE_GPU: "1"},
    {wire.RESOURCE_GPU: "2"},
    {wire.RESOURCE_GPU_MILLI: "300", wire.RESOURCE_GPU_MEMORY: "20Gi"},
    {wire.RESOURCE_GPU_MILLI: "500", wire.RESOURCE_GPU_MEMORY: "30Gi"},
    {wire.RESOURCE_MIG_PREFIX + "3g.40gb": "1"},
    {wire.RESOURCE_MIG_PREFIX + "3g.40gb": "1"},
)


@dataclass
class ChurnReport:
    """What a fault churn run did and what the audit from the API found."""

    seed: int
    pods: int
    deleted: int
    seconds: float
    settle_s: float
    faults: dict[str, int]
    requests: dict[str, int]
    attempts: dict[str, float]  # the scheduler's attempts by result (bind_failed, ...)
    bound: int
    pending: int
    double_held: list[str]  # devices held beyond capacity (MIG instances by two pods, ...)
    bound_without_record: list[str]
    pending_without_reason: list[str]
    lost: list[str]
    cache_milli: float  # what the scheduler's cache charges (its metric) ...
    records_milli: int  # ... and what the bound pods' records say

    @property
    def clean(self) -> bool:
        return (
            not (
                self.double_held
                or self.bound_without_record
                or self.pending_without_reason
                or self.lost
            )
            and self.cache_milli == self.records_milli
        )

    def summary(self) -> str:
        faults = ", ".join(f"{k} {v}" for k, v in sorted(self.faults.items()))
        return (
            f"seed {self.seed}: {self.pods} pods ({self.deleted} deleted) in {self.seconds:.0f}s, "
            f"faults: {faults} (of {sum(self.requests.values())} requests); binds failed "
            f"{self.attempts.get('bind_failed', 0):.0f}; settled in "
            f"{self.settle_s:.1f}s: {self.bound} bound, {self.pending} pending; "
            f"devices held twice {len(self.double_held)}, bound without record "
            f"{len(self.bound_without_record)}, pending without reason "
            f"{len(self.pending_without_reason)}, lost {len(self.lost)}; cache "
            f"{self.cache_milli:.0f} milli-GPU vs records {self.records_milli}"
        )


def churn_nodes(run: str, nodes: int, gpus: int = 8) -> list[dict[str, Any]]:
    """``nodes`` GPU nodes, a third of them with half their GPUs split into two 3g.40gb MIG
    instances each."""
    from kallot.testing.live import inventory_node_body

    out = []
    for i in range(nodes):
        mig = (
            {g: [("3g.40gb", 0), ("3g.40gb", 4)] for g in range(gpus // 2)} if i % 3 == 0 else None
        )
        out.append(inventory_node_body(f"{run}-f{i}", gpus, mig=mig))
    return out


def fault_churn(
    cluster: Any,
    *,
    pods: int = 150,
    seconds: float = 60.0,
    nodes: int = 8,
    seed: int = 0,
    mix: FaultMix | None = None,
    delete_fraction: float = 0.35,
    settle_timeout: float = 180.0,
    scheduler_env: dict[str, str] | None = None,
) -> ChurnReport:
    """Churn of ``pods`` mixed pods (created over ``seconds``, about ``delete_fraction`` of
    them deleted once bound) on ``nodes`` nodes, with the scheduler talking to the API through
    a ``FaultProxy``; then faults off, the cluster settles (or ``settle_timeout`` passes), and
    the audit reads the API. ``scheduler_env`` is added to the scheduler's environment (e.g.
    a PYTHONPATH with another version of kallot, to compare).

    ``cluster`` is a ``kallot.testing.live.Cluster``."""
    import time

    from kallot.testing.live import SchedulerProcess, gpu_usage, overcommitted, wait_until

    rng = random.Random(seed)
    cluster.add_nodes(churn_nodes(cluster.run, nodes))
    cp = cluster.cp
    with FaultProxy(cp.server_url, cp.ca_path, seed=seed, mix=mix) as proxy:
        kubeconfig = proxy.kubeconfig(cp.kubeconfig_path, cluster.log_dir / "faulty.kubeconfig")
        s = SchedulerProcess(
            kubeconfig,
            cluster.log_dir / f"scheduler-faults-{seed}.log",
            identity=f"faults-{seed}",
            lease_name=cluster.lease,
            env=scheduler_env,
        )
        cluster.schedulers.append(s)
        s.wait_ready(timeout=60)
        names = [f"c{i:04d}" for i in range(pods)]
        deleted: set[str] = set()
        start = time.monotonic()
        for i, name in enumerate(names):
            cluster.create_pods([_churn_pod(name, rng.choice(CHURN_MIX))])
            if i % 10 == 9:
                s.check_alive()
                bound = [
                    p["metadata"]["name"]
                    for p in cluster.pods()
                    if p["spec"].get("nodeName") and p["metadata"]["name"] not in deleted
                ]
                for victim in rng.sample(bound, min(len(bound), round(10 * delete_fraction))):
                    cluster.delete_pod(victim)
                    deleted.add(victim)
            # Pacing of the load, not a synchronisation: pods arrive over `seconds`.
            pause = start + seconds * (i + 1) / pods - time.monotonic()
            if pause > 0:
                time.sleep(pause)
        took = time.monotonic() - start
        proxy.enabled = False
        faults = dict(proxy.counts)
        requests = dict(proxy.requests)
        off = time.monotonic()

        def settled() -> tuple[list[dict[str, Any]], float] | None:
            s.check_alive()
            ps: list[dict[str, Any]] = cluster.pods()
            if not cluster.settled(ps):
                return None
            records = sum(gpu_usage(ps).milli.values())
            cache = sum(s.metric("kallot_gpu_allocated_milli").values())
            return (ps, cache) if cache == records else None

        # Pods and metric as read together when settled: a pending pod may still be placed
        # later, and its bind in flight would be in the metric but not the pod list.
        moment: tuple[list[dict[str, Any]], float] | None = None
        with contextlib.suppress(AssertionError):
            moment = wait_until(settled, timeout=settle_timeout, what="the cluster to settle")
        settle_s = time.monotonic() - off
        attempts = {
            k.split('"')[1]: v
            for k, v in s.metric("kallot_scheduling_attempts_total").items()
            if '"' in k
        }
        final, cache_milli = moment or (
            cluster.pods(),  # never settled: what there is now, for the checks to fail on
            sum(s.metric("kallot_gpu_allocated_milli").values()),
        )
        usage = gpu_usage(final)
        s.kill()  # before the proxy goes: its watches would hold the proxy's shutdown
    present = {p["metadata"]["name"] for p in final}
    bound_without_record = []
    pending_without_reason = []
    for p in final:
        key = f"{p['metadata']['namespace']}/{p['metadata']['name']}"
        node = p["spec"].get("nodeName")
        if node and (key not in usage.records or usage.records[key].node != node):
            bound_without_record.append(key)
        if not node and not cluster.settled([p]):
            pending_without_reason.append(key)
    return ChurnReport(
        seed=seed,
        pods=pods,
        deleted=len(deleted),
        seconds=took,
        settle_s=settle_s,
        faults=faults,
        requests=requests,
        attempts=attempts,
        bound=sum(1 for p in final if p["spec"].get("nodeName")),
        pending=sum(1 for p in final if not p["spec"].get("nodeName")),
        double_held=overcommitted(usage, cluster.gpu_mem),
        bound_without_record=bound_without_record,
        pending_without_reason=pending_without_reason,
        lost=sorted(set(names) - deleted - present),
        cache_milli=cache_milli,
        records_milli=sum(usage.milli.values()),
    )


def _churn_pod(name: str, resources: dict[str, str]) -> dict[str, Any]:
    from kallot.testing.live import pod_body

    return pod_body(name, resources=resources)
