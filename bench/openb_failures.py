"""Which pods fail before arrived = 100% on openb, and why (a diagnostic, not a benchmark).

At arrived = 100% of GPU capacity the request equals the capacity, so the unallocated % is the
GPU request of the pods that failed so far. This replays one experiment of the protocol
(``kallot.sim.openb``) and, at each GPU pod that fails before the arrived request passes
100.5% of capacity, classifies the cluster state:

- ``no-gpu-room``: no node has the pod's GPUs (k GPUs of an allowed model with >= milli free
  each) at all: a packing failure;
- ``cpu-short``: some node has the GPUs but not the CPU (or memory) the pod needs: stranded;
- it also records how many GPUs had >= milli free anywhere (any model), to tell model
  scarcity from a cluster-wide lack of room.

    python bench/openb_failures.py --openb ../shared/data/openb --workloads gpushare80 \
        --seeds 42,43 --policies fgd,kallot
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import TypedDict

import numpy as np

from kallot.cli.sim_openb import load, parse_seeds
from kallot.config import presets
from kallot.core import policies
from kallot.core.framework.runner import Framework
from kallot.core.resources import MILLI
from kallot.core.scheduler import Scheduler
from kallot.sim import openb


class Diagnosis(TypedDict):
    by_cpu: Counter[str]
    capacity: int
    failed: Counter[str]
    shapes: dict[str, Counter[str]]
    idle_levels: Counter[int]
    idle_total: int
    cpu_short_idle: int


def diagnose(path: str, policy: str, seed: int) -> Diagnosis:
    _, nodes, pods = load(path)
    snapshot = openb.snapshot_of(nodes)
    capacity = int(snapshot.gpu_cap_milli[snapshot.gpu_valid].sum())
    target = openb.target_workload(pods)
    rng = np.random.default_rng(seed)
    order = openb.arrival_order(pods, capacity, rng)
    tasks = [openb.task_of(p, i) for i, p in enumerate(order)]
    framework = Framework(presets.profile(policy, target=target), policies.builtin_registry())
    decision = Scheduler(framework, explain=False).run_session(snapshot, tasks, now=0.0, rng=rng)
    placements = {p.task_id: p for p in decision.placements}
    valid = snapshot.gpu_valid
    left = np.where(valid, snapshot.gpu_cap_milli, -1).astype(np.int64)
    cpu_left = (snapshot.node_cpu_milli - snapshot.node_cpu_used).astype(np.int64)
    mem_left = (snapshot.node_mem_mib - snapshot.node_mem_used).astype(np.int64)
    models = snapshot.models
    cum = 0
    failed: Counter[str] = Counter()  # category -> milli
    shapes: dict[str, Counter[str]] = defaultdict(Counter)  # category -> shape -> milli
    for task in tasks:
        cum += task.gpu_milli_total
        if cum > 1.005 * capacity:
            break
        p = placements.get(task.id)
        if p is not None:
            for d in p.devices:
                left[p.node_row, d.slot] -= d.milli
            cpu_left[p.node_row] -= task.cpu_milli
            mem_left[p.node_row] -= task.mem_mib
            continue
        req = task.gpu
        if req is None:
            continue
        allowed = valid.copy()
        if req.models:
            codes = [i for i, m in enumerate(models) if m in req.models]
            allowed &= np.isin(snapshot.gpu_model, codes)
        need = req.milli if req.milli < MILLI else MILLI
        room = (left >= need) & allowed
        per_node = room.sum(axis=1)
        hosts = per_node >= req.count
        if not hosts.any():
            cat = "no-gpu-room"
            any_model = int(((left >= need) & valid).sum())
            if req.models and any_model >= req.count:
                cat = "no-gpu-room (model)"
        else:
            ok = hosts & (cpu_left >= task.cpu_milli) & (mem_left >= task.mem_mib)
            cat = "cpu-short" if not ok.any() else "other"
        milli = task.gpu_milli_total
        failed[cat] += milli
        shape = f"{req.count}x{req.milli} cpu{task.cpu_milli // 1000}"
        if req.models:
            shape += "/" + "+".join(sorted(req.models))
        shapes[cat][shape] += milli
    # Idle milli at the end by free level of a GPU.
    idle = left[valid & (left > 0)]
    levels = Counter(int(x) for x in idle)
    fillable = valid & (left >= 230)
    by_cpu: Counter[str] = Counter()
    for lo, hi in ((0, 4000), (4000, 8000), (8000, 11000), (11000, 10**9)):
        rows = (cpu_left >= lo) & (cpu_left < hi)
        by_cpu[f"cpu {lo // 1000}-{min(hi, 99000) // 1000}"] += int(
            np.where(fillable, left, 0)[rows].sum()
        )
    return {
        "by_cpu": by_cpu,
        "capacity": capacity,
        "failed": failed,
        "shapes": shapes,
        "idle_levels": levels,
        "idle_total": int(idle.sum()),
        "cpu_short_idle": int(np.where(valid & (left > 0), left, 0)[cpu_left < 1000].sum()),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--openb", type=Path, required=True)
    ap.add_argument("--workloads", default="gpushare80,gpushare40")
    ap.add_argument("--seeds", default="42,43")
    ap.add_argument("--policies", default="fgd,kallot")
    a = ap.parse_args()
    for wl in a.workloads.split(","):
        for pol in a.policies.split(","):
            tot: Counter[str] = Counter()
            shp: dict[str, Counter[str]] = defaultdict(Counter)
            lev: Counter[int] = Counter()
            cap = 0
            seeds = parse_seeds(a.seeds)
            short = 0
            byc: Counter[str] = Counter()
            for seed in seeds:
                d = diagnose(str(a.openb / f"openb_pod_list_{wl}.csv"), pol, seed)
                cap = int(d["capacity"])
                tot.update(d["failed"])
                for k, v in d["shapes"].items():
                    shp[k].update(v)
                lev.update(d["idle_levels"])
                short += int(d["cpu_short_idle"])
                byc.update(d["by_cpu"])
            n = len(seeds)
            pct = {k: 100.0 * v / cap / n for k, v in tot.items()}
            print(f"== {wl} {pol} (mean of {n} seeds): failed GPU request, % of capacity")
            print(
                f"   total {sum(pct.values()):.2f}: "
                + ", ".join(f"{k} {v:.2f}" for k, v in sorted(pct.items()))
            )
            for k, c in shp.items():
                top = ", ".join(f"{s} {100.0 * m / cap / n:.2f}" for s, m in c.most_common(6))
                print(f"   {k}: {top}")
            idle = sum(lv * c for lv, c in lev.items())
            print(
                f"   idle at the end {100.0 * idle / cap / n:.2f}% (of it on nodes with < 1 CPU"
                f" free {100.0 * short / cap / n:.2f}); by free level (GPUs/seed): "
                + ", ".join(
                    f"{lv}:{c / n:.0f}"
                    for lv, c in sorted(lev.items(), key=lambda t: -t[0] * t[1])[:10]
                )
            )
            print(
                "   idle on GPUs with >= 230 free, by the node's free CPU: "
                + ", ".join(f"{k} {100.0 * v / cap / n:.2f}" for k, v in sorted(byc.items()))
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
