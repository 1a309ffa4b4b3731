"""Fidelity and quality on the openb traces: every workload x policy x seed, vs the paper.

Runs the FGD paper's protocol (``kallot.sim.openb``) for the six paper policies and kallot's
default on each workload found in the openb directory, compares the mean unallocated % at
arrived = 100% with the paper's artifact numbers (``fgd_expected/summary_by_workload_policy.csv``:
100 - alloc_mean@100) and prints, per workload, each policy's gap to the paper and kallot's ratio
to FGD measured in the same run. Results also go to a JSON file for BENCHMARKS.md.

    python bench/openb_quality.py --openb ../shared/data/openb \
        --expected ../shared/data/fgd_expected --seeds 42..51 --jobs 2 --json bench/out/quality.json

With ``--runs FILE.jsonl`` every finished experiment is appended to FILE as one JSON line and
experiments already in FILE are not run again: an interrupted sweep resumes, and a sweep can be
built up in parts (say FGD and kallot first, the baselines after). The table is computed from
FILE, so it covers every experiment recorded there for the requested workloads, policies and
seeds.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import numpy as np

from kallot.cli.sim_openb import _experiment, parse_seeds

WORKLOADS = (
    "default",
    "cpu100",
    "gpushare40",
    "gpushare80",
    "gpuspec10",
    "gpuspec20",
    "multigpu20",
    "multigpu50",
)
PAPER_NAMES = {
    "random": "01-Random",
    "dotprod": "02-DotProd",
    "clustering": "03-GpuClustering",
    "packing": "04-GpuPacking",
    "bestfit": "05-BestFit",
    "fgd": "06-FGD",
}
POLICIES = (*PAPER_NAMES, "kallot")


def expected(path: Path) -> dict[tuple[str, str], float]:
    out = {}
    with (path / "summary_by_workload_policy.csv").open() as f:
        for row in csv.DictReader(f):
            wl = row["workload"].removeprefix("openb_pod_list_")
            out[(wl, row["policy"])] = 100.0 - float(row["alloc_mean@100"])
    return out


def load_runs(path: Path) -> dict[tuple[str, str, int], dict[str, Any]]:
    out: dict[tuple[str, str, int], dict[str, Any]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                out[(rec["workload"], rec["policy"], int(rec["seed"]))] = rec
    return out


def _one(job: tuple[str, str, int], openb: Path) -> dict[str, Any]:
    wl, policy, seed = job
    r = _experiment((str(openb / f"openb_pod_list_{wl}.csv"), policy, seed))
    return {
        "workload": wl,
        "policy": policy,
        "seed": seed,
        "unallocated_pct_at_100": r.unallocated_at(100),
        "frag_pct_at_100": r.frag_pct_at(100),
        "attempts": r.attempts,
        "placed": int(r.placed.sum()),
        "wall_s": r.wall_s,
        "schedule_s": r.schedule_s,
    }


def run_jobs(jobs: list[tuple[str, str, int]], openb: Path, workers: int):  # type: ignore[no-untyped-def]
    """Yield one record per experiment as it finishes (``workers`` processes)."""
    if workers <= 1:
        for i, job in enumerate(jobs):
            rec = _one(job, openb)
            print(
                f"[{i + 1}/{len(jobs)}] {job} {rec['unallocated_pct_at_100']:.2f}", file=sys.stderr
            )
            yield rec
        return
    with ProcessPoolExecutor(workers) as pool:
        futures = [pool.submit(_one, job, openb) for job in jobs]
        for i, fut in enumerate(as_completed(futures)):
            rec = fut.result()
            job = (rec["workload"], rec["policy"], rec["seed"])
            print(
                f"[{i + 1}/{len(jobs)}] {job} {rec['unallocated_pct_at_100']:.2f}", file=sys.stderr
            )
            yield rec


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--openb", type=Path, required=True)
    ap.add_argument("--expected", type=Path, required=True)
    ap.add_argument("--seeds", default="42..51")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--json", type=Path)
    ap.add_argument("--runs", type=Path, help="JSON-lines record of every experiment (resume)")
    a = ap.parse_args()
    seeds = parse_seeds(a.seeds)
    paper = expected(a.expected)
    wls = a.workloads.split(",")
    pols = a.policies.split(",")
    done = load_runs(a.runs) if a.runs else {}
    jobs = [(wl, p, s) for wl in wls for p in pols for s in seeds if (wl, p, s) not in done]
    print(f"{len(jobs)} experiments to run ({len(done)} already recorded)", file=sys.stderr)
    for rec in run_jobs(jobs, a.openb, a.jobs):
        done[(rec["workload"], rec["policy"], rec["seed"])] = rec
        if a.runs:
            with a.runs.open("a") as f:
                f.write(json.dumps(rec) + "\n")
    results: dict[str, dict[str, dict[str, float]]] = {}
    for wl in wls:
        results[wl] = {}
        for p in pols:
            recs = [done[(wl, p, s)] for s in seeds if (wl, p, s) in done]
            un = [r["unallocated_pct_at_100"] for r in recs]
            walls = [r["wall_s"] for r in recs]
            ref = paper.get((wl, PAPER_NAMES.get(p, "")), float("nan"))
            results[wl][p] = {
                "seeds": len(un),
                "mean": float(np.mean(un)),
                "sd": float(np.std(un)),
                "paper": ref,
                "gap": float(np.mean(un) - ref),
                "wall_s": float(np.mean(walls)),
            }
        fgd = results[wl].get("fgd", {}).get("mean")
        if fgd and "kallot" in results[wl]:
            results[wl]["kallot"]["ratio_to_fgd"] = results[wl]["kallot"]["mean"] / fgd
    print(f"\nunallocated % at arrived = 100% (mean of {len(seeds)} seeds; paper in brackets)")
    print(f"{'workload':12s}" + "".join(f"{p:>17s}" for p in pols) + "  kallot/fgd")
    for wl in wls:
        cells = []
        for p in pols:
            r = results[wl][p]
            bracket = f"[{r['paper']:.2f}]" if not np.isnan(r["paper"]) else ""
            cells.append(f"{r['mean']:7.2f} {bracket:>8s} ")
        ratio = results[wl].get("kallot", {}).get("ratio_to_fgd", float("nan"))
        print(f"{wl:12s}" + "".join(f"{c:>17s}" for c in cells) + f"  {ratio:9.3f}")
    worst = {p: max(abs(results[wl][p]["gap"]) for wl in wls) for p in pols if p in PAPER_NAMES}
    print(
        "\nlargest |gap to paper| per policy (points): "
        + ", ".join(f"{p} {g:.2f}" for p, g in worst.items())
    )
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps({"seeds": seeds, "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
