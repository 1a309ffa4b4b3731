"""What any policy can reach on an openb workload: offline references for the unallocated %.

For one seed's arrival sequence (the protocol's shuffle and inflation, ``kallot.sim.openb``), take
the pods that arrive before the request reaches 100% of GPU capacity. At that point the
unallocated % equals the idle %, and once the cluster is full the idle milli are the tails of
shared GPUs, so all references look at how well the GPU requests can be packed into GPUs of
1000 milli. All ignore CPU, memory, node boundaries and GPU models, so all are optimistic:

- fractional lower bound: shares above 500 milli each need their own GPU; the rest of such a
  GPU can only be filled by shares of 500 or less that fit in it. The best fractional filling is
  the min cut ``min_x [sum(small shares < x) + sum(tails >= x)]``; no policy that places every
  share wastes less than ``sum(tails) - that``.
- configuration LP (``kallot.core.packing.ConfigLP``, the column generation kallot's score
  prices shares with): the LP relaxation of the best packing of any subset of the
  arrived requests into the cluster's GPUs, over *patterns* (multisets of share sizes that fit
  in one GPU, and the whole GPU, generated as the LP needs them). Its optimum is an upper bound on the milli-GPU that any
  policy, online or offline, can have allocated at that moment, so ``capacity - optimum`` bounds
  the unallocated % from below, for every policy. It is taken at every event of the metric's
  window (rounded arrival = 100%) and averaged as the metric is, so it compares directly with a
  policy's ``unallocated_pct_at_100``.
- the same LP *given a policy's big shares* (``lp|P``): with the constraint that at least as
  many shares of each size above 500 milli are placed as the policy had placed by that event. It
  bounds every policy that places as many of those shares as the given policy does; the
  difference to the free bound is what placing them costs.
- the same LP *given everything the policy placed* (``lp=P``): at least as many GPUs of every
  size as the policy had placed by that event. The best packing of (at least) the pods the
  policy placed: the difference to the policy's own metric is what its packing lost; the
  difference to the target is what only placing a different mix of pods could win.
- clairvoyant best-fit-decreasing: every GPU request known in advance, largest first, each on
  the tightest GPU (whole GPUs on idle ones); what does not fit is unallocated.

    python bench/openb_bounds.py --openb ../shared/data/openb --seeds 42..51 --policies fgd,kallot

The LP is solved with HiGHS (``highspy``, one of kallot's dependencies). ``lp`` and ``lp=P`` are
also what ``kallot sim openb --bounds`` reports (``lp %``, ``lp|placed %``: ``kallot.sim.bounds``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from openb_quality import WORKLOADS  # bench/ is on sys.path when run as a script

from kallot.cli.sim_openb import parse_seeds
from kallot.core.packing import ConfigLP
from kallot.core.resources import MILLI
from kallot.sim import openb, trace
from kallot.sim.bounds import window

BIG = 500  # shares above this cannot share a GPU with each other


def arrived_requests(pods: list[trace.PodRow], capacity: int, seed: int) -> list[int]:
    """Per-GPU requests (milli) of the pods arriving before 100% of capacity."""
    order = openb.arrival_order(pods, capacity, np.random.default_rng(seed))
    total, out = 0, []
    for p in order:
        total += p.gpu_milli_total
        if total > capacity:
            break
        out.extend([p.gpu_milli] * p.num_gpu)
    return out


def fractional_bound(requests: list[int], capacity: int) -> float:
    shares = np.array([r for r in requests if r < MILLI], dtype=np.int64)
    tails = MILLI - shares[shares > BIG]
    small = shares[shares <= BIG]
    cuts = np.unique(np.concatenate([[0, 10**6], small, small + 1, tails, tails + 1]))
    filled = min(int(small[small < x].sum() + tails[tails >= x].sum()) for x in cuts)
    return 100.0 * (int(tails.sum()) - filled) / capacity


def best_fit_decreasing(requests: list[int], capacity: int) -> float:
    gpus = capacity // MILLI
    level = np.zeros(MILLI + 1, dtype=np.int64)  # GPUs per free-milli level
    level[MILLI] = gpus
    failed = 0
    for r in sorted(requests, reverse=True):
        room = np.flatnonzero(level[r:])
        if room.size == 0:
            failed += r
            continue
        free = r + int(room[0])
        level[free] -= 1
        level[free - r] += 1
    return 100.0 * failed / capacity


def one_seed(wl: str, path: Path, seed: int, pols: list[str]) -> dict[str, Any]:
    """The references for one workload and seed, and each policy's metric and LP given its big
    shares."""
    nodes = trace.read_nodes(trace.bundled(trace.BUNDLED_NODES))
    pods = trace.read_pods(path)
    snap = openb.snapshot_of(nodes)
    capacity = int(snap.gpu_cap_milli[snap.gpu_valid].sum())
    gpus = int(snap.gpu_valid.sum())
    order = openb.arrival_order(pods, capacity, np.random.default_rng(seed))
    req = arrived_requests(pods, capacity, seed)
    lp = ConfigLP({min(p.gpu_milli, MILLI) for p in order if p.num_gpu} | {MILLI}, gpus)
    cum = np.cumsum([p.gpu_milli_total for p in order])
    events = window(np.rint(100.0 * cum / capacity).astype(np.int64))
    out: dict[str, Any] = {
        "workload": wl,
        "seed": seed,
        "fractional": fractional_bound(req, capacity),
        "bfd": best_fit_decreasing(req, capacity),
    }
    runs = {p: openb.run(nodes, pods, policy=p, seed=seed, workload=wl) for p in pols}
    arrived: Counter[int] = Counter()
    placed: dict[str, Counter[int]] = {p: Counter() for p in pols}  # big shares
    placed_all: dict[str, Counter[int]] = {p: Counter() for p in pols}
    free: list[float] = []  # per window event
    given: dict[str, list[float]] = {p: [] for p in pols}
    given_all: dict[str, list[float]] = {p: [] for p in pols}
    last = int(events[-1])
    inside = set(events.tolist())
    for i, pod in enumerate(order[: last + 1]):
        if pod.num_gpu:
            arrived[min(pod.gpu_milli, MILLI)] += pod.num_gpu
            for p in pols:
                if runs[p].placed[i]:
                    placed_all[p][min(pod.gpu_milli, MILLI)] += pod.num_gpu
                    if pod.gpu_milli > BIG:
                        placed[p][min(pod.gpu_milli, MILLI)] += pod.num_gpu
        if i in inside:
            free.append(100.0 * (capacity - lp.max_allocated(arrived)) / capacity)
            for p in pols:
                bound = lp.max_allocated(arrived, placed[p])
                given[p].append(100.0 * (capacity - bound) / capacity)
                bound = lp.max_allocated(arrived, placed_all[p])
                given_all[p].append(100.0 * (capacity - bound) / capacity)
    out["lp"] = float(np.mean(free))
    for p in pols:
        out[p] = runs[p].unallocated_at(100)
        out[f"lp|{p}"] = float(np.mean(given[p]))
        out[f"lp={p}"] = float(np.mean(given_all[p]))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--openb", type=Path, required=True)
    ap.add_argument("--seeds", default="42")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--policies", default="fgd,kallot", help="policies to run and bound")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json", type=Path, help="write every (workload, seed) record here")
    a = ap.parse_args()
    pols = [p for p in a.policies.split(",") if p]
    wls = a.workloads.split(",")
    jobs = [(wl, s) for wl in wls for s in parse_seeds(a.seeds)]
    with ProcessPoolExecutor(max_workers=a.jobs) as pool:
        futures = [
            pool.submit(one_seed, wl, a.openb / f"openb_pod_list_{wl}.csv", s, pols)
            for wl, s in jobs
        ]
        recs = []
        for k, f in enumerate(futures):
            recs.append(f.result())
            print(f"[{k + 1}/{len(jobs)}] {jobs[k]}", file=sys.stderr)
    cols = ["fractional", "lp", "bfd"]
    for p in pols:
        cols += [p, f"lp|{p}", f"lp={p}"]
    head = f"{'workload':12s} {'seed':>4s} " + " ".join(f"{c:>11s}" for c in cols)
    print(head)
    for r in recs:
        print(f"{r['workload']:12s} {r['seed']:4d} " + " ".join(f"{r[c]:11.2f}" for c in cols))
    print("\nmeans over seeds" + ("; target = 0.85 x fgd" if "fgd" in pols else ""))
    extra = ["target"] if "fgd" in pols else []
    print(f"{'workload':12s} " + " ".join(f"{c:>11s}" for c in cols + extra))
    for wl in wls:
        rs = [r for r in recs if r["workload"] == wl]
        m = {c: float(np.mean([r[c] for r in rs])) for c in cols}
        if extra:
            m["target"] = 0.85 * m["fgd"]
        print(f"{wl:12s} " + " ".join(f"{m[c]:11.2f}" for c in cols + extra))
    if a.json:
        a.json.write_text(json.dumps(recs, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
