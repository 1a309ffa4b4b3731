"""What loses GPU allocation on the CPU-heavy openb family (a diagnostic, not a benchmark).

Replays one experiment of the protocol (``kallot.sim.openb``) on a family variant
(``bench/cpu_heavy.py``) and, up to the event where the arrived GPU request reaches 100% of
capacity, reports:

- where the CPU-only pods landed: the CPU they took on nodes whose GPUs were all full, on nodes
  with idle milli-GPU that the node's free CPU could feed (at the target's GPU CPU-per-GPU
  ratio), and on nodes whose CPU was already short of their idle GPU;
- the GPU pods that failed, as ``bench/openb_failures.py`` classifies them (*no-gpu-room*: no
  node has the GPUs; *cpu-short*: some node has the GPUs but not the CPU or memory);
- at 100%: the idle milli-GPU on nodes with under 4 CPUs free (stranded) and the CPU left on
  nodes with no idle GPU;
- ``cpu bound``: an honest upper bound on the GPU milli any policy could have allocated, given
  the CPU the CPU-only pods it placed took: the fractional knapsack of the arrived GPU pods
  into the cluster's CPU minus that CPU (by GPU per CPU, largest first), capped by the GPU
  capacity, and the same for memory; the smaller of the two. It ignores node boundaries, so it
  is optimistic; a policy cannot refuse a CPU-only pod it can place, so the CPU-only pods'
  CPU is taken as given.

    python bench/cpu_heavy_diag.py --levels 2 --seeds 42 --policies fgd,kallot
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path
from typing import cast

import numpy as np

from kallot.cli.sim_openb import load, parse_seeds
from kallot.config import presets
from kallot.core import policies
from kallot.core.frag import FragInputs
from kallot.core.framework.runner import Framework
from kallot.core.helpers.kallot_frag import cpu_per_gpu
from kallot.core.resources import MILLI
from kallot.core.scheduler import Scheduler
from kallot.sim import openb, trace

sys.path.insert(0, str(Path(__file__).parent))
from cpu_heavy import variant


def knapsack(gain: np.ndarray, cost: np.ndarray, budget: float, cap: float) -> float:
    """Max ``sum gain * x`` with ``sum cost * x <= budget``, ``sum gain * x <= cap``, x in [0, 1]."""
    order = np.argsort(-(gain / np.maximum(cost, 1e-9)))
    got, spent = 0.0, 0.0
    for i in order.tolist():
        if cost[i] <= 0:
            got += gain[i]
            continue
        take = min(1.0, (budget - spent) / cost[i])
        if take <= 0:
            break
        got += take * gain[i]
        spent += take * cost[i]
    return min(got, cap)


def fluid(path: str, seed: int) -> float:
    """Unallocated GPU % at 100% of the *fluid in-order* reference: the cluster as one node (its
    total CPU, memory and milli-GPU, no node or GPU boundaries), every pod placed in arrival
    order if the totals still take it. No fragmentation at all, and no refusal: what a policy
    that never refuses a pod it can place reaches when nothing is ever stranded."""
    _, nodes, pods = load(path)
    snapshot = openb.snapshot_of(nodes)
    capacity = int(snapshot.gpu_cap_milli[snapshot.gpu_valid].sum())
    rng = np.random.default_rng(seed)
    order = openb.arrival_order(pods, capacity, rng)
    cpu = float((snapshot.node_cpu_milli - snapshot.node_cpu_used).sum())
    mem = float((snapshot.node_mem_mib - snapshot.node_mem_used).sum())
    gpu, got, cum = float(capacity), 0.0, 0
    for i, p in enumerate(order):
        task = openb.task_of(p, i)
        cum += task.gpu_milli_total
        if cum > capacity:
            break
        g = task.gpu_milli_total
        if task.cpu_milli <= cpu and task.mem_mib <= mem and g <= gpu:
            cpu -= task.cpu_milli
            mem -= task.mem_mib
            gpu -= g
            got += g
    return 100.0 * (1 - got / capacity)


def diagnose(path: str, policy: str, seed: int) -> dict[str, float]:
    _, nodes, pods = load(path)
    snapshot = openb.snapshot_of(nodes)
    capacity = int(snapshot.gpu_cap_milli[snapshot.gpu_valid].sum())
    target = openb.target_workload(pods)
    ratio = cpu_per_gpu(FragInputs.build(target, snapshot.models))
    rng = np.random.default_rng(seed)
    order = openb.arrival_order(pods, capacity, rng)
    tasks = [openb.task_of(p, i) for i, p in enumerate(order)]
    framework = Framework(presets.profile(policy, target=target), policies.builtin_registry())
    decision = Scheduler(framework, explain=False).run_session(snapshot, tasks, now=0.0, rng=rng)
    placements = {p.task_id: p for p in decision.placements}
    valid = snapshot.gpu_valid
    left = np.where(valid, snapshot.gpu_cap_milli, 0).astype(np.int64)
    cpu_left = (snapshot.node_cpu_milli - snapshot.node_cpu_used).astype(np.int64)
    mem_left = (snapshot.node_mem_mib - snapshot.node_mem_used).astype(np.int64)
    cpu_total, mem_total = float(cpu_left.sum()), float(mem_left.sum())
    models = snapshot.models
    # A Counter (a missing key reads 0) that also holds the float summaries at the end;
    # typeshed types a Counter's values as int.
    out = cast(dict[str, float], Counter())
    gpu_gain, gpu_cpu, gpu_mem = [], [], []
    cum = 0
    for task in tasks:
        req = task.gpu
        cum += task.gpu_milli_total
        if cum > capacity:
            break
        if req is not None:
            gpu_gain.append(task.gpu_milli_total)
            gpu_cpu.append(task.cpu_milli)
            gpu_mem.append(task.mem_mib)
        p = placements.get(task.id)
        if p is not None:
            n = p.node_row
            if req is None:
                idle = int(left[n].sum())
                feedable = cpu_left[n] / ratio if ratio > 0 else float("inf")
                key = "full" if idle == 0 else ("fed" if feedable >= idle else "short")
                out[f"cpu-only on {key}"] += task.cpu_milli
                out["cpu-only cpu"] += task.cpu_milli
                out["cpu-only mem"] += task.mem_mib
            for d in p.devices:
                left[n, d.slot] -= d.milli
            cpu_left[n] -= task.cpu_milli
            mem_left[n] -= task.mem_mib
            continue
        if req is None:
            out["cpu-only failed cpu"] += task.cpu_milli
            continue
        allowed = valid.copy()
        if req.models:
            codes = [i for i, m in enumerate(models) if m in req.models]
            allowed &= np.isin(snapshot.gpu_model, codes)
        need = min(req.milli, MILLI)
        hosts = ((left >= need) & allowed).sum(axis=1) >= req.count
        if not hosts.any():
            cat = "no-gpu-room"
        else:
            ok = hosts & (cpu_left >= task.cpu_milli) & (mem_left >= task.mem_mib)
            cat = "cpu-short" if not ok.any() else "other"
            if not ok.any() and (hosts & (cpu_left >= task.cpu_milli)).any():
                out["failed mem-only"] += task.gpu_milli_total
        out[f"failed {cat}"] += task.gpu_milli_total
        out[f"shape {req.count}x{req.milli} cpu{task.cpu_milli // 1000}"] += task.gpu_milli_total
    idle = left.sum(axis=1)
    out["idle"] = float(idle.sum())
    out["idle on cpu<4"] = float(idle[cpu_left < 4000].sum())
    out["cpu left on gpu-full"] = float(cpu_left[idle == 0].sum())
    out["cpu left"] = float(cpu_left.sum())
    gain = np.array(gpu_gain, dtype=np.float64)
    bound = min(
        knapsack(gain, np.array(gpu_cpu, float), cpu_total - out["cpu-only cpu"], capacity),
        knapsack(gain, np.array(gpu_mem, float), mem_total - out["cpu-only mem"], capacity),
    )
    out["cpu bound unalloc %"] = 100.0 * (1 - bound / capacity)
    out["capacity"] = capacity
    out["cpu capacity"] = cpu_total
    return dict(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--levels", default="2")
    ap.add_argument("--seeds", default="42")
    ap.add_argument("--policies", default="fgd,kallot")
    ap.add_argument("--out", default="bench/out/cpuheavy")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    default = trace.resolve_workload("default")
    for lv in (float(x) for x in a.levels.split(",")):
        path = str(variant(default, lv, out))
        seeds = parse_seeds(a.seeds)
        ref = np.mean([fluid(path, s) for s in seeds])
        print(f"level {lv:g}: fluid in-order reference {ref:.2f}")
        for pol in filter(None, a.policies.split(",")):
            runs = [diagnose(path, pol, s) for s in seeds]
            keys = {k for r in runs for k in r}
            d = {k: float(np.mean([r.get(k, 0.0) for r in runs])) for k in keys}
            cap, cpu = d["capacity"], d["cpu capacity"]
            g = {k: 100 * d.get(k, 0.0) / cap for k in ("failed cpu-short", "failed no-gpu-room")}
            c = {
                k: 100 * d.get(k, 0.0) / cpu
                for k in ("cpu-only on full", "cpu-only on fed", "cpu-only on short")
            }
            print(
                f"level {lv:g} {pol}: failed GPU % of capacity "
                + ", ".join(f"{k} {v:.2f}" for k, v in g.items())
                + f"; cpu bound {d['cpu bound unalloc %']:.2f}"
                + f"; idle at 100% {100 * d['idle'] / cap:.2f}"
                + f" (on nodes with < 4 CPU free {100 * d['idle on cpu<4'] / cap:.2f})"
            )
            top = sorted((k for k in d if k.startswith("shape ")), key=lambda k: -d[k])[:6]
            print(
                f"   failed on memory alone {100 * d.get('failed mem-only', 0.0) / cap:.2f}; "
                + ", ".join(f"{k[6:]} {100 * d[k] / cap:.2f}" for k in top)
            )
            print(
                "   CPU-only pods' CPU, % of cluster CPU: "
                + ", ".join(f"{k} {v:.2f}" for k, v in c.items())
                + f"; failed {100 * d.get('cpu-only failed cpu', 0.0) / cpu:.2f}"
                + f"; CPU left {100 * d['cpu left'] / cpu:.2f}"
                + f" (on nodes with no idle GPU {100 * d['cpu left on gpu-full'] / cpu:.2f})"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
