"""``kallot sim openb | compare | replay``: the FGD paper's experiment and the replay mode.

Where it sits: the composition root for ``sim.openb`` / ``sim.replay`` / ``sim.report``. It
parses options, fans seeds and policies out to worker processes (one experiment per process:
the core is single-threaded numpy), shows progress, prints tables and writes JSON and reports.

Long module: ``openb``, ``compare`` and ``replay`` share the loading, the worker fan-out, the
``--bounds`` option and the table and JSON writers; split, each would import the other two.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from rich.text import Text

from kallot.cli import sim, ui
from kallot.config import presets
from kallot.core.errors import ConfigError
from kallot.sim import openb, replay, trace

# The consoles are made where they print (ui.console()): the width is the terminal's (or
# $COLUMNS) when the command runs, not when the module was imported.

ALLOC_POINTS = (80, 90, 100, 130)
# One seed is one experiment (1.5 s): a range beyond this is a typo, not a run.
MAX_SEEDS = 10_000
# gc.set_threshold while experiments run (``batch_gc``): young objects are collected every
# 100,000 allocations instead of 700.
BATCH_GC_THRESHOLD = (100_000, 50, 100)
# --report's defaults (cli.sim)
DEFAULT_REPORT = sim.default_report("openb")
COMPARE_REPORT = sim.default_report("compare")
REPLAY_REPORT = sim.default_report("replay")


def parse_seeds(text: str) -> list[int]:
    """``42``, ``42,43,50`` or ``42..51`` (inclusive)."""
    try:
        seeds: list[int] = []
        for raw in text.split(","):
            part = raw.strip()
            if ".." in part:
                lo, hi = (int(x) for x in part.split("..", 1))
                if hi < lo:
                    raise ConfigError(
                        "--seeds", text, f"a range from low to high ({hi}..{lo}, not {lo}..{hi})"
                    )
                if hi - lo + 1 + len(seeds) > MAX_SEEDS:
                    raise ConfigError("--seeds", text, f"at most {MAX_SEEDS:,} seeds")
                seeds.extend(range(lo, hi + 1))
            elif part:
                seeds.append(int(part))
    except ValueError:
        raise ConfigError("--seeds", text, "integers: '42', '42,43' or '42..51'") from None
    if not seeds:
        raise ConfigError("--seeds", text, "at least one seed")
    if len(seeds) > MAX_SEEDS:
        raise ConfigError("--seeds", text, f"at most {MAX_SEEDS:,} seeds")
    if min(seeds) < 0:
        raise ConfigError("--seeds", text, "seeds >= 0 (numpy seeds are non-negative)")
    return seeds


def pick_seeds(seeds: str | None, seed: int | None, default: str) -> tuple[str, list[int]]:
    """``--seeds`` or ``--seed`` (its one-seed form, cli.sim), else ``default``: the text the
    report names and the seeds."""
    if seeds is not None and seed is not None:
        raise ConfigError("--seed", str(seed), "--seed or --seeds, not both")
    text = str(seed) if seed is not None else seeds if seeds is not None else default
    return text, parse_seeds(text)


def duration(seconds: float) -> str:
    """A queueing delay as a person reads it: ``42 s``, ``17 min``, ``3.2 h``."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def once(flag: str, values: Sequence[str]) -> None:
    """A repeatable option given the same value twice: its runs would be counted twice."""
    seen: set[str] = set()
    for v in values:
        if v in seen:
            raise ConfigError(flag, v, f"each {flag.removeprefix('--')} once (given twice)")
        seen.add(v)


def check_policy(name: str) -> str:
    if name not in presets.POLICY_NAMES:
        raise ConfigError("--policy", name, f"one of {', '.join(presets.POLICY_NAMES)}")
    return name


def with_configs(names: list[str], files: Sequence[Path] | None) -> dict[str, Any]:
    """The ``--config`` files of a comparing command (label -> document), each one more policy
    next to ``names``: a file named as one of them is refused (the results would mix)."""
    for f in files or ():
        if f.stem in names:
            raise ConfigError(
                "--config", str(f), f"a file not named as a --policy ({f.stem} is one)"
            )
    once("--config", [f.stem for f in files or ()])
    return sim.configs(files)


Loaded = tuple[str, list[trace.NodeRow], list[trace.PodRow]]
# What ``load`` read in this process, by file and its size and mtime: the command reads the
# files once to fail early on bad input, and an experiment run in-process reuses them.
_LOADED: dict[tuple[object, ...], Loaded] = {}


def load(workload: str, nodes: str = "") -> Loaded:
    """The workload's pod list and the node list (``nodes`` CSV, else the bundled cluster)."""
    path = trace.resolve_workload(workload)
    node_path = Path(nodes) if nodes else trace.bundled(trace.BUNDLED_NODES)
    trace.existing(path, "--workload")
    trace.existing(node_path, "--node-list")
    try:
        key: tuple[object, ...] | None = tuple(
            (str(p), st.st_size, st.st_mtime_ns) for p in (path, node_path) for st in [p.stat()]
        )
    except OSError:
        key = None  # the readers below say what is wrong with the file
    found = _LOADED.get(key) if key is not None else None
    if found is None:
        node_rows = trace.read_nodes(node_path)
        pod_rows = trace.read_pods(path)
        trace.check_gpu_specs(
            pod_rows, node_rows, pods_file=str(path.name), nodes_file=nodes or "the bundled nodes"
        )
        found = (trace.workload_name(path), node_rows, pod_rows)
        if key is not None:
            _LOADED[key] = found
    return found


def load_gpu_cluster(workload: str, nodes: str = "") -> Loaded:
    """``load`` for the openb experiment, which measures GPU allocation: the node list must
    have a GPU (else every number of the experiment would be 0 / 0)."""
    found = load(workload, nodes)
    if not any(n.gpus > 0 for n in found[1]):
        raise ConfigError(
            "--node-list", nodes, "a node list with at least one GPU (the experiment measures GPUs)"
        )
    return found


def _experiment(
    args: tuple[str, str, int],
    nodes: str = "",
    bounds: bool = False,
    configs: Mapping[str, Any] | None = None,
) -> openb.Run:
    workload, policy, seed = args
    name, node_rows, pods = load(workload, nodes)
    config = (configs or {}).get(policy)
    run = openb.run(node_rows, pods, policy=policy, seed=seed, workload=name, config=config)
    if bounds:
        # Imported here: highspy's LP is only loaded by the runs that ask for the bounds.
        from kallot.sim.bounds import run_bounds

        b = run_bounds(run, pods)
        run.extra["lp_pct"] = b.lp_pct
        run.extra["lp_given_placed_pct"] = b.lp_given_placed_pct
    return run


@contextlib.contextmanager
def batch_gc() -> Iterator[None]:
    """The collector tuned for experiments, restored after: they allocate many short-lived
    objects and make few cycles, so the objects the imports made are moved out of its way
    (``gc.freeze``) and the young generation is collected less often. An FGD experiment in the
    CLI took 1.54-1.60 s with the defaults and 1.42-1.44 s with this (BENCHMARKS.md, issue 23);
    the placements are the same."""
    threshold = gc.get_threshold()
    _worker_gc()
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()


def _worker_gc() -> None:
    """The collector tuned as ``batch_gc`` says, for good (a worker process's lifetime)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*BATCH_GC_THRESHOLD)


def run_all(
    jobs: Sequence[tuple[str, str, int]],
    workers: int,
    label: str,
    nodes: str = "",
    bounds: bool = False,
    *,
    configs: Mapping[str, Any] | None = None,
) -> list[openb.Run]:
    """Run experiments in ``workers`` processes with a progress bar; results in job order.
    ``nodes``: a node-list CSV instead of the bundled 1,213-node cluster; ``bounds``: add the
    packing bounds of ``sim.bounds`` to each run's ``extra``; ``configs``: the documents of the
    policies given as ``--config`` files (by label; the others are shipped presets)."""
    results: list[openb.Run | None] = [None] * len(jobs)
    with ui.progress(ui.console(stderr=True)) as bar:
        task = bar.add_task(label, total=len(jobs))
        if workers <= 1 or len(jobs) == 1:
            with batch_gc():
                for i, job in enumerate(jobs):
                    results[i] = _experiment(job, nodes, bounds, configs)
                    bar.advance(task)
        else:
            pool = ProcessPoolExecutor(workers, initializer=_worker_init)
            try:
                futures = {
                    pool.submit(_experiment, job, nodes, bounds, configs): i
                    for i, job in enumerate(jobs)
                }
                for fut in as_completed(futures):
                    results[futures[fut]] = fut.result()
                    bar.advance(task)
            except BaseException:
                # Ctrl-C or a failed experiment: stop now. Leaving the pool's context would
                # wait for every experiment already handed to a worker (14 s at --jobs 0).
                _stop(pool)
                raise
            pool.shutdown()
    return [r for r in results if r is not None]


def _worker_init() -> None:
    """A worker leaves Ctrl-C to the parent (which stops it: ``_stop``), so an interrupt
    prints one line, not a traceback per worker; then the collector as ``batch_gc`` says."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _worker_gc()


def _stop(pool: ProcessPoolExecutor) -> None:
    """End the pool's workers at once, queued experiments cancelled."""
    processes = list((pool._processes or {}).values())  # private: no public way to kill
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in processes:
        proc.terminate()
    for proc in processes:
        proc.join()


def summary(runs: Sequence[openb.Run]) -> dict[str, Any]:
    """The JSON document of one (workload, policy) over its seeds."""
    un = [r.unallocated_at(100) for r in runs]
    doc: dict[str, Any] = {
        "workload": runs[0].workload,
        "policy": runs[0].policy,
        "seeds": [r.seed for r in runs],
        "unallocated_pct_at_100": {"mean": float(np.mean(un)), "sd": float(np.std(un))},
        "unallocated_pct_at_100_by_seed": [float(x) for x in un],
        "alloc_pct_at": {
            str(x): float(np.mean([r.alloc_at(x) for r in runs])) for x in ALLOC_POINTS
        },
        "frag_pct_at_100": float(np.mean([r.frag_pct_at(100) for r in runs])),
        "frag_rate_pct_at_100": float(np.mean([r.frag_rate_at(100) for r in runs])),
        "placements": int(np.mean([int(r.placed.sum()) for r in runs])),
        "attempts": int(np.mean([r.attempts for r in runs])),
        "wall_s": float(np.mean([r.wall_s for r in runs])),
        "schedule_s": float(np.mean([r.schedule_s for r in runs])),
    }
    for key in BOUND_KEYS:  # --bounds (sim.bounds)
        if all(key in r.extra for r in runs):
            doc[key] = float(np.mean([r.extra[key] for r in runs]))
    return doc


# ``--bounds`` on ``sim openb`` and ``sim compare``.
BoundsFlag = Annotated[
    bool,
    typer.Option(
        "--bounds",
        help="Add the packing bounds at arrived = 100%: lp % (best packing of the arrived pods) "
        "and lp|placed % (best packing of the pods the policy placed).",
    ),
]
# The packing bounds ``--bounds`` adds (``sim.bounds``), JSON key -> table column.
BOUND_KEYS = {"lp_pct": "lp %", "lp_given_placed_pct": "lp|placed %"}


# Under every openb table: what the columns' "@N" means.
TABLE_NOTE = "@N: when the arrived GPU request is N% of the GPU capacity; sd over the seeds"


def policy_table(title: str, summaries: Sequence[dict[str, Any]]) -> list[list[str]]:
    """Header and rows of the table of one workload, a row per policy."""
    bounds = [k for k in BOUND_KEYS if all(k in s for s in summaries)]
    header = [
        "policy",
        "unalloc@100 %",
        "sd",
        "alloc@80 %",
        "alloc@90 %",
        "alloc@100 %",
        "alloc@130 %",
        "frag@100 %",
        "placed pods",
        "s/run",
        *(BOUND_KEYS[k] for k in bounds),
    ]
    rows = []
    for s in summaries:
        a = s["alloc_pct_at"]
        rows.append(
            [
                s["policy"],
                f"{s['unallocated_pct_at_100']['mean']:.2f}",
                f"{s['unallocated_pct_at_100']['sd']:.2f}",
                f"{a['80']:.2f}",
                f"{a['90']:.2f}",
                f"{a['100']:.2f}",
                f"{a['130']:.2f}",
                f"{s['frag_pct_at_100']:.2f}",
                str(s["placements"]),
                f"{s['wall_s']:.1f}",
                *(f"{s[k]:.2f}" for k in bounds),
            ]
        )
    return [header, *rows]


def print_policy_table(title: str, summaries: Sequence[dict[str, Any]]) -> None:
    rows = policy_table(title, summaries)
    ui.print_table(ui.console(), title, rows[0], rows[1:])
    ui.console().print(Text(TABLE_NOTE, style="dim"))


guarded = sim.guarded


def default_workers() -> int:
    return max(1, min(4, os.cpu_count() or 1))


def _write_outputs(
    report_out: Path,
    plot: Path | None,
    *,
    title: str,
    by_policy: dict[str, list[openb.Run]],
    summaries: list[dict[str, Any]],
    notes: Sequence[str],
) -> None:
    """``--plot`` (the allocation curves) and ``--report`` of ``openb`` and one-workload
    ``compare``."""
    rows = policy_table(title, summaries)
    # matplotlib is imported only by commands that draw: `kallot scheduler` starts faster
    from kallot.sim import report

    sim.write_plot(plot, lambda: report.allocation_figure(by_policy, title))
    figures = [
        report.allocation_figure(by_policy, title),
        report.unallocated_figure(by_policy, title),
    ]
    sim.write_report(
        report_out,
        title,
        [("policies (means over seeds)", rows[0], rows[1:])],
        figures,
        [*notes, TABLE_NOTE],
    )


def register(app: typer.Typer) -> None:
    """Add ``openb``, ``compare`` and ``replay`` to ``app``."""

    @app.command("openb")
    def openb_cmd(
        *,
        workload: Annotated[str, typer.Option(help="Workload name or pod-list CSV.")] = "default",
        nodes: Annotated[
            str,
            typer.Option("--node-list", help="Node-list CSV (sn,cpu_milli,memory_mib,gpu,model)."),
        ] = "",
        policy: Annotated[
            str, typer.Option(click_type=ui.SIM_POLICY, help="Scheduling policy.")
        ] = "kallot",
        seeds: Annotated[
            str | None, typer.Option(help="'42', '42,43' or '42..51' (default: 42).")
        ] = None,
        seed: Annotated[int | None, typer.Option(min=0, help="One seed: --seeds N.")] = None,
        json_out: sim.Json = None,
        plot: sim.Plot = None,
        report_out: Annotated[Path, sim.report_option("openb")] = DEFAULT_REPORT,
        jobs: sim.Jobs = 0,
        bounds: BoundsFlag = False,
        config: sim.Config = None,
    ) -> None:
        """The FGD paper's experiment (shuffle, inflate to 130%, place one by one) for one
        policy; prints the table, writes the HTML report (and --json)."""

        def go() -> None:
            label, cfg = sim.policy_or_config(policy, config)
            if cfg is None:
                check_policy(policy)
            seeds_text, seed_list = pick_seeds(seeds, seed, "42")
            sim.check_outputs(json_out=json_out, plot=plot, report=report_out)
            name, _, _ = load_gpu_cluster(workload, nodes)  # bad files fail here, not in workers
            runs = run_all(
                [(workload, label, s) for s in seed_list],
                jobs or default_workers(),
                f"{name} / {label}",
                nodes,
                bounds,
                configs={label: cfg} if cfg is not None else None,
            )
            doc = summary(runs)
            print_policy_table(f"openb {name}: {len(seed_list)} seed(s)", [doc])
            sim.write_json(json_out, doc)
            _write_outputs(
                report_out,
                plot,
                title=f"openb {name}",
                by_policy={label: runs},
                summaries=[doc],
                notes=[
                    f"seeds {seeds_text}; unallocated % = GPU capacity not allocated when the "
                    "arrived GPU request equals capacity (arrived = 100%)."
                ],
            )

        guarded(go)

    @app.command("compare")
    def compare_cmd(
        *,
        workload: Annotated[
            list[str] | None,
            typer.Option(
                help="Workload name or pod-list CSV; repeat for several (default: default)."
            ),
        ] = None,
        nodes: Annotated[
            str,
            typer.Option("--node-list", help="Node-list CSV (sn,cpu_milli,memory_mib,gpu,model)."),
        ] = "",
        policy: Annotated[
            list[str] | None,
            typer.Option(click_type=ui.SIM_POLICY, help="Repeat; default: all."),
        ] = None,
        seeds: Annotated[
            str | None, typer.Option(help="'42', '42,43' or '42..51' (default: 42..44).")
        ] = None,
        seed: Annotated[int | None, typer.Option(min=0, help="One seed: --seeds N.")] = None,
        json_out: sim.Json = None,
        plot: sim.Plot = None,
        report_out: Annotated[Path, sim.report_option("compare")] = COMPARE_REPORT,
        jobs: sim.Jobs = 0,
        bounds: BoundsFlag = False,
        config: sim.Configs = None,
    ) -> None:
        """Policies x workloads x seeds in parallel processes; a table per workload, the ratio
        to FGD, a comparison plot."""

        def go() -> None:
            names = [check_policy(p) for p in (policy or list(presets.POLICY_NAMES))]
            once("--policy", names)
            cfgs = with_configs(names, config)
            names += list(cfgs)
            once("--workload", workload or [])
            seeds_text, seed_list = pick_seeds(seeds, seed, "42..44")
            sim.check_outputs(json_out=json_out, plot=plot, report=report_out)
            workloads = workload or ["default"]
            # Bad files fail here, before any worker starts.
            labels = [load_gpu_cluster(w, nodes)[0] for w in workloads]
            jobs_list = [(w, p, s) for w in workloads for p in names for s in seed_list]
            runs = run_all(
                jobs_list,
                jobs or default_workers(),
                f"{len(workloads)} workload(s) x {len(names)} policies x {len(seed_list)} seed(s)",
                nodes,
                bounds,
                configs=cfgs,
            )
            per = len(names) * len(seed_list)  # run_all keeps job order
            docs: list[dict[str, Any]] = []
            tables: list[tuple[str, list[str], list[list[str]]]] = []
            by_workload: dict[str, dict[str, list[openb.Run]]] = {}
            for k, label in enumerate(labels):
                mine = runs[k * per : (k + 1) * per]
                by_policy = {p: [r for r in mine if r.policy == p] for p in names}
                by_workload[label] = by_policy
                wdocs = [summary(by_policy[p]) for p in names]
                title = f"openb {label}: {len(seed_list)} seed(s)"
                fgd = next((d for d in wdocs if d["policy"] == "fgd"), None)
                if fgd is not None:
                    base = fgd["unallocated_pct_at_100"]["mean"]
                    for d in wdocs:
                        mean = d["unallocated_pct_at_100"]["mean"]
                        d["ratio_to_fgd"] = mean / base if base else float("nan")
                rows = policy_table(title, wdocs)
                if fgd is not None:  # the ratio to FGD in the table, terminal and HTML alike
                    rows[0].insert(2, "÷ fgd")
                    for row, d in zip(rows[1:], wdocs, strict=True):
                        row.insert(2, f"{d['ratio_to_fgd']:.3f}")
                ui.print_table(ui.console(), title, rows[0], rows[1:])
                docs += wdocs
                tables.append((title, rows[0], rows[1:]))
            ui.console().print(Text(TABLE_NOTE + "; ÷ fgd: unalloc@100 over FGD's", style="dim"))
            sim.write_json(json_out, docs)
            title = f"openb: {', '.join(labels)}: policy comparison"
            # matplotlib is imported only by commands that draw: `kallot scheduler` starts faster
            from kallot.sim import report

            if len(labels) == 1:
                by_policy = by_workload[labels[0]]
                figures = [
                    report.allocation_figure(by_policy, title),
                    report.unallocated_figure(by_policy, title),
                ]
                sim.write_plot(plot, lambda: report.allocation_figure(by_policy, title))
            else:
                figures = [report.workloads_figure(by_workload, title)]
                sim.write_plot(plot, lambda: report.workloads_figure(by_workload, title))
            notes = [f"seeds {seeds_text}", TABLE_NOTE + "; ÷ fgd: unalloc@100 over FGD's"]
            sim.write_report(report_out, title, tables, figures, notes)

        guarded(go)

    @app.command("replay")
    def replay_cmd(
        *,
        workload: Annotated[str, typer.Option(help="Workload name or pod-list CSV.")] = "default",
        nodes: Annotated[
            str,
            typer.Option("--node-list", help="Node-list CSV (sn,cpu_milli,memory_mib,gpu,model)."),
        ] = "",
        policy: Annotated[
            list[str] | None,
            typer.Option(click_type=ui.SIM_POLICY, help="Repeat; default kallot, fgd."),
        ] = None,
        seed: sim.Seed = 42,
        speedup: Annotated[float, typer.Option(help="Arrival-time compression (>= 1).")] = (
            replay.DEFAULT_SPEEDUP
        ),
        node_fraction: Annotated[float, typer.Option(help="Share of nodes to keep.")] = (
            replay.DEFAULT_NODE_FRACTION
        ),
        json_out: sim.Json = None,
        plot: sim.Plot = None,
        report_out: Annotated[Path, sim.report_option("replay")] = REPLAY_REPORT,
        config: sim.Configs = None,
    ) -> None:
        """Replay creation and deletion times with a pending queue: allocation over time and
        queueing-delay percentiles per policy."""

        def go() -> None:
            names = [check_policy(p) for p in (policy or ["kallot", "fgd"])]
            once("--policy", names)
            cfgs = with_configs(names, config)
            names += list(cfgs)
            if not speedup >= 1:
                raise ConfigError("--speedup", str(speedup), "a number >= 1 (time compression)")
            if not 0 < node_fraction <= 1:
                raise ConfigError("--node-fraction", str(node_fraction), "a fraction in (0, 1]")
            sim.check_outputs(json_out=json_out, plot=plot, report=report_out)
            name, node_rows, pods = load(workload, nodes)
            results = []
            with ui.progress(ui.console(stderr=True)) as bar:
                for p in names:
                    task = bar.add_task(f"replay {name} / {p}", total=len(pods))

                    def tick(done: int, total: int, task: Any = task) -> None:
                        bar.update(task, completed=done, total=total)

                    results.append(
                        replay.replay(
                            node_rows,
                            pods,
                            policy=p,
                            seed=seed,
                            workload=name,
                            config=cfgs.get(p),
                            speedup=speedup,
                            node_fraction=node_fraction,
                            progress=tick,
                        )
                    )
            header = [
                "policy",
                "GPUs",
                "mean alloc %",
                "peak alloc %",
                "delay p50",
                "delay p90",
                "delay p99",
                "delay max",
                "unplaced",
                "sessions",
                "wall s",
            ]
            rows = []
            docs = []
            for r in results:
                d = r.delay_percentiles()
                rows.append(
                    [
                        r.policy,
                        f"{r.capacity_milli / 1000:.0f}",
                        f"{r.mean_alloc_pct():.2f}",
                        f"{float(r.alloc_pct().max()):.2f}",
                        duration(d["p50"]),
                        duration(d["p90"]),
                        duration(d["p99"]),
                        duration(d["max"]),
                        str(r.unplaced),
                        str(r.sessions),
                        f"{r.wall_s:.1f}",
                    ]
                )
                docs.append(
                    {
                        "workload": name,
                        "policy": r.policy,
                        "seed": r.seed,
                        "speedup": r.speedup,
                        "node_fraction": r.node_fraction,
                        "gpus": r.capacity_milli / 1000,
                        "mean_alloc_pct": r.mean_alloc_pct(),
                        "peak_alloc_pct": float(r.alloc_pct().max()),
                        "queueing_delay_s": d,
                        "unplaced": r.unplaced,
                        "sessions": r.sessions,
                        "wall_s": r.wall_s,
                    }
                )
            caption = f"replay {name} (speedup {speedup:g}, nodes {node_fraction:g})"
            ui.print_table(ui.console(), caption, header, rows)
            sim.write_json(json_out, docs)
            title = f"replay {name}"
            # matplotlib is imported only by commands that draw: `kallot scheduler` starts faster
            from kallot.sim import report

            sim.write_plot(plot, lambda: report.replay_figure(results, title))
            sim.write_report(
                report_out, title, [(caption, header, rows)], [report.replay_figure(results, title)]
            )

        guarded(go)
