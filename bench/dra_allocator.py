"""The pure DRA allocator (``kallot.core.dra``): kallot's policy vs kube-scheduler's first fit.

One ``gpu.nvidia.com``-shaped node per scenario (``kallot.testing.dra``), the same seeded churn
for both policies: each event releases a random allocated claim (probability ``--release``) or
allocates a new one; a claim that fails although the node has enough free resource in total is
a *fragmentation failure* (what a better placement avoids). Prints, per scenario and policy,
claims placed and fragmentation failures summed over the seeds, and the allocate() latency
(median of the per-seed p50s, largest p99; CPU time of this process), plus kallot/first-fit
ratios from the same run.

- ``whole``: 8 GPUs on 2 PCIe roots; claims of 1, 2 or 4 GPUs, multi-GPU ones with
  ``matchAttribute: resource.kubernetes.io/pcieRoot``; enough = free GPUs >= count.
- ``mig``: 4 A100s as dynamic-MIG partitions (counters); 1g/2g/3g/4g/7g claims; enough = free
  memory slices >= the profile's.
- ``mig8``: the same with 8 A100s (152 partitions): the latency of a large node.
- ``share``: 4 consumable-capacity GPUs (80Gi, 1Gi steps); 8-40Gi claims; enough = free
  memory in total >= the request.

    python bench/dra_allocator.py --events 400 --seeds 1..5
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from kallot.config.dra import claim_from_json, device_class_from_json, slice_from_json
from kallot.core.dra.allocator import Inventory, Policy, allocate
from kallot.core.dra.model import ClaimAllocation, ResourceClaim, assemble_pools
from kallot.core.dra.policy import FirstFit, KallotPolicy
from kallot.testing.dra import (
    A100_PROFILES,
    NVIDIA,
    claim,
    exactly,
    nvidia_classes,
    nvidia_node_slices,
)

ROOT = "resource.kubernetes.io/pcieRoot"
A = f"device.attributes['{NVIDIA}']"


@dataclass
class Scenario:
    name: str
    slices: list[dict[str, Any]]
    make: Callable[[random.Random, int], tuple[dict[str, Any], float]]  # claim, its size
    free: Callable[[Inventory], float]


def _whole(rng: random.Random, k: int) -> tuple[dict[str, Any], float]:
    n = rng.choice([1, 1, 1, 2, 2, 4])
    con = [{"matchAttribute": ROOT}] if n > 1 else None
    return claim(f"c{k}", [exactly("gpu", "gpu.nvidia.com", count=n)], constraints=con), n


def _mig(rng: random.Random, k: int) -> tuple[dict[str, Any], float]:
    profile, slices, *_ = rng.choices(A100_PROFILES, weights=[6, 3, 2, 1, 0.5])[0]
    sel = [f"{A}.profile == '{profile}'"]
    return claim(f"c{k}", [exactly("mig", "mig.nvidia.com", selectors=sel)]), slices


def _share(rng: random.Random, k: int) -> tuple[dict[str, Any], float]:
    gib = rng.choice([8, 10, 16, 20, 24, 40])
    req = exactly("s", "gpu.nvidia.com", capacity={"requests": {"memory": f"{gib}Gi"}})
    return claim(f"c{k}", [req]), gib


def _used(inv: Inventory) -> set[str]:
    return {r.device for a in inv.allocated for r in a.results}


def _free_whole(inv: Inventory) -> float:
    return sum(1 for p in inv.pools for d in p.devices if d.name not in _used(inv))


def _free_mig(inv: Inventory) -> float:
    taken = 0
    by_name = {d.name: d for p in inv.pools for d in p.devices}
    for a in inv.allocated:
        for r in a.results:
            cs = by_name[r.device].consumes
            taken += sum(1 for c in next(iter(cs.values())) if c.startswith("memory-slice-"))
    return 8 * len(next(iter(inv.pools)).counters) - taken


def _free_share(inv: Inventory) -> float:
    total = sum(d.capacity[f"{NVIDIA}/memory"].value for p in inv.pools for d in p.devices)
    used = sum(v for a in inv.allocated for r in a.results for v in r.consumed.values())
    return float((total - used) / 2**30)


SCENARIOS = {
    "whole": Scenario("whole", nvidia_node_slices("n1", gpus=8), _whole, _free_whole),
    "mig": Scenario("mig", nvidia_node_slices("n1", gpus=0, dynamic_mig=4), _mig, _free_mig),
    "mig8": Scenario("mig8", nvidia_node_slices("n1", gpus=0, dynamic_mig=8), _mig, _free_mig),
    "share": Scenario("share", nvidia_node_slices("n1", gpus=0, shared=4), _share, _free_share),
}


def run(sc: Scenario, policy: Policy, events: int, release: float, seed: int) -> dict[str, Any]:
    pools, _ = assemble_pools([slice_from_json(s) for s in sc.slices])
    classes = {c.name: c for c in map(device_class_from_json, nvidia_classes())}
    rng = random.Random(seed)
    live: dict[str, ClaimAllocation] = {}
    placed = frag = 0
    times: list[float] = []
    for k in range(events):
        inv = Inventory(pools, classes, list(live.values()))
        if live and rng.random() < release:
            del live[rng.choice(sorted(live))]
            continue
        body, size = sc.make(rng, k)
        c: ResourceClaim = claim_from_json(body)
        t = time.process_time()
        out = allocate([c], "n1", {}, inv, policy=policy)
        times.append(time.process_time() - t)
        if out.ok:
            live[c.key] = out.allocations[c.key]
            placed += 1
        elif sc.free(inv) >= size:
            frag += 1
    times.sort()
    return {
        "placed": placed,
        "fragmentation_failures": frag,
        "p50_ms": 1000 * times[len(times) // 2],
        "p99_ms": 1000 * times[min(len(times) - 1, int(len(times) * 0.99))],
    }


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--events", type=int, default=400)
    ap.add_argument("--release", type=float, default=0.35)
    ap.add_argument("--seeds", default="1..5", help="a..b: runs summed over these seeds")
    ap.add_argument("--scenarios", default="whole,mig,share")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    report: dict[str, Any] = {}
    print(
        f"{'scenario':8} {'policy':10} {'placed':>6} {'frag fails':>10} {'p50 ms':>8} {'p99 ms':>8}"
    )
    for name in args.scenarios.split(","):
        sc = SCENARIOS[name]
        row = {}
        for label, policy in (("first-fit", FirstFit()), ("kallot", KallotPolicy())):
            lo, _, hi = args.seeds.partition("..")
            runs = [
                run(sc, policy, args.events, args.release, seed)
                for seed in range(int(lo), int(hi or lo) + 1)
            ]
            r = {
                "placed": sum(x["placed"] for x in runs),
                "fragmentation_failures": sum(x["fragmentation_failures"] for x in runs),
                "p50_ms": sorted(x["p50_ms"] for x in runs)[len(runs) // 2],
                "p99_ms": max(x["p99_ms"] for x in runs),
            }
            row[label] = r
            print(
                f"{name:8} {label:10} {r['placed']:6d} {r['fragmentation_failures']:10d} "
                f"{r['p50_ms']:8.2f} {r['p99_ms']:8.2f}"
            )
        ff, ka = row["first-fit"], row["kallot"]
        ratio = Fraction(ka["fragmentation_failures"], max(1, ff["fragmentation_failures"]))
        print(
            f"{name:8} ratios     placed x{ka['placed'] / max(1, ff['placed']):.2f}, "
            f"fragmentation failures x{float(ratio):.2f}, p50 latency x{ka['p50_ms'] / max(1e-9, ff['p50_ms']):.1f}"
        )
        report[name] = row
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
