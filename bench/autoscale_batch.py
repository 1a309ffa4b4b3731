"""One scale-up of a whole batch: the planner (core.provision.plan) on every pod of a
``kallot sim autoscale`` workload pending at once, against the packing LP's optimum.

    .venv/bin/python bench/autoscale_batch.py [--pods 600] [--seed 0]

Prints, per mix, the nodes the planner asks for, the LP optimum (sim.autoscale.optimum_nodes:
the fewest GPUs any packing of the GPU requests needs, over 8 GPUs a node, rounded up), the
ratio, the planner's core sessions and its wall time. Integer counting of the same pods is
shown for reference.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from kallot.config import presets
from kallot.core import policies
from kallot.core.framework.runner import Framework
from kallot.core.provision.plan import Planner
from kallot.sim import autoscale


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=int, default=600)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    fw = Framework(presets.PROFILES["kallot"], policies.builtin_registry())
    print("mix     counting  nodes  optimum  ratio  sessions  seconds")
    for mix in autoscale.MIXES:
        pods, jobs = autoscale.workload(args.seed, args.pods, mix)
        tasks = [p.task for p in pods]
        opt = autoscale.optimum_nodes(tasks, autoscale.SHAPE)
        for counting in ("kallot", "integer"):
            work = tasks if counting == "kallot" else [autoscale.as_integer(t) for t in tasks]
            planner = Planner(fw, [dataclasses.replace(autoscale.SHAPE, max_new=256)])
            t0 = time.perf_counter()
            plan = planner.plan(work, jobs)
            dt = time.perf_counter() - t0
            n = len(plan.nodes)
            print(
                f"{mix:7} {counting:8} {n:6d} {opt:8d} {n / max(1, opt):6.3f} "
                f"{plan.sessions:9d} {dt:8.1f}"
            )


if __name__ == "__main__":
    main()
