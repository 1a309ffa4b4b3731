"""What any policy can reach on an openb workload: two offline references for the unallocated %.

For one seed's arrival sequence (the protocol's shuffle and inflation, ``kallot.sim.openb``), take
the pods that arrive before the request reaches 100% of GPU capacity. At that point the
unallocated % equals the idle %, and once the cluster is full the idle milli are the tails of
shared GPUs, so both references look at how well the shares can be packed. Both ignore CPU, memory,
node boundaries and GPU models, so both are optimistic:

- fractional lower bound: shares above 500 milli each need their own GPU; the rest of such a
  GPU can only be filled by shares of 500 or less that fit in it. The best fractional filling is
  the min cut ``min_x [sum(small shares < x) + sum(tails >= x)]``; no policy, online or offline,
  wastes less than ``sum(tails) - that``.
- clairvoyant best-fit-decreasing: every GPU request known in advance, largest first, each on
  the tightest GPU (whole GPUs on idle ones); what does not fit is unallocated.

    python bench/openb_bounds.py --openb ../shared/data/openb --seeds 42,43
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from openb_quality import WORKLOADS  # bench/ is on sys.path when run as a script

from kallot.cli.sim_openb import parse_seeds
from kallot.sim import openb, trace


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
    shares = np.array([r for r in requests if r < 1000], dtype=np.int64)
    tails = 1000 - shares[shares > 500]
    small = shares[shares <= 500]
    cuts = np.unique(np.concatenate([[0, 10**6], small, small + 1, tails, tails + 1]))
    filled = min(int(small[small < x].sum() + tails[tails >= x].sum()) for x in cuts)
    return 100.0 * (int(tails.sum()) - filled) / capacity


def best_fit_decreasing(requests: list[int], capacity: int) -> float:
    gpus = capacity // 1000
    level = np.zeros(1001, dtype=np.int64)  # GPUs per free-milli level
    level[1000] = gpus
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--openb", type=Path, required=True)
    ap.add_argument("--seeds", default="42")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    a = ap.parse_args()
    nodes = trace.read_nodes(trace.bundled(trace.BUNDLED_NODES))
    snap = openb.snapshot_of(nodes)
    capacity = int(snap.gpu_cap_milli[snap.gpu_valid].sum())
    print(f"{'workload':12s} {'seed':>4s} {'fractional LB %':>16s} {'clairvoyant BFD %':>18s}")
    for wl in a.workloads.split(","):
        pods = trace.read_pods(a.openb / f"openb_pod_list_{wl}.csv")
        for seed in parse_seeds(a.seeds):
            req = arrived_requests(pods, capacity, seed)
            lb, bfd = fractional_bound(req, capacity), best_fit_decreasing(req, capacity)
            print(f"{wl:12s} {seed:4d} {lb:16.2f} {bfd:18.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
