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
- configuration LP (``ConfigLP``): the LP relaxation of the best packing of any subset of the
  arrived requests into the cluster's GPUs, over *patterns* (every multiset of share sizes that
  fits in one GPU, and the whole GPU). Its optimum is an upper bound on the milli-GPU that any
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

The LP is solved with HiGHS (``highspy``, one of kallot's dependencies: ``core.packing`` uses it
for kallot's default score).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import highspy
import numpy as np
from openb_quality import WORKLOADS  # bench/ is on sys.path when run as a script

from kallot.cli.sim_openb import parse_seeds
from kallot.sim import openb, trace

MILLI = 1000
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


def patterns(sizes: list[int]) -> list[tuple[int, ...]]:
    """Every nonempty multiset of ``sizes`` (milli, < 1000) whose sum fits in one GPU."""
    sizes = sorted(set(sizes))
    out: list[tuple[int, ...]] = []

    def grow(start: int, room: int, cur: list[int]) -> None:
        if cur:
            out.append(tuple(cur))
        for i in range(start, len(sizes)):
            if sizes[i] > room:
                break
            cur.append(sizes[i])
            grow(i, room - sizes[i], cur)
            cur.pop()

    grow(0, MILLI, [])
    return out


class ConfigLP:
    """The configuration LP: ``max sum_p x_p * milli(p) + 1000 * y`` over ``x_p >= 0`` GPUs
    packed with pattern ``p`` and ``y`` whole GPUs, subject to ``sum_p x_p + y <= gpus`` and, per
    share size ``s``, ``at_least[s] <= sum_p x_p * count(s, p) <= available[s]`` (whole GPUs
    likewise, a k-GPU pod counting as k whole GPUs). Every real placement is a feasible point, so
    the optimum bounds the allocated milli from above. One HiGHS model is kept and only the row
    bounds change between solves, so a solve after a few more arrivals is a warm start."""

    def __init__(self, sizes: list[int], gpus: int) -> None:
        self.sizes = sorted({s for s in sizes if s < MILLI})
        self.pats = patterns(self.sizes)
        h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        n = len(self.pats) + 1  # the last column: whole GPUs
        h.addVars(n, np.zeros(n), np.full(n, highspy.kHighsInf))
        h.changeColsCost(n, np.arange(n), np.array([sum(p) for p in self.pats] + [MILLI], float))
        h.changeObjectiveSense(highspy.ObjSense.kMaximize)
        h.addRow(0.0, float(gpus), n, np.arange(n), np.ones(n))
        for s in [*self.sizes, MILLI]:
            if s == MILLI:
                cols, vals = np.array([n - 1]), np.array([1.0])
            else:
                cols = np.array([j for j, p in enumerate(self.pats) if s in p])
                vals = np.array([float(self.pats[j].count(s)) for j in cols])
            h.addRow(0.0, 0.0, cols.size, cols, vals)
        self._h = h

    def max_allocated(
        self, available: Mapping[int, int], at_least: Mapping[int, int] | None = None
    ) -> float:
        """The LP optimum (milli) for the given request counts per size."""
        at_least = at_least or {}
        for i, s in enumerate([*self.sizes, MILLI]):
            hi = float(available.get(s, 0))
            self._h.changeRowBounds(i + 1, min(float(at_least.get(s, 0)), hi), hi)
        self._h.run()
        status = self._h.getModelStatus()
        if status != highspy.HighsModelStatus.kOptimal:
            raise RuntimeError(f"configuration LP: {self._h.modelStatusToString(status)}")
        return float(self._h.getInfo().objective_function_value)


def _window(pct: np.ndarray) -> np.ndarray:
    """Events the metric averages (``openb.Run._at`` for x = 100, without the last fallback)."""
    hit = pct == 100
    return hit if hit.any() else np.abs(pct - 100) <= 1


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
    lp = ConfigLP([p.gpu_milli for p in order if 0 < p.gpu_milli < MILLI], gpus)
    cum = np.cumsum([p.gpu_milli_total for p in order])
    window = np.flatnonzero(_window(np.rint(100.0 * cum / capacity).astype(np.int64)))
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
    last = int(window[-1])
    for i, pod in enumerate(order[: last + 1]):
        if pod.num_gpu:
            arrived[min(pod.gpu_milli, MILLI)] += pod.num_gpu
            for p in pols:
                if runs[p].placed[i]:
                    placed_all[p][min(pod.gpu_milli, MILLI)] += pod.num_gpu
                    if pod.gpu_milli > BIG:
                        placed[p][min(pod.gpu_milli, MILLI)] += pod.num_gpu
        if i in window:
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
