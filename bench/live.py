"""Live scheduling throughput and latency: kallot against the real kube-scheduler, on the same
control plane in the same run.

Default mode (arrivals): for each cluster size, a fresh etcd + kube-apiserver + kube-scheduler
(default profile) gets N fake GPU nodes (8 whole GPUs each, with kallot's inventory); then the
same batch of pods asking ``nvidia.com/gpu: 1`` is created once for kube-scheduler and once for
kallot (``kallot scheduler`` in a subprocess). A watch records when each pod is seen bound;
latency is that time minus the time its create was sent. Prints pods bound per second, p50/p99
latency, peak RSS of each scheduler process, and kallot/kube-scheduler ratios.

``--drain``: the pods are created first, with no scheduler running, so pod creation does not
cap the rate; then each scheduler is started (kube-scheduler, then kallot, each on its own batch
of pods) and measured from its process start: first-bind time, pods/s (all pods / time to the
last bind), the longest gap between two binds, p50/p99 of "bound" minus "scheduler started",
and peak RSS. Like for like: both run as ``system:kube-scheduler`` (the same RBAC and the same
API Priority and Fairness flow schema and priority level), both post a Scheduled Event per bind
(kube-scheduler cannot turn its Events off), kube-scheduler's client-side rate limit is raised
to ``--kube-qps`` (kallot has none). ``--memory-pods N``: afterwards, N half-GPU pods for kallot
alone on the largest cluster, drained the same way: peak and final RSS.

Run after `make controlplane`:

    .venv/bin/python bench/live.py [--nodes 1000 5000] [--pods 1000]
    .venv/bin/python bench/live.py --drain --nodes 1000 5000 --pods 10000 --memory-pods 50000
"""

from __future__ import annotations

import argparse
import asyncio
import compileall
import contextlib
import datetime as dt
import os
import re
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from kallot.kube.api.client import ApiError, KubeClient
from kallot.kube.owners import OWNER_PATHS
from kallot.testing.controlplane import SCHEDULER_USER, ControlPlane, create_nodes
from kallot.testing.live import SchedulerProcess, inventory_node_body, pod_body

NS = "default"


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system, all threads) the process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mib(pid: int, field: str = "VmHWM") -> float:
    """Peak resident memory (``VmHWM``), or the current one with ``field="VmRSS"``."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def run_batch(cp: ControlPlane, scheduler: str, count: int, prefix: str) -> dict[str, float]:
    client = await KubeClient.connect(cp.kubeconfig_path, pool_size=64)
    sent: dict[str, float] = {}
    bound: dict[str, float] = {}
    try:
        _, rv = await client.list_all(f"/api/v1/namespaces/{NS}/pods")
        done = asyncio.Event()

        async def watch() -> None:
            nonlocal rv
            while not done.is_set():
                async for ev in client.watch(
                    f"/api/v1/namespaces/{NS}/pods", resource_version=rv, timeout_s=60
                ):
                    rv = ev.obj.get("metadata", {}).get("resourceVersion", rv)
                    name = ev.obj.get("metadata", {}).get("name", "")
                    if name.startswith(prefix) and (ev.obj.get("spec") or {}).get("nodeName"):
                        bound.setdefault(name, time.monotonic())
                        if len(bound) == count:
                            done.set()
                            return

        watcher = asyncio.create_task(watch())
        names = [f"{prefix}-{i:05d}" for i in range(count)]
        queue = iter(names)

        async def creator() -> None:
            for name in queue:
                body = pod_body(name, resources={"nvidia.com/gpu": "1"}, scheduler=scheduler)
                sent[name] = time.monotonic()
                await client.create(f"/api/v1/namespaces/{NS}/pods", body)

        t0 = time.monotonic()
        await asyncio.gather(*(creator() for _ in range(32)))
        await asyncio.wait_for(done.wait(), 600)
        elapsed = max(bound.values()) - t0
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await watcher
        lat = np.array([bound[n] - sent[n] for n in names])
        for name in names:  # free the GPUs for the next scheduler
            await client.request(
                "DELETE",
                f"/api/v1/namespaces/{NS}/pods/{name}",
                query=[("gracePeriodSeconds", "0")],
            )
        return {
            "pods_per_s": count / elapsed,
            "p50_ms": float(np.percentile(lat, 50)) * 1000,
            "p99_ms": float(np.percentile(lat, 99)) * 1000,
        }
    finally:
        await client.close()


# -- drain mode ------------------------------------------------------------------------------

DRAIN_NS = "drain"
# kallot reads its CRDs (PodGroup, Queue) and the workload owners it derives gangs from (Jobs,
# JobSets, PyTorchJobs, RayClusters; kube.owners), which kube-scheduler's bootstrap role does not
# cover. Everything else kallot does (list/watch pods and nodes, bind, Events, pod status) it does.
CRD_READER = {
    "apiVersion": "rbac.authorization.k8s.io/v1",
    "kind": "ClusterRole",
    "metadata": {"name": "bench-kallot-crds"},
    "rules": [
        {
            "apiGroups": ["kallot.io"],
            "resources": ["podgroups", "queues"],
            "verbs": ["get", "list", "watch"],
        },
        *(
            {
                "apiGroups": [path.split("/")[2]],
                "resources": [path.rsplit("/", 1)[1]],
                "verbs": ["get", "list", "watch"],
            }
            for path in OWNER_PATHS.values()
        ),
    ],
}
CRD_READER_BINDING = {
    "apiVersion": "rbac.authorization.k8s.io/v1",
    "kind": "ClusterRoleBinding",
    "metadata": {"name": "bench-kallot-crds"},
    "roleRef": {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "bench-kallot-crds",
    },
    "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": SCHEDULER_USER}],
}


@dataclass
class Launched:
    """A scheduler process started by the benchmark."""

    pid: Callable[[], int]
    stop: Callable[[], None]
    log: Callable[[], str] = lambda: ""


# Start-up milestones in kallot's log (text format: "<asctime> LEVEL logger message").
MILESTONES = {
    "log": "starting policy=",  # interpreter and imports done, logging set up
    "nodes_first": "listed first page resource=nodes ",
    "nodes": "listed resource=nodes ",
    "bound": "listed bound pods ",
    "synced": "caches synced ",
    "session": "session pods=",
    "pods": "listed resource=pods ",
}
_LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def milestones(log: str, started: float) -> dict[str, float]:
    """Seconds from the process start (wall clock ``started``) to the first log line of each
    milestone."""
    out: dict[str, float] = {}
    for line in log.splitlines():
        m = _LOG_LINE.match(line)
        if m is None:
            continue
        for key, text in MILESTONES.items():
            if key not in out and text in line:
                when = dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f")
                out[key] = when.timestamp() - started
    return out


async def _current_rv(client: KubeClient, path: str) -> str:
    page = await client.request("GET", path, query=[("limit", "1")])
    return str((page.get("metadata") or {}).get("resourceVersion", ""))


async def _create_pods(client: KubeClient, bodies: list[dict[str, Any]], workers: int = 64) -> None:
    queue = iter(bodies)

    async def creator() -> None:
        for body in queue:
            await client.create(f"/api/v1/namespaces/{DRAIN_NS}/pods", body)

    await asyncio.gather(*(creator() for _ in range(workers)))


async def _delete_pods(client: KubeClient) -> None:
    path = f"/api/v1/namespaces/{DRAIN_NS}/pods"
    while True:
        # A loaded API server may cut the answer of a delete of 10,000 pods (its request
        # timeout) while it goes on deleting: ask again until the collection is empty.
        with contextlib.suppress(ApiError):
            await client.request("DELETE", path, query=[("gracePeriodSeconds", "0")], timeout=300.0)
        if not (await client.request("GET", path, query=[("limit", "1")])).get("items"):
            return
        await asyncio.sleep(0.5)


async def drain(
    cp: ControlPlane,
    *,
    count: int,
    prefix: str,
    scheduler_name: str,
    resources: dict[str, str],
    launch: Callable[[], Awaitable[Launched]],
    console: Console,
    label: str,
    cleanup: bool = True,
    early_pid: Callable[[], int | None] = lambda: None,
) -> dict[str, float]:
    """Create ``count`` pods with no scheduler running, start one, measure it draining them.
    ``early_pid``: the scheduler's process id before ``launch`` returns, if known then."""
    client = await KubeClient.connect(cp.kubeconfig_path, pool_size=64)
    path = f"/api/v1/namespaces/{DRAIN_NS}/pods"
    bound: dict[str, float] = {}
    done = asyncio.Event()
    pid: list[int | None] = [None]
    first_cpu: list[float] = []  # the scheduler's CPU seconds when the first bind was seen
    try:
        bodies = [
            pod_body(f"{prefix}-{i:05d}", resources=resources, scheduler=scheduler_name)
            for i in range(count)
        ]
        with console.status(f"{label}: creating {count} pods (no scheduler running)"):
            await _create_pods(client, bodies)
        rv = await _current_rv(client, path)

        async def watch() -> None:
            nonlocal rv
            while not done.is_set():
                async for ev in client.watch(path, resource_version=rv, timeout_s=60):
                    meta = ev.obj.get("metadata") or {}
                    rv = str(meta.get("resourceVersion", rv))
                    if (ev.obj.get("spec") or {}).get("nodeName"):
                        bound.setdefault(str(meta.get("name", "")), time.monotonic())
                        proc = pid[0] or early_pid()
                        if not first_cpu and proc:
                            with contextlib.suppress(OSError):
                                first_cpu.append(cpu_s(proc))
                        if len(bound) == count:
                            done.set()
                            return

        watcher = asyncio.create_task(watch())
        with console.status(f"{label}: draining {count} pods"):
            load0 = os.getloadavg()[0]
            planes = {k: v for k, v in cp.pids.items() if k in ("etcd", "kube-apiserver")}
            plane0 = {k: cpu_s(v) for k, v in planes.items()}
            t0 = time.monotonic()
            started = time.time()
            launched = await launch()
            pid[0] = launched.pid()
            try:
                await asyncio.wait_for(done.wait(), max(600.0, count / 10))
                # CPU seconds used by the drain's end: the scheduler's (from its start), and
                # the API server's and etcd's meanwhile (load does not inflate them much).
                sched_cpu = cpu_s(launched.pid())
                plane_cpu = sum(cpu_s(v) - plane0[k] for k, v in planes.items())
                load1 = os.getloadavg()[0]
                # Like for like: the Scheduled Events written by the last bind (a scheduler
                # that lets them lag behind its binds does less work in the measured time).
                events, _ = await client.list_all(
                    f"/api/v1/namespaces/{DRAIN_NS}/events",
                    query=[("fieldSelector", "reason=Scheduled")],
                )
                posted = sum(
                    1
                    for e in events
                    if str((e.get("involvedObject") or {}).get("name", "")).startswith(prefix)
                )
                rss = peak_rss_mib(launched.pid())
                rss_now = peak_rss_mib(launched.pid(), "VmRSS")
                log = launched.log()
            finally:
                launched.stop()
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await watcher
        times = np.sort(np.array(list(bound.values())) - t0)
        sessions = [int(m) for m in re.findall(r"session pods=(\d+)", log)]
        if cleanup:  # free the GPUs for the next scheduler
            with console.status(f"{label}: deleting the pods"):
                await _delete_pods(client)
        steps = milestones(log, started)
        result = {
            **{f"at_{k}_s": v for k, v in steps.items()},
            "first_bind_s": float(times[0]),
            # CPU the scheduler process used up to its first bind: what load does not inflate.
            "first_bind_cpu_s": first_cpu[0] if first_cpu else float("nan"),
            "last_bind_s": float(times[-1]),
            "pods_per_s": count / float(times[-1]),
            "steady_pods_per_s": (count - 1) / float(times[-1] - times[0]) if count > 1 else 0.0,
            # Every pod fits and is pending until it is bound: the longest gap between two
            # binds is the longest time without a bind while pods were pending and fit.
            "max_gap_s": float(np.diff(times).max()) if count > 1 else 0.0,
            # When it began (seconds after the start), and how many pods were bound by then.
            "max_gap_at_s": float(times[int(np.diff(times).argmax())]) if count > 1 else 0.0,
            "max_gap_after": float(np.diff(times).argmax() + 1) if count > 1 else 0.0,
            "p50_s": float(np.percentile(times, 50)),
            "p99_s": float(np.percentile(times, 99)),
            "load_at_start": load0,  # the 1-minute load average (the machine is shared)
            "load_at_end": load1,
            "scheduled_events_at_last_bind": float(posted),
            "cpu_ms_per_pod": 1000 * sched_cpu / count,
            "plane_cpu_ms_per_pod": 1000 * plane_cpu / count,
            "peak_rss_mib": rss,
            "rss_mib": rss_now,
            "sessions": float(len(sessions)),
            "largest_session": float(max(sessions, default=0)),
        }
        # As soon as it is measured: a long run that is stopped keeps what it had.
        console.print(f"{label}: " + ", ".join(f"{k} {v:.2f}" for k, v in result.items()))
        return result
    finally:
        await client.close()


def _kube_scheduler(cp: ControlPlane) -> Callable[[], Awaitable[Launched]]:
    async def launch() -> Launched:
        # Returns once its /readyz answers (informers synced); it may bind before that, and
        # the watch records those binds meanwhile.
        await asyncio.to_thread(cp.start_scheduler)
        return Launched(pid=lambda: cp.pids["kube-scheduler"], stop=cp.stop_scheduler)

    return launch


def _kallot(cp: ControlPlane, log_dir: Path, extra: list[str]) -> Callable[[], Awaitable[Launched]]:
    async def launch() -> Launched:
        # A log of its own per process: the start-up milestones are read from it.
        path = log_dir / f"kallot-{time.monotonic_ns()}.log"
        s = SchedulerProcess(cp.scheduler_kubeconfig_path, path, extra=extra)

        def log() -> str:
            return path.read_text(errors="replace")

        def stop() -> None:
            s.terminate()

        return Launched(pid=lambda: s.popen.pid, stop=stop, log=log)

    return launch


def byte_compile_kallot() -> None:
    """Byte-compile kallot's modules, as ``pip install`` does in the image: an editable install
    under ``PYTHONDONTWRITEBYTECODE=1`` (this development machine) otherwise compiles its 130
    modules from source at every start, 0.15-0.2 s of CPU that a deployed scheduler does not
    spend (kube-scheduler, the other side of the comparison, is a compiled binary)."""
    import kallot

    compileall.compile_dir(Path(kallot.__file__).parent, quiet=1)


def run_drain(args: argparse.Namespace) -> None:
    byte_compile_kallot()
    console = Console(width=max(140, Console().width))
    qps = args.kube_qps or 5000
    sched_config = {"clientConnection": {"qps": qps, "burst": qps}}
    settings = Table(title="drain: like-for-like settings", show_header=False)
    for k, v in (
        (
            "client identity",
            f"{SCHEDULER_USER} for both (bootstrap RBAC; kallot also reads its CRDs and the "
            "workload owners it derives gangs from)",
        ),
        ("API priority", "the same flow schema (kube-scheduler) and priority level for both"),
        ("Scheduled Events", "on for both (kube-scheduler cannot turn them off)"),
        ("kallot's modules", "byte-compiled before the runs, as pip does in the image"),
        ("client-side rate limit", f"kube-scheduler qps = burst = {qps}; kallot has none"),
        ("kube-scheduler", "v1.36.3, default profile, no leader election"),
        (
            "kallot",
            f"policy kallot, no leader election, {' '.join(args.kallot_args) or 'defaults'}",
        ),
        (
            "pods",
            f"{args.pods} x nvidia.com/gpu: 1 (at most 8 a node: all fit), created before the "
            "scheduler starts",
        ),
        ("load", f"{os.getloadavg()[0]:.1f} (1-min load average at start, {os.cpu_count()} CPUs)"),
    ):
        settings.add_row(k, v)
    console.print(settings)
    table = Table(title=f"drain: {args.pods} pending pods, each scheduler started after them")
    cols = ("nodes", "scheduler", "first bind s", "pods/s", "steady pods/s", "max gap pending s")
    cpu_cols = ("CPU ms/pod", "apiserver+etcd CPU ms/pod")
    for col in (*cols, "p50 s", "p99 s", *cpu_cols, "peak RSS MiB", "sessions"):
        table.add_column(col, justify="right")
    ratios = []
    memory: dict[str, float] | None = None
    for idx, n in enumerate(args.nodes):
        with (
            ControlPlane(scheduler=False, scheduler_config=sched_config) as cp,
            tempfile.TemporaryDirectory() as tmp,
        ):
            with console.status(f"creating {n} nodes"):
                bodies = [inventory_node_body(f"gpu-{i:05d}", 8) for i in range(n)]
                asyncio.run(create_nodes(cp.kubeconfig_path, bodies, concurrency=64))
                asyncio.run(_setup(cp))
            whole = {"nvidia.com/gpu": "1"}
            # Every pod must fit (8 GPUs a node), or the drain never ends.
            count = min(args.pods, 8 * n)
            kube: dict[str, float] = {}
            ours: dict[str, float] = {}
            if count:  # --pods 0: the memory run alone
                kube = asyncio.run(
                    drain(
                        cp,
                        prefix="ks",
                        scheduler_name="default-scheduler",
                        launch=_kube_scheduler(cp),
                        early_pid=lambda: cp.pids.get("kube-scheduler"),
                        label=f"kube-scheduler, {n} nodes",
                        count=count,
                        resources=whole,
                        console=console,
                    )
                )
                ours = asyncio.run(
                    drain(
                        cp,
                        prefix="ka",
                        scheduler_name="kallot",
                        launch=_kallot(cp, Path(tmp), list(args.kallot_args)),
                        label=f"kallot, {n} nodes",
                        count=count,
                        resources=whole,
                        console=console,
                    )
                )
            if args.memory_pods and idx == len(args.nodes) - 1:
                memory = asyncio.run(
                    drain(
                        cp,
                        count=args.memory_pods,
                        prefix="mem",
                        scheduler_name="kallot",
                        resources={"kallot.io/gpu-milli": "500", "kallot.io/gpu-memory": "20Gi"},
                        launch=_kallot(cp, Path(tmp), list(args.kallot_args)),
                        console=console,
                        label=f"memory: kallot, {n} nodes",
                        cleanup=False,  # the control plane goes next
                    )
                )
        if not count:
            continue
        for name, r in (("kube-scheduler", kube), ("kallot", ours)):
            table.add_row(
                f"{n} ({count} pods)",
                name,
                f"{r['first_bind_s']:.2f}",
                f"{r['pods_per_s']:.0f}",
                f"{r['steady_pods_per_s']:.0f}",
                f"{r['max_gap_s']:.2f}",
                f"{r['p50_s']:.2f}",
                f"{r['p99_s']:.2f}",
                f"{r['cpu_ms_per_pod']:.2f}",
                f"{r['plane_cpu_ms_per_pod']:.2f}",
                f"{r['peak_rss_mib']:.0f}",
                f"{r['sessions']:.0f} (largest {r['largest_session']:.0f})"
                if r["sessions"]
                else "",
            )
        ratios.append(f"{n} nodes: kallot start-up: {startup(ours)}")
        ratios.append(
            f"{n} nodes: kallot/kube-scheduler pods/s x{ours['pods_per_s'] / kube['pods_per_s']:.2f}"
            f", steady x{ours['steady_pods_per_s'] / kube['steady_pods_per_s']:.2f}"
            f", first bind x{ours['first_bind_s'] / kube['first_bind_s']:.2f}"
            f" (CPU to first bind {ours['first_bind_cpu_s']:.2f} s vs"
            f" {kube['first_bind_cpu_s']:.2f} s)"
            f", p99 x{ours['p99_s'] / kube['p99_s']:.2f}"
            f", scheduler CPU per pod x{ours['cpu_ms_per_pod'] / kube['cpu_ms_per_pod']:.2f}"
            f", apiserver+etcd CPU per pod"
            f" x{ours['plane_cpu_ms_per_pod'] / kube['plane_cpu_ms_per_pod']:.2f}"
            f", peak RSS x{ours['peak_rss_mib'] / kube['peak_rss_mib']:.2f}"
        )
    console.print(table)
    for line in ratios:
        console.print(line)
    if memory is not None:
        console.print(
            f"memory: kallot drained {args.memory_pods} pods (kallot.io/gpu-milli: 500) on "
            f"{args.nodes[-1]} nodes at {memory['pods_per_s']:.0f} pods/s, first bind "
            f"{memory['first_bind_s']:.2f} s, longest gap between binds while pods were pending "
            f"{memory['max_gap_s']:.2f} s, peak RSS {memory['peak_rss_mib']:.0f} MiB, RSS "
            f"{memory['rss_mib']:.0f} MiB with all {args.memory_pods} bound"
        )
        console.print(f"memory: kallot start-up: {startup(memory)}")


def startup(r: dict[str, float]) -> str:
    """kallot's start-up milestones, seconds from its process start."""
    names = {
        "log": "first log line (imports done)",
        "nodes_first": "first page of nodes listed",
        "nodes": "nodes listed",
        "bound": "bound pods listed",
        "synced": "first session may start",
        "session": "first session done",
        "pods": "all pods listed",
    }
    steps = [(r[f"at_{k}_s"], text) for k, text in names.items() if f"at_{k}_s" in r]
    steps.append((r["first_bind_s"], "first bind seen"))
    return ", ".join(f"{text} {t:.2f}" for t, text in sorted(steps))


async def _setup(cp: ControlPlane) -> None:
    client = await KubeClient.connect(cp.kubeconfig_path)
    try:
        await client.create("/api/v1/namespaces", {"metadata": {"name": DRAIN_NS}})
        base = "/apis/rbac.authorization.k8s.io/v1"
        await client.create(f"{base}/clusterroles", CRD_READER)
        await client.create(f"{base}/clusterrolebindings", CRD_READER_BINDING)
    finally:
        await client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument(
        "--drain",
        action="store_true",
        help="create the pods first, then start each scheduler (see the module docstring)",
    )
    parser.add_argument(
        "--memory-pods",
        type=int,
        default=0,
        help="with --drain: then drain this many half-GPU pods with kallot on the largest size",
    )
    parser.add_argument(
        "--kallot-args", nargs="*", default=[], help="extra `kallot scheduler` flags (--drain)"
    )
    parser.add_argument(
        "--kube-qps",
        type=int,
        default=0,
        help="kube-scheduler clientConnection qps and burst (0: its defaults, qps 50 burst 100)",
    )
    args = parser.parse_args()
    if args.drain:
        run_drain(args)
        return
    sched_config = (
        {"clientConnection": {"qps": args.kube_qps, "burst": args.kube_qps}}
        if args.kube_qps
        else {}
    )
    kube_name = f"kube-scheduler (qps {args.kube_qps})" if args.kube_qps else "kube-scheduler"
    console = Console()
    table = Table(title=f"{args.pods} pods x nvidia.com/gpu: 1, bound through the real API server")
    for col in ("nodes", "scheduler", "pods/s", "p50 ms", "p99 ms", "peak RSS MiB"):
        table.add_column(col, justify="right")
    ratios = []
    for n in args.nodes:
        with (
            ControlPlane(scheduler=True, scheduler_config=sched_config) as cp,
            tempfile.TemporaryDirectory() as tmp,
        ):
            with console.status(f"creating {n} nodes"):
                bodies = [inventory_node_body(f"gpu-{i:05d}", 8) for i in range(n)]
                asyncio.run(create_nodes(cp.kubeconfig_path, bodies, concurrency=64))
            with console.status(f"kube-scheduler: {args.pods} pods on {n} nodes"):
                kube = asyncio.run(run_batch(cp, "default-scheduler", args.pods, "ks"))
            kube_rss = peak_rss_mib(cp.pids["kube-scheduler"])
            s = SchedulerProcess(
                cp.kubeconfig_path, Path(tmp) / "kallot.log", extra=["--no-scheduled-events"]
            )
            try:
                s.wait_ready(120)
                with console.status(f"kallot: {args.pods} pods on {n} nodes"):
                    ours = asyncio.run(run_batch(cp, "kallot", args.pods, "ka"))
                ours_rss = peak_rss_mib(s.popen.pid)
            finally:
                s.terminate()
        table.add_row(
            str(n),
            "kube-scheduler",
            *(f"{kube[k]:.0f}" for k in ("pods_per_s", "p50_ms", "p99_ms")),
            f"{kube_rss:.0f}",
        )
        table.add_row(
            str(n),
            "kallot",
            *(f"{ours[k]:.0f}" for k in ("pods_per_s", "p50_ms", "p99_ms")),
            f"{ours_rss:.0f}",
        )
        ratios.append(
            f"{n} nodes: kallot/{kube_name} throughput x{ours['pods_per_s'] / kube['pods_per_s']:.2f}, "
            f"p50 latency x{ours['p50_ms'] / kube['p50_ms']:.2f}, p99 latency x{ours['p99_ms'] / kube['p99_ms']:.2f}, "
            f"peak RSS x{ours_rss / kube_rss:.2f}"
        )
    console.print(table)
    for line in ratios:
        console.print(line)


if __name__ == "__main__":
    main()
