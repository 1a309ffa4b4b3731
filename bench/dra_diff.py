"""kallot's DRA allocator vs upstream's, per case, on the differential suite.

The cases are ``kallot.testing.dra_cases`` (seeds ``--seeds``, the cases
tests/dra/test_dra_differential.py checks). Per case, from one run: kallot's time to parse the
case's JSON into the model (CEL compiled, cached by expression as in the live scheduler) and
allocate with the default policy (``kallot.testing.dra_diff.run_kallot``, wall clock in this
process), and upstream's time for ``structured.NewAllocator`` + ``Allocate`` (k8s.io/
dynamic-resource-allocation v0.36.3 in tools/testenv/dra-diff, the median of ``--repeat``
runs of the case, its CEL cache warm as kube-scheduler's). Prints the median, p90 and p99 of
each and the kallot/upstream ratios, all cases and split by outcome; then the same for
kallot's ``allocate`` alone (no JSON to model parsing, as upstream's timing), in wall clock and
in CPU time. Every kallot run starts with the selectors' answers forgotten
(``config.dra_cel.clear_memos``: each case evaluated afresh, as upstream's allocator evaluates
every call); the last row is one more run with them kept from the case's earlier runs, as the
live scheduler keeps them across pods and sessions.

    python bench/dra_diff.py --seeds 0..2000
"""

from __future__ import annotations

import argparse
import statistics

from kallot.config.dra_cel import clear_memos
from kallot.testing.dra_cases import case
from kallot.testing.dra_diff import Upstream, run_kallot


def _q(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--seeds", default="0..2000", help="a..b (b excluded)")
    ap.add_argument("--repeat", type=int, default=3, help="kallot and upstream runs per case")
    args = ap.parse_args()
    lo, hi = (int(x) for x in args.seeds.split(".."))
    rows: dict[str, list[tuple[float, float]]] = {"all": [], "fits": [], "does not fit": []}
    alone: list[tuple[float, float]] = []
    cpu: list[tuple[float, float]] = []
    warm: list[tuple[float, float]] = []
    with Upstream() as up:
        for seed in range(lo, hi):
            c = case(seed)
            runs = []
            for _ in range(args.repeat):
                clear_memos()
                runs.append(run_kallot(c))
            again = run_kallot(c)  # the selectors' answers kept from the runs above
            mine = statistics.median(r.seconds for r in runs) * 1e3
            got = up.ask({**c, "repeat": args.repeat})
            theirs = got["nanos"] / 1e6
            rows["all"].append((mine, theirs))
            alone.append((statistics.median(r.allocate_seconds for r in runs) * 1e3, theirs))
            cpu.append((statistics.median(r.allocate_cpu_seconds for r in runs) * 1e3, theirs))
            warm.append((again.allocate_cpu_seconds * 1e3, theirs))
            rows["fits" if got["status"] == "ok" else "does not fit"].append((mine, theirs))
    print(f"{hi - lo} cases (seeds {lo}..{hi}), median of {args.repeat} runs each; ms per case")
    print(
        f"{'cases':20}{'n':>6}  {'kallot p50/p90/p99':>24}  {'upstream p50/p90/p99':>24}  ratio p50/p99"
    )
    rows["all, allocate alone"] = alone
    rows["allocate, CPU"] = cpu
    rows["allocate, CPU, warm"] = warm
    for name, pairs in rows.items():
        if not pairs:
            continue
        k = [a for a, _ in pairs]
        u = [b for _, b in pairs]
        ks = "/".join(f"{_q(k, q):.2f}" for q in (0.5, 0.9, 0.99))
        us = "/".join(f"{_q(u, q):.2f}" for q in (0.5, 0.9, 0.99))
        ratio = f"{_q(k, 0.5) / _q(u, 0.5):.1f}x / {_q(k, 0.99) / _q(u, 0.99):.1f}x"
        print(f"{name:20}{len(pairs):>6}  {ks:>24}  {us:>24}  {ratio}")


if __name__ == "__main__":
    main()
