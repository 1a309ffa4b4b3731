"""DRA side by side: the real kube-scheduler v1.36 and kallot allocating the same ResourceClaims.

One cluster of fake GPU nodes (``--nodes``, 8 GPUs each) with ``gpu.nvidia.com``-shaped
ResourceSlices (``kallot.testing.dra``): every GPU a consumable-capacity device (80Gi, 1Gi
steps, default the whole GPU), so whole-GPU claims and memory shares compete for the same
devices. The claim/pod sequence comes from the openb default trace (``--workload``): the GPU
pods in the protocol's seeded arrival order, cut where the requested GPUs reach the cluster's
capacity (``kallot.sim.openb.arrival_order`` with inflation 1.0); a whole-GPU pod
(``gpu_milli`` 1000) gets an ExactCount claim of ``num_gpu`` devices, a share gets one device
with ``capacity.requests.memory`` = its fraction of 80Gi (rounded up to 1Gi). Each pod has its
own ResourceClaim and the pod's CPU and memory requests.

The sequence is replayed twice, each on a fresh control plane: once through kube-scheduler
(``schedulerName: default-scheduler``, its DynamicResources plugin allocates), once through
kallot (``kallot scheduler``, default policy). Default (drain): all claims and pods are created
with no scheduler running, then the scheduler starts, so pod creation does not cap the rate
(``--stream``: created while the scheduler runs, 8 client threads, as before). Like for like:
both run as ``system:kube-scheduler`` (kube-scheduler's bootstrap RBAC and API priority level;
kallot also gets read access to its CRDs and workload owners, as in ``bench/live.py --drain``),
both post a Scheduled Event per bind, kube-scheduler's client QPS/burst is raised to
``--kube-qps`` (kallot has no client rate limit). The run ends when every pod is bound or
pending with a reason. Reported per scheduler: unallocated GPU % at the end, i.e. when the
arrived requests have reached capacity (100 x (1 - allocated GPUs / GPUs), a share counting
its consumed memory / 80Gi); pods/s = (bound - 1) / (last bind - first bind), the scheduling
rate (also bound / (last bind - scheduler start), start-up included, the first bind's time and
the CPU seconds the scheduler process had used by then; for kallot its start-up milestones
from its log, as ``bench/live.py`` prints them; kallot's modules are byte-compiled before the
runs, as ``pip install`` does in the image);
p50/p99 latency (drain: scheduler start to bound; stream: create to bound), binds seen by a
watch; and audits from the API: devices in two allocations or shares over capacity
(``double_allocations``), and allocations that do not match their claim
(``invalid_allocations``: wrong count, device not on the pod's node); the pods left pending,
by shape. Then kallot/kube-scheduler
ratios (target: unallocated <= 0.7x, throughput >= 1.0x). ``bench/dra_offline.py`` replays the
same sequence without a control plane. Also printed: the packing bound (``packing_bound``: no
placement of the sequence leaves less unallocated), so a ratio can be read against what any
scheduler could reach. Several ``--seed`` values: each seed as above, then mean, sd and range
over the seeds; ``--json`` then holds the means (same keys) and every seed under ``seeds``.

    .venv/bin/python bench/dra.py [--nodes 32] [--seed 1 2 3] [--stream] [--kube-qps 5000] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import highspy
import numpy as np
from kubernetes import client, watch
from live import (  # bench/ is on sys.path when run as a script
    CRD_READER,
    CRD_READER_BINDING,
    byte_compile_kallot,
    cpu_s,
    milestones,
    startup,
)

from kallot.core.dra.model import parse_quantity
from kallot.sim import openb, trace
from kallot.testing.controlplane import ControlPlane, gpu_node_body
from kallot.testing.dra import claim, exactly, nvidia_classes, nvidia_node_slices
from kallot.testing.live import Cluster, SchedulerProcess

GROUP, VERSION = "resource.k8s.io", "v1"
GPUS_PER_NODE = 8
GPU_MEMORY = Fraction(80 * 2**30)


@dataclass(frozen=True, slots=True)
class Arrival:
    name: str
    cpu_milli: int
    mem_mib: int
    count: int
    share_gib: int  # 0: whole GPUs


@dataclass(slots=True)
class Result:
    pods: int = 0
    bound: int = 0
    unallocated_pct: float = 0.0
    pods_per_s: float = 0.0  # (bound - 1) / (last bind - first bind): the scheduling rate
    pods_per_s_from_start: float = 0.0  # bound / (last bind - start)
    first_bind_s: float = 0.0
    # CPU seconds (user + system) the scheduler process had used when its first bind was seen:
    # what the machine's load inflates least
    first_bind_cpu_s: float = float("nan")
    # kallot only: its start-up milestones from its log, seconds from its process start
    startup: dict[str, float] = field(default_factory=dict)
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    seconds: float = 0.0
    double_allocations: list[str] = field(default_factory=list)
    invalid_allocations: list[str] = field(default_factory=list)
    pending: str = ""  # the pods left pending, by shape: "1x8 GPUs, 3x1 GPU, 2 shares (...Gi)"


def arrivals(workload: str, nodes: int, seed: int) -> list[Arrival]:
    pods = [p for p in trace.read_pods(trace.resolve_workload(workload)) if p.num_gpu > 0]
    capacity = nodes * GPUS_PER_NODE * 1000
    order = openb.arrival_order(pods, capacity, np.random.default_rng(seed), inflate=1.0)
    out = []
    for i, p in enumerate(order):
        share = 0 if p.gpu_milli >= 1000 else max(1, math.ceil(p.gpu_milli * 80 / 1000))
        out.append(Arrival(f"p{i:04d}", p.cpu_milli, p.memory_mib, p.num_gpu, share))
    return out


def _patterns(sizes: Sequence[int], room: int) -> list[tuple[int, ...]]:
    """Every multiset of share sizes (indices into ``sizes``, non-increasing) fitting ``room``."""
    out: list[tuple[int, ...]] = [()]

    def grow(p: tuple[int, ...], left: int, start: int) -> None:
        for i in range(start, len(sizes)):
            if sizes[i] <= left:
                q = (*p, i)
                out.append(q)
                grow(q, left - sizes[i], i)

    grow((), room, 0)
    return out


def packing_bound(seq: Sequence[Arrival], nodes: int) -> float:
    """The least unallocated GPU % any placement of this sequence can leave: an integer program
    over GPU patterns (the shares one GPU holds) maximizing the allocated GPU memory, whole GPUs
    taking a GPU each. CPU, memory and node boundaries are ignored (a relaxation: the true
    least is at least this)."""
    gib = int(GPU_MEMORY // 2**30)
    counts: dict[int, int] = {}
    whole = 0
    for a in seq:
        if a.share_gib:
            counts[a.share_gib] = counts.get(a.share_gib, 0) + 1
        else:
            whole += a.count
    sizes = sorted(counts, reverse=True)
    pats = [p for p in _patterns(sizes, gib) if p]
    h = highspy.Highs()  # type: ignore[no-untyped-call]  # highspy 1.15 leaves __init__ untyped
    h.setOptionValue("output_flag", False)
    h.changeObjectiveSense(highspy.ObjSense.kMaximize)
    inf = highspy.kHighsInf
    gpus = nodes * GPUS_PER_NODE
    # rows: 0 = GPUs, 1.. = share counts per size
    h.addRow(0.0, float(gpus), 0, np.array([], dtype=np.int32), np.array([]))
    for s in sizes:
        h.addRow(0.0, float(counts[s]), 0, np.array([], dtype=np.int32), np.array([]))
    h.addCol(float(gib), 0.0, float(whole), 1, np.array([0], dtype=np.int32), np.array([1.0]))
    for p in pats:
        idx = [0] + [1 + i for i in sorted(set(p))]
        val = [1.0] + [float(p.count(i)) for i in sorted(set(p))]
        cost = float(sum(sizes[i] for i in p))
        h.addCol(cost, 0.0, inf, len(idx), np.array(idx, dtype=np.int32), np.array(val))
    n = h.getNumCol()
    h.changeColsIntegrality(
        n, np.arange(n, dtype=np.int32), np.array([highspy.HighsVarType.kInteger] * n)
    )
    h.run()
    best = h.getInfo().objective_function_value
    return 100.0 * (1 - best / (gpus * gib))


def _claim(a: Arrival) -> dict[str, Any]:
    fields: dict[str, Any] = {"count": a.count}
    if a.share_gib:
        fields["capacity"] = {"requests": {"memory": f"{a.share_gib}Gi"}}
    return claim(a.name, [exactly("gpu", "gpu.nvidia.com", **fields)])


def _pod(a: Arrival, scheduler: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": a.name},
        "spec": {
            "schedulerName": scheduler,
            "resourceClaims": [{"name": "gpu", "resourceClaimName": a.name}],
            "containers": [
                {
                    "name": "c",
                    "image": "busybox",
                    "resources": {
                        "requests": {"cpu": f"{a.cpu_milli}m", "memory": f"{a.mem_mib}Mi"},
                        "claims": [{"name": "gpu"}],
                    },
                }
            ],
        },
    }


def _setup(c: Cluster, nodes: int) -> None:
    co = client.CustomObjectsApi(c.api)
    rbac = client.RbacAuthorizationV1Api(c.api)
    rbac.create_cluster_role(client.V1ClusterRole.model_validate(CRD_READER))
    rbac.create_cluster_role_binding(client.V1ClusterRoleBinding.model_validate(CRD_READER_BINDING))
    names = [f"n{i:02d}" for i in range(nodes)]
    c.add_nodes([gpu_node_body(n, gpus=0, cpu_milli=128_000, mem_mib=1024 * 1024) for n in names])
    for cls in nvidia_classes():
        co.create_cluster_custom_object(GROUP, VERSION, "deviceclasses", cls)
    for n in names:
        for s in nvidia_node_slices(n, gpus=0, shared=GPUS_PER_NODE):
            co.create_cluster_custom_object(GROUP, VERSION, "resourceslices", s)


def _claims(c: Cluster) -> dict[str, dict[str, Any]]:
    got = client.CustomObjectsApi(c.api).list_namespaced_custom_object(
        GROUP, VERSION, c.ns, "resourceclaims"
    )
    assert isinstance(got, dict)  # the client annotates a custom object list as object
    return {o["metadata"]["name"]: o for o in got["items"]}


def _settled(pods: list[dict[str, Any]]) -> bool:
    for p in pods:
        if p["spec"].get("nodeName"):
            continue
        conds = p.get("status", {}).get("conditions") or []
        if not any(x["type"] == "PodScheduled" and x["status"] == "False" for x in conds):
            return False
    return True


def _resource_version(v1: client.CoreV1Api, ns: str) -> str:
    meta = v1.list_namespaced_pod(ns, limit=1).metadata
    assert meta is not None and meta.resource_version is not None  # a list always has both
    return meta.resource_version


class _Binds:
    """A watch on the namespace's pods recording when each is first seen bound (its own API
    client: the bench's polls do not delay it)."""

    def __init__(self, cp: ControlPlane, ns: str) -> None:
        self.at: dict[str, float] = {}
        # the scheduler's process id once it is started (None before)
        self.pid: Callable[[], int | None] = lambda: None
        self.first_cpu_s = float("nan")  # its CPU seconds when the first bind was seen
        self._stop = threading.Event()
        self._api = cp.api_client()
        v1 = client.CoreV1Api(self._api)
        rv = _resource_version(v1, ns)
        self._thread = threading.Thread(target=self._run, args=(v1, ns, rv), daemon=True)
        self._thread.start()

    def _run(self, v1: client.CoreV1Api, ns: str, rv: str) -> None:
        while not self._stop.is_set():
            w = watch.Watch()  # type: ignore[no-untyped-call]  # kubernetes.watch is untyped
            try:
                for ev in w.stream(  # type: ignore[no-untyped-call]  # kubernetes.watch is untyped
                    v1.list_namespaced_pod, ns, resource_version=rv, timeout_seconds=30
                ):
                    obj = ev["raw_object"]
                    rv = obj["metadata"].get("resourceVersion", rv)
                    if obj["spec"].get("nodeName"):
                        pid = self.pid()
                        if not self.at and pid is not None:
                            self.first_cpu_s = cpu_s(pid)
                        self.at.setdefault(obj["metadata"]["name"], time.monotonic())
                    if self._stop.is_set():
                        w.stop()  # type: ignore[no-untyped-call]  # kubernetes.watch is untyped
            except Exception:  # an expired watch restarts from a fresh list
                if self._stop.is_set():
                    return
                rv = _resource_version(v1, ns)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=35)
        self._api.close()  # type: ignore[no-untyped-call]  # ApiClient.close is untyped


def _create(c: Cluster, seq: list[Arrival], scheduler: str, created: dict[str, float]) -> None:
    co = client.CustomObjectsApi(c.api)

    def make(a: Arrival) -> None:
        body = _claim(a)
        body["metadata"].pop("uid", None)
        body["metadata"]["namespace"] = c.ns
        co.create_namespaced_custom_object(GROUP, VERSION, c.ns, "resourceclaims", body)
        created[a.name] = time.monotonic()
        c.v1.create_namespaced_pod(
            c.ns, client.V1Pod.model_validate(_pod(a, scheduler)), _preload_content=False
        )

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(make, seq))


def _wait_settled(c: Cluster, seq: list[Arrival], deadline: float) -> list[dict[str, Any]]:
    while True:
        pods = c.pods()
        if (_settled(pods) and len(pods) == len(seq)) or time.monotonic() > deadline:
            return pods
        time.sleep(0.5)


def replay(c: Cluster, seq: list[Arrival], kind: str, nodes: int, opts: Options) -> Result:
    """Create the claims and pods, let the scheduler place them, measure and audit (module
    docstring). ``opts.drain``: everything is created before the scheduler starts."""
    created: dict[str, float] = {}
    name = "kallot" if kind == "kallot" else "default-scheduler"
    binds = _Binds(c.cp, c.ns)
    if kind == "kube_scheduler":
        binds.pid = lambda: c.cp.pids.get("kube-scheduler")
    else:
        binds.pid = lambda: c.schedulers[-1].popen.pid if c.schedulers else None
    try:
        if opts.drain:
            _create(c, seq, name, created)
            start, started = time.monotonic(), time.time()
            _start(c, kind, opts)
            created = dict.fromkeys(created, start)  # latency: from the scheduler's start
        else:
            started = time.time()
            _start(c, kind, opts)
            start = time.monotonic()
            _create(c, seq, name, created)
        pods = _wait_settled(c, seq, start + opts.timeout)
        # Every bound pod's watch event has arrived once the pods settled; wait for stragglers.
        bound_names = {p["metadata"]["name"] for p in pods if p["spec"].get("nodeName")}
        limit = time.monotonic() + 10
        while not bound_names <= set(binds.at) and time.monotonic() < limit:
            time.sleep(0.1)
    finally:
        binds.close()
    bound_at = {n: t for n, t in binds.at.items() if n in bound_names}
    res = Result(pods=len(seq), bound=len(bound_at))
    res.pending = _pending([a for a in seq if a.name not in bound_at])
    times = sorted(bound_at.values())
    res.seconds = times[-1] - start if times else 0.0
    res.first_bind_s = times[0] - start if times else 0.0
    res.first_bind_cpu_s = binds.first_cpu_s
    if kind == "kallot":
        res.startup = milestones(c.schedulers[-1].log_path.read_text(errors="replace"), started)
    res.pods_per_s_from_start = res.bound / res.seconds if res.seconds > 0 else 0.0
    steady = times[-1] - times[0] if len(times) > 1 else 0.0
    res.pods_per_s = (res.bound - 1) / steady if steady > 0 else 0.0
    lat = [1000 * (bound_at[n] - created[n]) for n in bound_at]
    if lat:
        res.p50_ms = float(np.percentile(lat, 50))
        res.p99_ms = float(np.percentile(lat, 99))
    _audit(c, seq, pods, set(bound_at), nodes, res)
    return res


def _audit(  # noqa: PLR0917 - one call site
    c: Cluster,
    seq: list[Arrival],
    pods: list[dict[str, Any]],
    bound: set[str],
    nodes: int,
    res: Result,
) -> None:
    claims = _claims(c)
    by_name = {a.name: a for a in seq}
    node_of = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in pods}
    used: dict[tuple[str, str], Fraction] = {}
    exclusive: dict[tuple[str, str], str] = {}
    allocated = Fraction(0)
    for name, obj in claims.items():
        alloc = (obj.get("status") or {}).get("allocation")
        if not alloc:
            continue
        results = alloc["devices"]["results"]
        a = by_name[name]
        if len(results) != a.count:
            res.invalid_allocations.append(f"{name}: {len(results)} devices for {a.count}")
        for r in results:
            dev = (r["pool"], r["device"])
            if node_of.get(name) and r["pool"] != node_of[name]:
                res.invalid_allocations.append(f"{name}: {dev} not on node {node_of[name]}")
            mem = (r.get("consumedCapacity") or {}).get("memory")
            amount = parse_quantity(mem) if mem else GPU_MEMORY
            if not r.get("shareID"):
                if dev in exclusive:
                    res.double_allocations.append(f"{dev} in {exclusive[dev]} and {name}")
                exclusive[dev] = name
            used[dev] = used.get(dev, Fraction(0)) + amount
            if name in bound:
                allocated += amount / GPU_MEMORY
    res.double_allocations += [f"{d} over capacity" for d, u in used.items() if u > GPU_MEMORY]
    total = nodes * GPUS_PER_NODE
    res.unallocated_pct = float(100 * (1 - allocated / total))


@dataclass(frozen=True, slots=True)
class Options:
    drain: bool
    kube_qps: int
    timeout: float
    logs: Path | None


def _start(c: Cluster, kind: str, opts: Options) -> None:
    """Start the scheduler under test. Like for like: both as ``system:kube-scheduler`` (same
    RBAC, same API priority level); kube-scheduler's client rate limit is ``opts.kube_qps``
    (kallot has none)."""
    if kind == "kube_scheduler":
        c.cp.start_scheduler()
        return
    s = SchedulerProcess(
        c.cp.scheduler_kubeconfig_path,
        c.log_dir / f"scheduler-kallot-{len(c.schedulers)}.log",
        identity="bench",
        lease_name=c.lease,
    )
    c.schedulers.append(s)
    if not opts.drain:
        s.wait_ready(timeout=120)


def run(kind: str, seq: list[Arrival], nodes: int, opts: Options) -> Result:
    config = {"clientConnection": {"qps": opts.kube_qps, "burst": opts.kube_qps}}
    with (
        ControlPlane(scheduler=False, scheduler_config=config if opts.kube_qps else None) as cp,
        cp.api_client() as api,
        tempfile.TemporaryDirectory() as tmp,
    ):
        c = Cluster(cp, api, opts.logs or Path(tmp))
        try:
            _setup(c, nodes)
            return replay(c, seq, kind, nodes, opts)
        finally:
            c.close()


def _pending(left: list[Arrival]) -> str:
    """The pods left pending by shape, largest first: where the unallocated GPU went."""
    whole: dict[int, int] = {}
    for a in left:
        if not a.share_gib:
            whole[a.count] = whole.get(a.count, 0) + 1
    parts = [f"{n}x{c} GPU" for c, n in sorted(whole.items(), reverse=True)]
    shares = sorted((a.share_gib for a in left if a.share_gib), reverse=True)
    if shares:
        parts.append(f"{len(shares)} shares ({', '.join(f'{g}Gi' for g in shares)})")
    return ", ".join(parts) or "none"


def _row(kind: str, r: Result) -> str:
    return (
        f"{kind:15s} pods={r.pods} bound={r.bound} unallocated={r.unallocated_pct:5.1f}% "
        f"pods/s={r.pods_per_s:6.1f} (from start {r.pods_per_s_from_start:5.1f}, first bind "
        f"{r.first_bind_s:4.1f}s) p50={r.p50_ms:6.0f}ms p99={r.p99_ms:6.0f}ms "
        f"double={len(r.double_allocations)} invalid={len(r.invalid_allocations)}\n"
        f"{'':15s} CPU to first bind {r.first_bind_cpu_s:.2f}s; pending: {r.pending}"
        + (f"\n{'':15s} start-up (s from its process start): {_startup(r)}" if r.startup else "")
    )


def _startup(r: Result) -> str:
    return startup(
        {**{f"at_{k}_s": v for k, v in r.startup.items()}, "first_bind_s": r.first_bind_s}
    )


def _seed_run(args: argparse.Namespace, seed: int, opts: Options) -> dict[str, Any]:
    """One seed: both schedulers on the same sequence; the JSON object of that seed."""
    seq = arrivals(args.workload, args.nodes, seed)
    whole = sum(1 for a in seq if not a.share_gib)
    bound = packing_bound(seq, args.nodes)
    print(
        f"seed {seed}: {len(seq)} pods ({whole} whole-GPU, {len(seq) - whole} shares) on "
        f"{args.nodes} nodes x {GPUS_PER_NODE} GPUs; packing bound: no placement leaves less "
        f"than {bound:.2f}% unallocated",
        flush=True,
    )
    results: dict[str, Result] = {}
    for kind in ("kube_scheduler", "kallot"):
        if args.only and kind != args.only:
            continue
        results[kind] = run(kind, seq, args.nodes, opts)
        print(_row(kind, results[kind]), flush=True)
    out: dict[str, Any] = {
        k: {
            "unallocated_pct": r.unallocated_pct,
            "pods_per_s": r.pods_per_s,
            "p99_ms": r.p99_ms,
            "pods_per_s_from_start": r.pods_per_s_from_start,
            "first_bind_s": r.first_bind_s,
            "first_bind_cpu_s": r.first_bind_cpu_s,
            "startup_s": r.startup,
            "p50_ms": r.p50_ms,
            "bound": r.bound,
            "pods": r.pods,
            "pending": r.pending,
        }
        for k, r in results.items()
    }
    out["packing_bound_pct"] = bound
    audits = [x for r in results.values() for x in r.double_allocations + r.invalid_allocations]
    for line in audits:
        print("AUDIT", line)
    out["double_allocations"] = sum(len(r.double_allocations) for r in results.values())
    out["invalid_allocations"] = sum(len(r.invalid_allocations) for r in results.values())
    if not args.only:
        ks, ka = out["kube_scheduler"], out["kallot"]
        out["ratios"] = {
            key: ka[key] / ks[key] if ks[key] else float("inf")
            for key in ("unallocated_pct", "pods_per_s", "pods_per_s_from_start")
        }
        r = out["ratios"]
        print(
            f"ratios kallot/kube-scheduler: unallocated {r['unallocated_pct']:.2f}x "
            f"(target <= 0.7), throughput {r['pods_per_s']:.2f}x (target >= 1.0; from start "
            f"{r['pods_per_s_from_start']:.2f}x)",
            flush=True,
        )
    return out


def _mean_sd(xs: Sequence[float]) -> str:
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"{statistics.mean(xs):.2f} (sd {sd:.2f}, {min(xs):.2f}-{max(xs):.2f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=32)
    parser.add_argument("--seed", type=int, nargs="+", default=[42], help="one or more seeds")
    parser.add_argument("--workload", default="default")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--logs", type=Path, default=None, help="keep kallot's log here")
    parser.add_argument(
        "--only", choices=("kube_scheduler", "kallot"), default=None, help="one side only"
    )
    parser.add_argument(
        "--stream",
        action="store_true",
        help="create the claims and pods while the scheduler runs (default: drain: all "
        "created before the scheduler starts, so creation does not cap the rate)",
    )
    parser.add_argument(
        "--kube-qps",
        type=int,
        default=5000,
        help="kube-scheduler's client QPS and burst (its default, 50/100, caps it; 0 keeps it)",
    )
    args = parser.parse_args()
    opts = Options(
        drain=not args.stream, kube_qps=args.kube_qps, timeout=args.timeout, logs=args.logs
    )
    qps = f"qps/burst {args.kube_qps}" if args.kube_qps else "qps/burst default (50/100)"
    byte_compile_kallot()
    print(
        f"settings: mode {'drain' if opts.drain else 'stream'}; both as system:kube-scheduler, "
        f"both post a Scheduled Event per bind; kube-scheduler v1.36 default profile, {qps}; "
        "kallot scheduler default policy, no client rate limit, its modules byte-compiled "
        "before the runs as pip does in the image; each on a fresh control plane; 1-minute "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs",
        flush=True,
    )
    per_seed = {seed: _seed_run(args, seed, opts) for seed in args.seed}
    runs = list(per_seed.values())
    kinds = [k for k in ("kube_scheduler", "kallot") if not args.only or k == args.only]
    out: dict[str, Any] = {
        k: {
            key: statistics.mean(r[k][key] for r in runs)
            for key in ("unallocated_pct", "pods_per_s", "p99_ms", "pods_per_s_from_start")
        }
        for k in kinds
    }
    out["packing_bound_pct"] = statistics.mean(r["packing_bound_pct"] for r in runs)
    out["double_allocations"] = sum(r["double_allocations"] for r in runs)
    out["invalid_allocations"] = sum(r["invalid_allocations"] for r in runs)
    if len(runs) > 1:
        print(f"over seeds {' '.join(map(str, args.seed))} (mean, sd, range):")
        for k in kinds:
            print(
                f"  {k:15s} unallocated % {_mean_sd([r[k]['unallocated_pct'] for r in runs])}  "
                f"pods/s {_mean_sd([r[k]['pods_per_s'] for r in runs])}"
            )
        print(f"  packing bound % {_mean_sd([r['packing_bound_pct'] for r in runs])}")
        if not args.only:
            for key in ("unallocated_pct", "pods_per_s", "pods_per_s_from_start"):
                print(f"  ratio {key}: {_mean_sd([r['ratios'][key] for r in runs])}")
    if not args.only:
        out["ratios"] = {
            key: statistics.mean(r["ratios"][key] for r in runs)
            for key in ("unallocated_pct", "pods_per_s", "pods_per_s_from_start")
        }
    out["seeds"] = {str(k): v for k, v in per_seed.items()}
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 1 if out["double_allocations"] or out["invalid_allocations"] else 0


if __name__ == "__main__":
    sys.exit(main())
