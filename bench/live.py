"""Live scheduling throughput and latency: kallot against the real kube-scheduler, on the same
control plane in the same run.

For each cluster size, a fresh etcd + kube-apiserver + kube-scheduler (default profile) gets N
fake GPU nodes (8 whole GPUs each, with kallot's inventory); then the same batch of pods asking
``nvidia.com/gpu: 1`` is created once for kube-scheduler and once for kallot (``kallot
scheduler`` in a subprocess). A watch records when each pod is seen bound; latency is that
time minus the time its create was sent. Prints pods bound per second, p50/p99 latency, peak
RSS of each scheduler process, and kallot/kube-scheduler ratios. Run after `make controlplane`:

    .venv/bin/python bench/live.py [--nodes 1000 5000] [--pods 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from kallot.kube.client import KubeClient
from kallot.testing.controlplane import ControlPlane, create_nodes
from kallot.testing.live import SchedulerProcess, inventory_node_body, pod_body

NS = "default"


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument(
        "--kube-qps",
        type=int,
        default=0,
        help="kube-scheduler clientConnection qps and burst (0: its defaults, qps 50 burst 100)",
    )
    args = parser.parse_args()
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
