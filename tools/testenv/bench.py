"""Measures the test control plane: start/stop time and Node creation rate.

Where it sits: a developer tool next to build.sh; it uses kallot.testing.controlplane the
way the tests do, so its numbers are the ones a test run sees. Run after `make controlplane`:

    .venv/bin/python tools/testenv/bench.py [--nodes 1000 5000] [--concurrency 64]
"""

from __future__ import annotations

import argparse
import asyncio
import time

from kallot.testing.controlplane import ControlPlane, create_nodes, gpu_node_body


async def _create(cp: ControlPlane, count: int, concurrency: int, prefix: str) -> float:
    bodies = [gpu_node_body(f"{prefix}-{i:05d}") for i in range(count)]
    t0 = time.monotonic()
    await create_nodes(cp.kubeconfig_path, bodies, concurrency=concurrency)
    return time.monotonic() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[64])
    parser.add_argument("--starts", type=int, default=3, help="start/stop cycles to time")
    args = parser.parse_args()

    for _ in range(args.starts):
        cp = ControlPlane(scheduler=True)
        cp.start()
        t0 = time.monotonic()
        cp.stop()
        print(
            f"start (etcd+apiserver+scheduler ready) {cp.start_seconds:.2f}s, "
            f"stop {time.monotonic() - t0:.2f}s"
        )

    for concurrency in args.concurrency:
        for count in args.nodes:
            # A fresh cluster per run, so earlier nodes do not slow the next run's writes.
            with ControlPlane(scheduler=True) as cp:
                elapsed = asyncio.run(_create(cp, count, concurrency, f"n{concurrency}"))
            print(
                f"{count} nodes, concurrency {concurrency}: {elapsed:.1f}s "
                f"({count / elapsed:.0f} nodes/s)"
            )


if __name__ == "__main__":
    main()
