"""Benchmark: topology-aware kallot vs the topology-blind policy on generated distributed-training
workloads (sim.training), over several seeds and values of the locality weight.

Prints one row per run with kallot / blind ratios, then the mean over seeds. The numbers and the
command are in BENCHMARKS.md ("Topology-aware gang placement").

    .venv/bin/python bench/training.py --seeds 0 1 2 3 4 --locality 0.5
    .venv/bin/python bench/training.py --seeds 0 1 2 --locality 0 0.25 0.75 1
    .venv/bin/python bench/training.py --seeds 0 1 2 3 4 --oversubscription 1 1
    .venv/bin/python bench/training.py --seeds 0 1 2 3 4 --gang required
    .venv/bin/python bench/training.py --seeds 0 1 2 3 4 --overlap 1
"""

from __future__ import annotations

import argparse
import statistics

from kallot.core.workload import TopologyMode
from kallot.sim import training


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--locality", type=float, nargs="+", default=[0.5])
    parser.add_argument("--load", type=float, default=0.9)
    parser.add_argument(
        "--oversubscription",
        type=float,
        nargs=2,
        default=[2.0, 4.0],
        metavar=("SPINE", "CORE"),
        help="fabric oversubscription across racks and across blocks",
    )
    parser.add_argument(
        "--overlap",
        type=float,
        default=0.0,
        help="share of a step's compute the all-reduce hides behind (0 = none, 1 = all)",
    )
    parser.add_argument(
        "--gang",
        choices=["preferred", "required", "none"],
        default="preferred",
        help="how hard each gang's one-rack constraint is for kallot",
    )
    args = parser.parse_args()
    mode = {"preferred": TopologyMode.PREFERRED, "required": TopologyMode.REQUIRED}.get(
        args.gang, TopologyMode.NONE
    )
    head = (
        f"{'seed':>4} {'lambda':>6} {'island% b/k':>13} {'rack% b/k':>13} {'job time':>9} "
        f"{'completion':>10} {'GPU-h':>7} {'makespan':>8} {'stranded% b/k':>14} {'partial':>7}"
    )
    print(head)
    for lam in args.locality:
        rows = []
        for seed in args.seeds:
            fabric = training.Fabric(
                rack_oversubscription=args.oversubscription[0],
                block_oversubscription=args.oversubscription[1],
                overlap=args.overlap,
            )
            s = training.compare(
                n_jobs=args.jobs,
                seed=seed,
                load=args.load,
                locality=lam,
                fabric=fabric,
                gang_mode=mode,
            ).summary()
            isl, rack, strd = s["in_one_island_pct"], s["in_one_rack_pct"], s["stranded_gpu_pct"]
            jct, gpuh = s["mean_completion_s"], s["gpu_hours"]
            assert isinstance(isl, dict) and isinstance(rack, dict) and isinstance(strd, dict)
            assert isinstance(jct, dict) and isinstance(gpuh, dict)
            row = {
                "job": float(str(s["est_job_time_ratio"])),
                "jct": jct["kallot"] / jct["blind"],
                "gpuh": gpuh["kallot"] / gpuh["blind"],
                "make": float(str(s["makespan_ratio"])),
                "isl": isl["kallot"] - isl["blind"],
                "rack": rack["kallot"] - rack["blind"],
            }
            rows.append(row)
            print(
                f"{seed:>4} {lam:>6.2f} {isl['blind']:>6.1f}/{isl['kallot']:<6.1f} "
                f"{rack['blind']:>6.1f}/{rack['kallot']:<6.1f} {row['job']:>9.3f} "
                f"{row['jct']:>10.3f} {row['gpuh']:>7.3f} {row['make']:>8.3f} "
                f"{strd['blind']:>6.1f}/{strd['kallot']:<7.1f} {s['partial_gangs_after_session']:>7}"
            )
        if len(rows) > 1:
            mean = {k: statistics.fmean(r[k] for r in rows) for k in rows[0]}
            print(
                f"mean {lam:>6.2f} island +{mean['isl']:.1f} pt, rack +{mean['rack']:.1f} pt, "
                f"job time x{mean['job']:.3f}, completion x{mean['jct']:.3f}, "
                f"GPU-hours x{mean['gpuh']:.3f}, makespan x{mean['make']:.3f}"
            )


if __name__ == "__main__":
    main()
