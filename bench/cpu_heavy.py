"""The CPU-heavy openb family: the default trace's GPU pods with more and more CPU-only pods.

Issue 23 found kallot's lead over FGD almost gone on a trace where CPU, not GPU, runs out
first. That trace is held back, so this script builds a *family* of such traces from the default
one and measures on all of it: every variant keeps the default trace's GPU pods and replaces its
CPU-only pods with ``level x`` cpu200's count of them (1,768, 20% of cpu200's tasks), drawn with
replacement from the default trace's CPU-only pods (their shapes and lifetimes, new names). A
level of 1.0 is cpu200's CPU-only demand; the family's levels sit above it.

    python bench/cpu_heavy.py --levels 1.5,2,2.5,3 --seeds 42..51 --jobs 2 \
        --json bench/out/cpu_heavy.json

Prints, per level, FGD's and kallot's mean unallocated GPU % at arrived = 100% (the openb
metric, ``kallot.sim.openb``) and kallot's ratio to FGD measured in the same run.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from kallot.cli.sim_openb import _experiment, parse_seeds
from kallot.sim import trace

CPU200_CPU_ONLY = 1768  # CPU-only pods of openb_pod_list_cpu200.csv (fgd-protocol.md)
FIELDS = trace.POD_COLUMNS_FULL


def variant(default: Path, level: float, out: Path, seed: int = 0) -> Path:
    """Write the variant at ``level`` x cpu200's CPU-only count; returns its path."""
    with default.open() as f:
        rows = list(csv.DictReader(f))
    gpu = [r for r in rows if int(r["num_gpu"]) > 0]
    cpu = [r for r in rows if int(r["num_gpu"]) == 0]
    n = round(level * CPU200_CPU_ONLY)
    rng = np.random.default_rng(seed)
    drawn = [dict(cpu[i]) for i in rng.integers(0, len(cpu), size=n)]
    for i, r in enumerate(drawn):
        r["name"] = f"cpuheavy-pod-{i:05d}"
    path = out / f"openb_pod_list_cpuheavy{round(level * 200):03d}.csv"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        for r in gpu + drawn:
            w.writerow({k: r.get(k, "") for k in FIELDS})
    return path


def _one(job: tuple[str, str, int]) -> tuple[str, str, int, float]:
    run = _experiment(job)
    return job[0], job[1], job[2], float(run.unallocated_at(100))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--levels", default="1.5,2,2.5,3")
    ap.add_argument("--seeds", default="42..51")
    ap.add_argument("--policies", default="fgd,kallot")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default="bench/out/cpuheavy")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    default = trace.resolve_workload("default")
    levels = [float(x) for x in a.levels.split(",")]
    paths = {lv: str(variant(default, lv, out)) for lv in levels}
    pols = a.policies.split(",")
    jobs = [(paths[lv], p, s) for lv in levels for p in pols for s in parse_seeds(a.seeds)]
    with ProcessPoolExecutor(a.jobs) as pool:
        res = list(pool.map(_one, jobs))
    table: dict[str, Any] = {}
    for lv in levels:
        row: dict[str, Any] = {}
        for p in pols:
            vals = [u for w, q, _, u in res if w == paths[lv] and q == p]
            row[p] = float(np.mean(vals))
        if "fgd" in row and "kallot" in row:
            row["ratio"] = row["kallot"] / row["fgd"]
        table[f"{lv:g}"] = row
        print(f"level {lv:>4g} x cpu200: " + "  ".join(f"{k} {v:.3f}" for k, v in row.items()))
    if a.json:
        Path(a.json).write_text(json.dumps({"levels": table, "runs": res}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
