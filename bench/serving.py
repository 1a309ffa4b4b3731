"""Benchmark: scale-to-zero LLM serving placed cache-blind, cache-aware and cache-aware with
pre-warm (sim.serving), over several seeds.

Prints one markdown row per seed (cold starts, TTFT p50/p99, GPU-hours per policy, and the
pre-warm / blind ratios), then the mean and the worst seed. The numbers and the command are in
BENCHMARKS.md ("LLM serving: model-cache-aware placement").

    .venv/bin/python bench/serving.py --seeds 0 1 2 3 4
    .venv/bin/python bench/serving.py --seeds 0 1 2 3 4 --startup-s 5
    .venv/bin/python bench/serving.py --seeds 0 1 2 3 4 --host-memory-gb 64 --disk-preload 0.1
    .venv/bin/python bench/serving.py --seeds 0 1 2 3 4 --frontier 0 0.3 1 3 10 30 100

``--frontier``: instead of the table, sweep the pre-warm keep-warm threshold (and a run with no
keep-warm budget at all, "off") and print the mean and worst p99 and GPU-hour ratios to blind.
"""

from __future__ import annotations

import argparse
import statistics

from kallot.core.models import GB, LoadModel
from kallot.sim import serving


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--startup-s", type=float, default=LoadModel().startup_s)
    parser.add_argument("--remote-gbps", type=float, default=LoadModel().remote_bytes_per_s / GB)
    parser.add_argument("--host-memory-gb", type=float, default=serving.MEMORY_CACHE_BYTES / GB)
    parser.add_argument("--disk-preload", type=float, default=serving.DISK_PRELOAD)
    parser.add_argument("--keep-threshold", type=float, default=serving.KEEP_WARM_THRESHOLD)
    parser.add_argument("--keep-budget", type=float, default=serving.KEEP_WARM_BUDGET)
    parser.add_argument("--frontier", type=float, nargs="+", default=None)
    args = parser.parse_args()
    load = LoadModel(startup_s=args.startup_s, remote_bytes_per_s=args.remote_gbps * GB)
    if args.frontier is not None:
        frontier(args, load)
        return
    print(
        "| seed | cold starts blind / aware / pre-warm | TTFT p50 s | TTFT p99 s blind / aware / "
        "pre-warm | GPU-h blind / aware / pre-warm | p99 pre-warm / blind | GPU-h pre-warm / blind |"
    )
    print("|---|---|---|---|---|---|---|")
    p99s, hours = [], []
    for seed in args.seeds:
        s = serving.compare(
            seed,
            load=load,
            memory_cache_bytes=int(args.host_memory_gb * GB),
            disk_preload=args.disk_preload,
            keep_threshold=args.keep_threshold,
            keep_budget=args.keep_budget,
        ).summary()
        cold, p50, p99, gpu = (
            s[k] for k in ("cold_starts", "ttft_p50_s", "ttft_p99_s", "gpu_hours")
        )
        ratio = s["prewarm_vs_blind"]
        assert isinstance(cold, dict) and isinstance(p50, dict) and isinstance(p99, dict)
        assert isinstance(gpu, dict) and isinstance(ratio, dict)
        p99s.append(ratio["ttft_p99"])
        hours.append(ratio["gpu_hours"])
        row = [
            str(seed),
            " / ".join(str(cold[p]) for p in serving.POLICIES),
            " / ".join(f"{p50[p]:.2f}" for p in serving.POLICIES),
            " / ".join(f"{p99[p]:.1f}" for p in serving.POLICIES),
            " / ".join(f"{gpu[p]:.2f}" for p in serving.POLICIES),
            f"{ratio['ttft_p99']:.3f}",
            f"{ratio['gpu_hours']:.3f}",
        ]
        print("| " + " | ".join(row) + " |", flush=True)
    print(
        f"| mean | | | | | {statistics.mean(p99s):.3f} (worst {max(p99s):.3f}) | "
        f"{statistics.mean(hours):.3f} (worst {max(hours):.3f}) |"
    )


def frontier(args: argparse.Namespace, load: LoadModel) -> None:
    """p99 TTFT and GPU-hours of pre-warm / blind over the keep-warm threshold."""
    kw = {
        "load": load,
        "memory_cache_bytes": int(args.host_memory_gb * GB),
        "disk_preload": args.disk_preload,
    }
    blind = {}
    for seed in args.seeds:
        services = serving.workload(seed)
        blind[seed] = (services, serving.ServingSim(services, "blind", seed, **kw).run())
    print(
        "| keep threshold | budget | p99 pre-warm / blind mean (worst) | "
        "GPU-h pre-warm / blind mean (worst) | kept GPU-h mean |"
    )
    print("|---|---|---|---|---|")
    runs = [("off", 0.0, 0.0)] + [(f"{t:g}", t, args.keep_budget) for t in args.frontier]
    for label, threshold, budget in runs:
        p99s, hours, kept = [], [], []
        for seed in args.seeds:
            services, b = blind[seed]
            pre = serving.ServingSim(
                services, "prewarm", seed, keep_threshold=threshold, keep_budget=budget, **kw
            ).run()
            p99s.append(pre.ttft_p(99) / b.ttft_p(99))
            hours.append(pre.gpu_hours / b.gpu_hours)
            kept.append(pre.kept_gpu_seconds / 3600.0)
        print(
            f"| {label} | {budget:g} | {statistics.mean(p99s):.3f} ({max(p99s):.3f}) | "
            f"{statistics.mean(hours):.3f} ({max(hours):.3f}) | {statistics.mean(kept):.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
