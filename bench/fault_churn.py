"""The live scheduler under API faults, at the size of issue 27: mixed pods (whole GPUs,
shares, MIG instances) created and deleted on GPU nodes while a fault-injecting proxy
(kallot.testing.faults) answers 5% of the scheduler's requests 500/503/429 (half of the 5xx
on writes after applying them), 5% of its writes 409, delays 10% by 20-500 ms and cuts its
watches every 10-30 s (half EOF, half abort); then faults off, settle, audit from the API.
One fresh control plane per seed. Prints one line per seed (faults injected by kind, binds
failed, settle time, and the audit: devices held twice, bound without a record, pending
without a reason, lost, the scheduler's charged milli-GPU against the records). Exits 1 when
an audit is not clean. Run after `make controlplane`:

    .venv/bin/python bench/fault_churn.py [--pods 600] [--seconds 180] [--nodes 30] [--seeds 1 2]

``--kallot-src DIR`` runs the scheduler from another source tree (``DIR/src`` first on its
PYTHONPATH), e.g. an export of an older commit, to compare.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from kallot.testing.controlplane import ControlPlane
from kallot.testing.faults import fault_churn
from kallot.testing.live import Cluster


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=600)
    parser.add_argument("--seconds", type=float, default=180.0)
    parser.add_argument("--nodes", type=int, default=30)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--kallot-src", type=Path, default=None)
    args = parser.parse_args()
    env = None
    if args.kallot_src is not None:
        env = {"PYTHONPATH": str((args.kallot_src / "src").resolve())}
    clean = True
    for seed in args.seeds:
        with (
            ControlPlane(scheduler=False) as cp,
            cp.api_client() as api,
            tempfile.TemporaryDirectory() as logs,
        ):
            cluster = Cluster(cp, api, Path(logs))
            try:
                report = fault_churn(
                    cluster,
                    pods=args.pods,
                    seconds=args.seconds,
                    nodes=args.nodes,
                    seed=seed,
                    scheduler_env=env,
                )
            finally:
                cluster.close()
        print(report.summary(), flush=True)
        for problem in report.double_held + report.bound_without_record + report.lost:
            print(f"  {problem}")
        if report.pending_without_reason:
            print(f"  pending without reason: {', '.join(report.pending_without_reason)}")
        clean = clean and report.clean
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
