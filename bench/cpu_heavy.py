"""The CPU-heavy openb family: the default trace's GPU pods with more and more CPU-only pods.

Issue 23 found kallot's lead over FGD almost gone on a trace where CPU, not GPU, runs out
first. That trace is held back, so this script builds a *family* of such traces from the default
one and measures on all of it: every variant keeps the default trace's GPU pods and replaces its
CPU-only pods with ``level x`` cpu200's count of them (1,768, 20% of cpu200's tasks), drawn with
replacement from the default trace's CPU-only pods (their shapes and lifetimes, new names). A
level of 1.0 is cpu200's CPU-only demand; the family's levels sit above it.

    python bench/cpu_heavy.py --levels 1.1,1.25,1.5,2,3 --seeds 42..51 --jobs 2 \
        --json bench/out/cpu_heavy.json

Prints, per level, ``rho`` (the target's CPU at GPU capacity over the cluster's CPU,
``helpers.kallot_frag.cpu_scarcity``: kallot's CpuReserve acts from 1 on) and per policy the
mean unallocated GPU % at arrived = 100% (the openb metric, ``kallot.sim.openb``) with its
per-seed range, then the CPU side of the same moment: the CPU of the CPU-only pods that failed
up to arrived = 100% and the CPU in use then, both in % of the cluster's CPU; and kallot's
ratio to FGD measured in the same run.
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

from kallot.cli.sim_openb import _experiment, load, parse_seeds
from kallot.core import frag
from kallot.core.helpers.kallot_frag import cpu_scarcity
from kallot.sim import openb, trace

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


def rho(path: str) -> float:
    """``cpu_scarcity`` of the variant's target workload on the bundled cluster."""
    _, nodes, pods = load(path)
    snapshot = openb.snapshot_of(nodes)
    inputs = frag.FragInputs.build(openb.target_workload(pods), snapshot.models)
    return cpu_scarcity(inputs, snapshot)


def _one(job: tuple[str, str, int]) -> tuple[str, str, int, float, float, float]:
    """(path, policy, seed, unallocated GPU %, failed CPU-only CPU %, CPU used %) at the event
    where the arrived GPU request reaches 100% (the CPU in % of the cluster's CPU)."""
    run = _experiment(job)
    _, nodes, pods = load(job[0])
    order = openb.arrival_order(pods, run.capacity_milli, np.random.default_rng(job[2]))
    cum = np.cumsum([p.gpu_milli_total for p in order])
    k = int(np.searchsorted(cum, run.capacity_milli, side="right"))
    cpu = np.array([p.cpu_milli for p in order[:k]], dtype=np.float64)
    cpu_only = np.array([p.num_gpu == 0 for p in order[:k]])
    total = float(sum(n.cpu_milli for n in nodes if n.gpus > 0))
    placed = run.placed[:k]
    failed = 100.0 * float(cpu[cpu_only & ~placed].sum()) / total
    used = 100.0 * float(cpu[placed].sum()) / total
    return job[0], job[1], job[2], float(run.unallocated_at(100)), failed, used


def family_args(doc: str, levels: str, policies: str) -> argparse.Namespace:
    """The family's command line (this script and bench/cpu_heavy_bounds.py)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n", maxsplit=1)[0])
    ap.add_argument("--levels", default=levels)
    ap.add_argument("--seeds", default="42..51")
    ap.add_argument("--policies", default=policies)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default="bench/out/cpuheavy")
    ap.add_argument("--json", default="")
    return ap.parse_args()


def family_paths(a: argparse.Namespace) -> tuple[list[float], dict[float, str]]:
    """The levels asked for and each level's trace file (written under ``--out``)."""
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    default = trace.resolve_workload("default")
    levels = [float(x) for x in a.levels.split(",")]
    return levels, {lv: str(variant(default, lv, out)) for lv in levels}


def main() -> int:
    a = family_args(__doc__, "1.1,1.25,1.5,2,3", "fgd,kallot")
    levels, paths = family_paths(a)
    pols = a.policies.split(",")
    jobs = [(paths[lv], p, s) for lv in levels for p in pols for s in parse_seeds(a.seeds)]
    with ProcessPoolExecutor(a.jobs) as pool:
        res = list(pool.map(_one, jobs))
    table: dict[str, Any] = {}
    for lv in levels:
        row: dict[str, Any] = {"rho": rho(paths[lv])}
        line = f"level {lv:>4g} x cpu200 (rho {row['rho']:.2f}):"
        for p in pols:
            rs = [r for r in res if r[0] == paths[lv] and r[1] == p]
            vals = [r[3] for r in rs]
            row[p] = float(np.mean(vals))
            row[f"{p}_min"], row[f"{p}_max"] = float(min(vals)), float(max(vals))
            row[f"{p}_cpu_only_failed"] = float(np.mean([r[4] for r in rs]))
            row[f"{p}_cpu_used"] = float(np.mean([r[5] for r in rs]))
            line += (
                f"  {p} {row[p]:.2f} ({row[f'{p}_min']:.2f}-{row[f'{p}_max']:.2f};"
                f" CPU-only failed {row[f'{p}_cpu_only_failed']:.2f}%,"
                f" CPU used {row[f'{p}_cpu_used']:.2f}%)"
            )
        if "fgd" in row and "kallot" in row:
            row["ratio"] = row["kallot"] / row["fgd"]
            per_seed = [
                k[3] / f[3]
                for k in res
                for f in res
                if k[0] == f[0] == paths[lv] and k[1] == "kallot" and f[1] == "fgd" and k[2] == f[2]
            ]
            row["ratio_min"], row["ratio_max"] = float(min(per_seed)), float(max(per_seed))
            line += f"  ratio {row['ratio']:.3f} ({row['ratio_min']:.3f}-{row['ratio_max']:.3f})"
        table[f"{lv:g}"] = row
        print(line)
    if a.json:
        Path(a.json).write_text(json.dumps({"levels": table, "runs": res}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
