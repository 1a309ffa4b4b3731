"""What any placement can reach on the CPU-heavy family: the packing LP with CPU and memory.

For each level of ``bench/cpu_heavy.py`` and each seed, at every event of the metric's window
(rounded arrival = 100%, averaged as ``openb.Run.unallocated_at(100)`` averages), the least
unallocated GPU % that ``sim.bounds.ResourceLP`` allows (the cluster as one node with its GPUs,
CPU and memory; node boundaries relaxed):

- ``lp_res``: any placement of any subset of the arrived pods. CPU-only pods may be left out,
  so this is the bound for a policy that refuses pods.
- ``lp_res|P``: any placement of the arrived GPU pods in the CPU and memory that policy P's
  placed CPU-only pods left (their CPU and memory taken as given). ``P - lp_res|P`` is what P
  lost on the GPU pods for the CPU-only pods it admitted: the CPU analogue of
  ``lp_given_placed`` (``kallot sim openb --bounds``).

    python bench/cpu_heavy_bounds.py --levels 1.25,1.5,2,3 --seeds 42..51 --policies kallot \
        --jobs 2 --json bench/out/cpu_heavy_bounds.json
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from cpu_heavy import family_args, family_paths  # bench/ is on sys.path as a script

from kallot.cli.sim_openb import load, parse_seeds
from kallot.core.resources import MILLI
from kallot.sim import openb
from kallot.sim.bounds import PodClass, ResourceLP, window


def one(path: str, seed: int, pols: list[str]) -> dict[str, Any]:
    _, nodes, pods = load(path)
    snap = openb.snapshot_of(nodes)
    capacity = int(snap.gpu_cap_milli[snap.gpu_valid].sum())
    cpu = float((snap.node_cpu_milli - snap.node_cpu_used).sum())
    mem = float((snap.node_mem_mib - snap.node_mem_used).sum())
    order = openb.arrival_order(pods, capacity, np.random.default_rng(seed))
    cls: list[PodClass | None] = [
        (min(p.gpu_milli, MILLI), p.num_gpu, p.cpu_milli, p.memory_mib) if p.num_gpu else None
        for p in order
    ]
    lp = ResourceLP([k for k in cls if k is not None], capacity / MILLI, cpu, mem)
    runs = {p: openb.run(nodes, pods, policy=p, seed=seed) for p in pols}
    events = window(runs[pols[0]].arrived_pct())
    inside = set(events.tolist())
    arrived: Counter[PodClass] = Counter()
    taken = {p: [0.0, 0.0] for p in pols}  # CPU and memory of P's placed CPU-only pods
    free: list[float] = []
    given: dict[str, list[float]] = {p: [] for p in pols}
    for i, pod in enumerate(order[: int(events[-1]) + 1]):
        k = cls[i]
        if k is not None:
            arrived[k] += 1
        else:
            for p in pols:
                if runs[p].placed[i]:
                    taken[p][0] += pod.cpu_milli
                    taken[p][1] += pod.memory_mib
        if i in inside:
            free.append(100.0 * (capacity - lp.max_allocated(arrived)) / capacity)
            for p in pols:
                bound = lp.max_allocated(arrived, taken[p][0], taken[p][1])
                given[p].append(100.0 * (capacity - bound) / capacity)
    out: dict[str, Any] = {"path": path, "seed": seed, "lp_res": float(np.mean(free))}
    for p in pols:
        out[p] = runs[p].unallocated_at(100)
        out[f"lp_res|{p}"] = float(np.mean(given[p]))
    return out


def main() -> int:
    a = family_args(__doc__, "1.25,1.5,2,3", "kallot")
    levels, paths = family_paths(a)
    pols = [p for p in a.policies.split(",") if p]
    jobs = [(paths[lv], s) for lv in levels for s in parse_seeds(a.seeds)]
    with ProcessPoolExecutor(a.jobs) as pool:
        recs = list(pool.map(one, *zip(*jobs, strict=True), [pols] * len(jobs)))
    cols = ["lp_res", *(c for p in pols for c in (p, f"lp_res|{p}"))]
    print(
        f"{'level':>6s} "
        + " ".join(f"{c:>14s}" for c in cols)
        + "  (means; min-max of P - lp_res|P)"
    )
    table: dict[str, Any] = {}
    for lv in levels:
        rs = [r for r in recs if r["path"] == paths[lv]]
        m: dict[str, Any] = {c: float(np.mean([r[c] for r in rs])) for c in cols}
        for p in pols:
            gap = [r[p] - r[f"lp_res|{p}"] for r in rs]
            m[f"{p}-lp_res|{p}"] = float(np.mean(gap))
            m[f"{p}-lp_res|{p} range"] = [float(min(gap)), float(max(gap))]
        table[f"{lv:g}"] = m
        spread = "; ".join(
            f"{p} - lp_res|{p} {m[f'{p}-lp_res|{p}']:.2f} "
            f"({m[f'{p}-lp_res|{p} range'][0]:.2f}-{m[f'{p}-lp_res|{p} range'][1]:.2f})"
            for p in pols
        )
        print(f"{lv:6g} " + " ".join(f"{m[c]:14.2f}" for c in cols) + f"  {spread}")
    if a.json:
        Path(a.json).write_text(json.dumps({"levels": table, "runs": recs}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
