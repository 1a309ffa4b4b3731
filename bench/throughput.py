"""Scheduling throughput: placements per second of one session, per policy, same inputs.

Two clusters: the openb one (1,213 nodes, 6,212 GPUs) and a synthetic 10,000-node cluster of
8-GPU nodes (80,000 GPUs; openb's node mix replicated, with 8 GPUs per node). The pending tasks
are drawn (seeded) from the openb default pod list, enough to fill ~90% of the GPUs of the
synthetic cluster; every policy gets the same snapshot, tasks and seed. Prints placements/s and
each policy's ratio to first-fit (the cheapest policy) measured in the same run. Rates are per
CPU second of the process (the core is single-threaded), with the wall-clock rate beside them:
on a shared machine the wall clock also counts the time other processes hold the core.

    python bench/throughput.py --tasks 20000 --policies first-fit,fgd,kallot
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from kallot.config import presets
from kallot.core import frag, policies
from kallot.core.framework.runner import Framework
from kallot.core.scheduler import Scheduler
from kallot.core.snapshot import Snapshot
from kallot.core.workload import Task
from kallot.sim import openb, trace


def synthetic(nodes: list[trace.NodeRow], n: int) -> Snapshot:
    """``n`` nodes cycling through openb's node rows, each given 8 GPUs of its model."""
    rows = []
    for i in range(n):
        base = nodes[i % len(nodes)]
        rows.append(
            trace.NodeRow(
                name=f"syn-{i:05d}",
                cpu_milli=max(base.cpu_milli, 96000),
                memory_mib=max(base.memory_mib, 786432),
                gpus=8,
                model=base.model,
            )
        )
    return openb.snapshot_of(rows)


def measure(
    snapshot: Snapshot, tasks: list[Task], policy: str, target: frag.TargetWorkload, seed: int
) -> tuple[float, float, int]:
    """(wall s, CPU s of this process, placements) of one session. The core is single-threaded
    numpy, so CPU time is the one-core cost even when other processes share the machine."""
    fw = Framework(presets.profile(policy, target=target), policies.builtin_registry())
    sched = Scheduler(fw, explain=False)
    t0, c0 = time.perf_counter(), time.process_time()
    d = sched.run_session(snapshot, tasks, now=0.0, rng=np.random.default_rng(seed))
    return time.perf_counter() - t0, time.process_time() - c0, len(d.placements)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=10000)
    ap.add_argument("--tasks", type=int, default=20000)
    ap.add_argument("--policies", default="first-fit,fgd,kallot")
    ap.add_argument("--seed", type=int, default=42)
    a = ap.parse_args()
    nodes = trace.read_nodes(trace.bundled(trace.BUNDLED_NODES))
    pods = [p for p in trace.read_pods(trace.resolve_workload("default")) if p.num_gpu > 0]
    target = openb.target_workload(pods)
    rng = np.random.default_rng(a.seed)
    drawn = rng.choice(len(pods), size=a.tasks, replace=True)
    tasks = [openb.task_of(pods[int(j)], k) for k, j in enumerate(drawn)]
    tasks = [
        t.__class__(**{**{f: getattr(t, f) for f in t.__dataclass_fields__}, "id": f"t{k}"})
        for k, t in enumerate(tasks)
    ]
    clusters = {
        "openb (1,213 nodes)": openb.snapshot_of(nodes),
        f"synthetic ({a.nodes:,} nodes x 8 GPUs)": synthetic(nodes, a.nodes),
    }
    pols = a.policies.split(",")
    print(f"{a.tasks} pending GPU tasks drawn from openb default (seed {a.seed})")
    for cname, snap in clusters.items():
        n_tasks = tasks if snap.n_nodes > 2000 else tasks[: len(nodes) * 5]
        rates = {}
        print(f"\n{cname}: {snap.total_gpus()} GPUs, {len(n_tasks)} tasks")
        for p in pols:
            secs, cpu, placed = measure(snap, n_tasks, p, target, a.seed)
            rates[p] = placed / cpu
            print(
                f"  {p:10s} {placed:6d} placed in {cpu:6.2f} s CPU = {rates[p]:8.0f} placements/s"
                f"  (wall {secs:6.2f} s = {placed / secs:8.0f}/s;"
                f" {len(n_tasks) / cpu:8.0f} attempts/s)"
            )
        if "first-fit" in rates:
            print(
                "  ratio to first-fit: "
                + ", ".join(f"{p} {rates[p] / rates['first-fit']:.2f}" for p in pols)
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
