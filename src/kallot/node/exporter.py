"""The GPU metrics exporter: ``/metrics`` per GPU (DCGM-exporter names where one exists) and per
pod (what the device record gave it against what NVML says it uses).

The agent's loop refreshes an ``ExporterState`` (samples, processes, pods, health); a
``prometheus_client`` collector turns the latest state into series at scrape time, so a scrape
never calls NVML. Which pod a GPU process belongs to comes from its cgroup path
(``/proc/<pid>/cgroup`` holds ``pod<uid>``), read by ``pod_uid_of_pid``. The same HTTP server
answers the kubelet's probes: ``/healthz`` (the agent's loops run) and ``/readyz`` (started).
"""

from __future__ import annotations

import re
import socket
import ssl
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from kallot.config.inventory import NodeInventory
from kallot.core.errors import ConfigError
from kallot.node.allocate import PodRecord
from kallot.node.discovery import MIB, GpuMetrics, GpuProcess
from kallot.node.podresources import Drift, Holders

GPU_LABELS = ("gpu", "UUID", "modelName", "Hostname")
# dcgm-exporter's Kubernetes labels on the DCGM-named series: the container the kubelet assigned
# the GPU to (pod-resources API); empty when no container, or several (shares), hold it.
K8S_LABELS = ("container", "namespace", "pod")
# Per pod and device: allocated and used series carry the same labels, so one PromQL join (or a
# division) gives allocated vs used. GPU_I_PROFILE: the MIG profile ("" for a whole GPU or a
# share); modelName as in GPU_LABELS; workload: the pod's owner "Kind/name" (k8s.pod_owner).
POD_LABELS = ("namespace", "pod", "UUID", "Hostname", "GPU_I_PROFILE", "modelName", "workload")

_POD_UID = re.compile(
    r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})"
)


def pod_uid_from_cgroup(text: str) -> str | None:
    """The pod UID in a ``/proc/<pid>/cgroup`` file: cgroupfs (``.../kubepods/burstable/pod<uid>/
    <container>``) and systemd (``kubepods-burstable-pod<uid with _>.slice``) spellings."""
    m = _POD_UID.search(text)
    return None if m is None else m.group(1).replace("_", "-")


def pod_uid_of_pid(pid: int, proc: Path = Path("/proc")) -> str | None:
    """The pod a host process belongs to (None for a process outside any pod, or gone)."""
    try:
        return pod_uid_from_cgroup((proc / str(pid) / "cgroup").read_text())
    except OSError:
        return None


@dataclass
class ExporterState:
    """The latest values, replaced as a whole by the agent's loop."""

    node: str
    inventory: NodeInventory
    samples: list[GpuMetrics] = field(default_factory=list)
    processes: list[GpuProcess] = field(default_factory=list)
    pods: list[PodRecord] = field(default_factory=list)
    xid_counts: dict[str, int] = field(default_factory=dict)
    last_xid: dict[str, int] = field(default_factory=dict)
    unhealthy: set[str] = field(default_factory=set)
    transitions: dict[tuple[str, str], int] = field(default_factory=dict)  # (uuid, to) -> count
    drifts: list[Drift] = field(default_factory=list)  # kubelet assignment != device record
    holders: Holders = field(default_factory=dict)  # device UUID -> containers (pod-resources)
    dcgm_series: bool = True  # False: only kallot_* series (dcgm-exporter runs on the node)
    mig_plans: dict[str, int] = field(default_factory=dict)  # MIG plans answered, by state


class GpuCollector(Collector):
    """Builds the series from ``ExporterState`` at scrape time."""

    def __init__(
        self,
        state: ExporterState,
        *,
        pod_of_pid: Callable[[int], str | None] = pod_uid_of_pid,
    ) -> None:
        self.state = state
        self.pod_of_pid = pod_of_pid
        self.lock = threading.Lock()

    def update(self, **values: Any) -> None:
        with self.lock:
            for k, v in values.items():
                setattr(self.state, k, v)

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        with self.lock:
            s = self.state
            yield from _gpu_families(s)
            yield from _pod_families(s, self.pod_of_pid)


def _gauge(name: str, doc: str, labels: Sequence[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels))


def _holder(s: ExporterState, uuid: str) -> list[str]:
    """[container, namespace, pod] of the one container holding the GPU (or one of its MIG
    instances); empty strings when none or several do."""
    d = next((d for d in s.inventory.devices if d.uuid == uuid), None)
    ids = [uuid, *(m.uuid for m in d.mig if m.uuid)] if d else [uuid]
    who = {h for i in ids for h in s.holders.get(i, ())}
    if len(who) != 1:
        return ["", "", ""]
    namespace, pod, container = next(iter(who))
    return [container, namespace, pod]


def _gpu_families(s: ExporterState) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
    devices = {d.uuid: d for d in s.inventory.devices}
    dcgm = (*GPU_LABELS, *K8S_LABELS)
    util = _gauge("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", dcgm)
    used = _gauge("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", dcgm)
    free = _gauge("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", dcgm)
    total = _gauge("DCGM_FI_DEV_FB_TOTAL", "Framebuffer memory total (in MiB).", dcgm)
    temp = _gauge("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", dcgm)
    power = _gauge("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", dcgm)
    last_xid = _gauge("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.", dcgm)
    xids = CounterMetricFamily(
        "kallot_gpu_xid_errors",
        "XID errors seen on the GPU since the agent started.",
        labels=list(GPU_LABELS),
    )
    healthy = _gauge("kallot_gpu_healthy", "1 when the GPU is advertised Healthy.", GPU_LABELS)
    transitions = CounterMetricFamily(
        "kallot_gpu_health_transitions",
        "Health changes of the GPU (to=Healthy|Unhealthy).",
        labels=[*GPU_LABELS, "to"],
    )
    for m in s.samples:
        d = devices.get(m.uuid)
        labels = [str(d.index) if d else "", m.uuid, d.product or d.model if d else "", s.node]
        k8s = [*labels, *_holder(s, m.uuid)]
        util.add_metric(k8s, m.utilization_pct)
        used.add_metric(k8s, m.memory_used_bytes / MIB)
        free.add_metric(k8s, max(0, m.memory_total_bytes - m.memory_used_bytes) / MIB)
        total.add_metric(k8s, m.memory_total_bytes / MIB)
        temp.add_metric(k8s, m.temperature_c)
        power.add_metric(k8s, m.power_w)
        last_xid.add_metric(k8s, s.last_xid.get(m.uuid, 0))
        xids.add_metric(labels, s.xid_counts.get(m.uuid, 0))
        healthy.add_metric(labels, 0.0 if m.uuid in s.unhealthy else 1.0)
        for to in ("Healthy", "Unhealthy"):
            transitions.add_metric([*labels, to], s.transitions.get((m.uuid, to), 0))
    if s.dcgm_series:  # off next to dcgm-exporter: the same GPUs would be counted twice
        yield from (util, used, free, total, temp, power, last_xid)
    yield from (xids, healthy, transitions)
    plans = CounterMetricFamily(
        "kallot_agent_mig_plans",
        "MIG re-layout plans (kallot.io/mig-plan) the agent answered, by state "
        "(Applied, Refused, Failed).",
        labels=["node", "state"],
    )
    for state in ("Applied", "Refused", "Failed"):
        plans.add_metric([s.node, state], s.mig_plans.get(state, 0))
    yield plans


def _pod_families(
    s: ExporterState, pod_of_pid: Callable[[int], str | None]
) -> Iterator[GaugeMetricFamily]:
    mem_alloc = _gauge(
        "kallot_pod_gpu_memory_allocated_bytes",
        "GPU memory the device record gives the pod on this GPU.",
        POD_LABELS,
    )
    compute_alloc = _gauge(
        "kallot_pod_gpu_compute_allocated_milli",
        "GPU compute the device record gives the pod on this GPU (1000 = one GPU).",
        POD_LABELS,
    )
    mem_used = _gauge(
        "kallot_pod_gpu_memory_used_bytes",
        "GPU memory the pod's processes use on this GPU (NVML process accounting).",
        POD_LABELS,
    )
    compute_used = _gauge(
        "kallot_pod_gpu_compute_used_milli",
        "GPU compute the pod's processes use on this GPU, milli-GPU (NVML per-process SM "
        "utilization x 10, summed); absent when NVML has no per-process sample.",
        POD_LABELS,
    )
    procs = _gauge(
        "kallot_pod_gpu_processes", "Compute processes of the pod on this GPU.", POD_LABELS
    )
    by_uid = {p.uid: p for p in s.pods}
    model_of, profile_of = _device_names(s.inventory)
    usage: dict[tuple[str, str], tuple[int, int, float | None]] = {}
    for proc in s.processes:
        uid = pod_of_pid(proc.pid)
        if uid is None or uid not in by_uid:
            continue
        mem, n, sm = usage.get((uid, proc.uuid), (0, 0, None))
        if proc.sm_util_pct is not None:
            sm = (sm or 0.0) + proc.sm_util_pct * 10
        usage[(uid, proc.uuid)] = (mem + proc.used_memory_bytes, n + 1, sm)
    seen: set[tuple[str, str]] = set()

    def labels_of(p: PodRecord, uuid: str, profile: str) -> list[str]:
        return [p.namespace, p.name, uuid, s.node, profile, model_of.get(uuid, ""), p.owner]

    for p in s.pods:
        if p.record is None or p.record.node != s.node:
            continue
        for d in p.record.devices:
            labels = labels_of(p, d.uuid, d.mig.profile if d.mig else profile_of.get(d.uuid, ""))
            mem_alloc.add_metric(labels, d.mem_mib * MIB)
            compute_alloc.add_metric(labels, d.milli)
            mem, n, sm = usage.get((p.uid, d.uuid), (0, 0, None))
            mem_used.add_metric(labels, mem)
            if sm is not None:
                compute_used.add_metric(labels, sm)
            procs.add_metric(labels, n)
            seen.add((p.uid, d.uuid))
    # A pod using a GPU its record does not name: used, nothing allocated (shows as waste/leak).
    for (uid, uuid), (mem, n, sm) in sorted(usage.items()):
        if (uid, uuid) not in seen:
            labels = labels_of(by_uid[uid], uuid, profile_of.get(uuid, ""))
            mem_used.add_metric(labels, mem)
            if sm is not None:
                compute_used.add_metric(labels, sm)
            procs.add_metric(labels, n)
    mismatch = _gauge(
        "kallot_pod_device_record_mismatch",
        "1 when the kubelet assigned the pod other devices of the resource than its record names.",
        ("namespace", "pod", "resource", "Hostname"),
    )
    for dr in s.drifts:
        mismatch.add_metric([dr.namespace, dr.pod, dr.resource, s.node], 1.0)
    yield from (mem_alloc, compute_alloc, mem_used, compute_used, procs, mismatch)


def _device_names(inv: NodeInventory) -> tuple[dict[str, str], dict[str, str]]:
    """GPU and MIG-instance UUID -> model name (as GPU_LABELS' modelName), -> MIG profile."""
    model: dict[str, str] = {}
    profile: dict[str, str] = {}
    for d in inv.devices:
        model[d.uuid] = d.product or d.model
        for m in d.mig:
            if m.uuid:
                model[m.uuid] = d.product or d.model
                profile[m.uuid] = m.profile
    return model, profile


def make_registry(collector: GpuCollector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


class _QuietHandler(WSGIRequestHandler):
    timeout = 10  # a client that connects and sends nothing does not hold a thread

    def log_message(self, format: str, *args: Any) -> None:
        """Probes and scrapes every few seconds: not worth a log line each."""


#: ``(Authorization header or None, path) -> (HTTP status, reason)``: 200 lets the request
#: through (``k8sclient.delegated.DelegatedAuth`` behind it, on the agent's event loop).
Authorize = Callable[[str | None, str], tuple[int, str]]


def _authorized_app(
    app: Callable[..., Iterable[bytes]], authorize: Authorize
) -> Callable[..., Iterable[bytes]]:
    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        status, reason = authorize(environ.get("HTTP_AUTHORIZATION"), environ.get("PATH_INFO", ""))
        if status == 200:
            return app(environ, start_response)
        start_response(
            f"{status} {HTTPStatus(status).phrase}",
            [("Content-Type", "text/plain; charset=utf-8")],
        )
        return [reason.encode() + b"\n"]

    return guarded


def _probe_app(
    metrics: Callable[..., Iterable[bytes]],
    healthy: Callable[[], bool],
    ready: Callable[[], bool],
) -> Callable[..., Iterable[bytes]]:
    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        probe = {"/healthz": healthy, "/livez": healthy, "/readyz": ready}.get(path)
        if probe is None:
            return metrics(environ, start_response)
        ok = probe()
        start_response(
            "200 OK" if ok else "503 Service Unavailable",
            [("Content-Type", "text/plain; charset=utf-8")],
        )
        return [b"ok\n" if ok else b"not ok\n"]

    return app


def parse_address(address: str, field: str = "--metrics-address") -> tuple[str, int]:
    """``host:port`` (host may be empty: all interfaces; port 0: any free port)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ConfigError(field, address, "host:port, for example 0.0.0.0:9400")
    return host.strip("[]") or "0.0.0.0", int(port)


def serve(
    registry: CollectorRegistry,
    address: str,
    *,
    healthy: Callable[[], bool] = lambda: True,
    ready: Callable[[], bool] = lambda: True,
    tls: ssl.SSLContext | None = None,
    authorize: Authorize | None = None,
) -> tuple[Any, int]:
    """Serve ``/metrics`` (any other path too, as prometheus_client does), ``/healthz`` and
    ``/readyz`` on ``host:port`` (port 0: any free port) in a daemon thread; returns the server
    (``shutdown()`` it) and the bound port. An address in use is a ConfigError. With ``tls``
    it speaks HTTPS; with ``authorize`` each request is let through only on its 200."""
    from prometheus_client.exposition import ThreadingWSGIServer

    host, port = parse_address(address)
    app = _probe_app(make_wsgi_app(registry), healthy, ready)
    if authorize is not None:
        app = _authorized_app(app, authorize)

    class _Server(ThreadingWSGIServer):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

        def handle_error(self, request: Any, client_address: Any) -> None:
            """A client that drops the connection or fails the TLS handshake: its problem."""

    server: type[ThreadingWSGIServer] = _Server
    try:
        httpd = make_server(host, port, app, server, handler_class=_QuietHandler)
    except OSError as exc:
        raise ConfigError(
            "--metrics-address", address, f"a free local address ({exc.strerror})"
        ) from None
    if tls is not None:
        # The handshake happens on the first read, in the request's own thread, so a slow
        # client does not hold the accept loop.
        httpd.socket = tls.wrap_socket(
            httpd.socket, server_side=True, do_handshake_on_connect=False
        )
    threading.Thread(target=httpd.serve_forever, name="metrics", daemon=True).start()
    return httpd, int(httpd.server_address[1])
