"""What-if of right-sizing on the core (``kallot sim rightsize``): a serving fleet whose GPU use is
driven by real request arrivals, placed as requested (a whole GPU each), then as right-sized by
``core.rightsize`` from the first part of the trace, and replayed on the rest.

Where it sits: the sim shell. ``load_arrivals`` reads the bundled Azure LLM inference trace
(conversation service, one hour, CC-BY 4.0, ``kallot/data/azure-llm-2023``); ``generate`` draws
a seeded fleet of services, each serving a thinned, time-shifted copy of the trace; ``usage``
turns a service's requests into per-second GPU memory and compute; ``run`` places the fleet twice
with the core's ``Scheduler`` and replays the held-out part.

Usage model (docs/rightsizing.md), per service and second:

- a request arriving at ``a`` with ``c`` context and ``g`` generated tokens runs for
  ``c / prefill_tok_s + g x decode_s`` seconds; while it runs it holds the KV cache of its context
  and of the tokens generated so far (``kv_kib`` per token, from the model's layers, KV heads and
  head size), rounded up to 16-token pages (a paged KV cache that grows on demand);
- memory = weights (parameters x bytes per parameter) + runtime overhead (CUDA context,
  activations, allocator: 1.5 GiB + 5% of the weights) + KV cache of the requests in flight, at
  most ``ENGINE_CAP`` of the GPU (the engine's KV pool is bounded: requests beyond it wait);
- compute (milli-GPU) = tokens processed per second x 2 x parameters FLOP / (H100 dense BF16
  989 TFLOP/s x 40% model FLOP utilisation), at most 1000.

The exporter scrapes every ``SCRAPE_S`` seconds; the right-sizing sees only those samples of
the training part. The replay checks every second of the held-out part: a memory overrun is a
second where a pod uses more memory than its share (counted per pod: ``memory_overruns`` pods,
``overrun_pod_minutes``); contention is a second where the pods of one GPU use more than 1000
milli together.
"""

from __future__ import annotations

import gzip
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from importlib import resources
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from kallot.config import presets
from kallot.config.scheduler import SchedulerConfiguration
from kallot.core import rightsize
from kallot.core.errors import ConfigError
from kallot.core.resources import GPU_MODELS, MILLI, SharingMode
from kallot.core.scheduler import Scheduler
from kallot.core.snapshot import GpuSpec, NodeSpec, SnapshotBuilder
from kallot.core.workload import DeviceRequest, Task
from kallot.sim.trace import RowError, TraceError

F64 = NDArray[np.float64]
GIB = 1024
H100 = "H100-80GB"
H100_MEM = GPU_MODELS[H100].memory_mib
GPUS_PER_NODE = 8
SCRAPE_S = 15  # Prometheus scrape interval of the exporter in the simulation
PAGE_TOKENS = 16
FLOPS = 989e12 * 0.40  # H100 dense BF16 at 40% MFU
TRAIN_FRACTION = 0.4
ENGINE_CAP = 0.95  # of the GPU's memory: the most a serving engine takes (vLLM-style KV pool)
TRACE = "AzureLLMInferenceTrace_conv.csv"
ARRIVALS_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"


@dataclass(frozen=True, slots=True)
class ModelSize:
    """A served model: public architecture numbers (config.json of the named model)."""

    name: str
    params_b: float
    bytes_per_param: float  # 2 = bf16, 1 = fp8
    layers: int
    kv_heads: int
    head_dim: int
    kv_bytes: float  # per KV element (2 = bf16, 1 = fp8 KV cache)
    decode_s: float  # seconds per generated token of one request in a batch
    weight: float  # share of the fleet's services

    @property
    def weights_mib(self) -> float:
        return self.params_b * 1e9 * self.bytes_per_param / 2**20

    @property
    def base_mib(self) -> float:
        """Weights + runtime overhead (1.5 GiB + 5% of the weights)."""
        return self.weights_mib * 1.05 + 1.5 * GIB

    @property
    def kv_mib_per_token(self) -> float:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.kv_bytes / 2**20

    @property
    def prefill_tok_s(self) -> float:
        return FLOPS / (2 * self.params_b * 1e9)


# Llama 3.2 1B/3B, Llama 3.1 8B, Qwen2.5 14B (bf16), Llama 3.1 70B (fp8 weights and KV cache).
MODELS: tuple[ModelSize, ...] = (
    ModelSize("llama-3.2-1b", 1.24, 2, 16, 8, 64, 2, 0.006, 0.25),
    ModelSize("llama-3.2-3b", 3.21, 2, 28, 8, 128, 2, 0.010, 0.25),
    ModelSize("llama-3.1-8b", 8.03, 2, 32, 8, 128, 2, 0.015, 0.30),
    ModelSize("qwen2.5-14b", 14.7, 2, 48, 8, 128, 2, 0.022, 0.15),
    ModelSize("llama-3.1-70b-fp8", 70.6, 1, 80, 8, 128, 1, 0.040, 0.05),
)
RATE_RANGE = (0.05, 4.0)  # requests/s per service, drawn log-uniform


@dataclass(frozen=True, slots=True)
class Arrivals:
    """The trace: arrival second (from the first request), context and generated tokens."""

    t: F64
    context: F64
    generated: F64

    @property
    def span_s(self) -> float:
        return float(self.t[-1]) + 1.0


def load_arrivals(path: Path | None = None) -> Arrivals:
    """Read the bundled trace (or ``path``: the same CSV columns, plain or gzip). A file that
    cannot be read or a bad row is one ``ConfigError`` / ``TraceError`` line naming it."""
    name = TRACE if path is None else str(path)
    if path is None:
        text = resources.files("kallot").joinpath("data", "azure-llm-2023", TRACE).read_text()
    else:
        try:
            data = path.read_bytes()
            text = (gzip.decompress(data) if path.suffix == ".gz" else data).decode("utf-8-sig")
        except (OSError, EOFError) as exc:  # missing, a directory, a .gz not gzip or cut short
            why = getattr(exc, "strerror", None) or str(exc) or "cut short"
            raise ConfigError("--trace", name, f"a readable arrivals CSV ({why})") from None
        except UnicodeDecodeError:
            raise ConfigError("--trace", name, "a UTF-8 text CSV") from None
    lines = text.splitlines()
    head = lines[0].strip() if lines else ""
    if head != ARRIVALS_HEADER:
        raise TraceError(name, [RowError(name, 1, "header", head, f"'{ARRIVALS_HEADER}'")])
    ts, ctx, gen = [], [], []
    for n, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        cells = line.split(",")
        try:
            if len(cells) != 3:
                raise ValueError(line)
            stamp = datetime.fromisoformat(cells[0].strip()[:26]).timestamp()
            c, g = float(cells[1]), float(cells[2])
            if not (math.isfinite(c) and math.isfinite(g) and c >= 0 and g >= 0):
                raise ValueError(line)
        except ValueError:
            expected = "an ISO timestamp and two token counts >= 0"
            raise TraceError(name, [RowError(name, n, "-", line, expected)]) from None
        ts.append(stamp)
        ctx.append(c)
        gen.append(g)
    if not ts:
        raise TraceError(
            name, [RowError(name, 2, "-", "", "at least one arrival after the header")]
        )
    t = np.asarray(ts)
    order = np.argsort(t, kind="stable")
    t = t[order] - t[order][0]
    return Arrivals(t=t, context=np.asarray(ctx)[order], generated=np.asarray(gen)[order])


@dataclass(frozen=True, slots=True)
class Service:
    id: str
    model: ModelSize
    rate: float  # requests/s
    shift_s: float  # circular shift of the trace (services do not peak together)


def generate(n: int, seed: int, arrivals: Arrivals) -> list[Service]:
    """``n`` services drawn from MODELS with ``seed``."""
    rng = np.random.default_rng(seed)
    w = np.array([m.weight for m in MODELS])
    kinds = rng.choice(len(MODELS), size=n, p=w / w.sum())
    lo, hi = RATE_RANGE
    rates = np.exp(rng.uniform(np.log(lo), np.log(hi), size=n))
    shifts = rng.uniform(0, arrivals.span_s, size=n)
    return [
        Service(f"s{i:03d}-{MODELS[int(k)].name}", MODELS[int(k)], float(r), float(sh))
        for i, (k, r, sh) in enumerate(zip(kinds, rates, shifts, strict=True))
    ]


def usage(svc: Service, arrivals: Arrivals, rng: np.random.Generator) -> tuple[F64, F64]:
    """Per-second memory (MiB) and compute (milli) of one service over the trace's span."""
    span = math.ceil(arrivals.span_s)
    base_rate = len(arrivals.t) / arrivals.span_s
    keep = rng.random(len(arrivals.t)) < min(1.0, svc.rate / base_rate)
    a = (arrivals.t[keep] + svc.shift_s) % span
    ctx, gen = arrivals.context[keep], arrivals.generated[keep]
    m = svc.model
    prefill = ctx / m.prefill_tok_s
    dur = prefill + gen * m.decode_s
    kv_tokens = np.zeros(span + 1)
    tokens_s = np.zeros(span + 1)
    # Each request contributes to every whole second it is running, wrapping around the hour
    # (the shifted copy of the trace is circular).
    steps = np.ceil(dur).astype(np.int64) + 1
    req = np.repeat(np.arange(a.size), steps)
    offset = np.arange(steps.sum()) - np.repeat(np.cumsum(steps) - steps, steps)
    t_abs = a[req] + offset
    elapsed = np.clip(t_abs - a[req], 0, None)
    running = elapsed < dur[req]
    done = np.clip((elapsed - prefill[req]) / m.decode_s, 0, gen[req])
    held = np.where(running, ctx[req] + np.floor(done), 0.0)
    pages = np.ceil(held / PAGE_TOKENS) * PAGE_TOKENS
    sec = (np.floor(t_abs).astype(np.int64)) % span
    np.add.at(kv_tokens, sec, pages)
    # tokens processed in that second: the context once (prefill), then one token per decode step
    first = offset == 0
    np.add.at(tokens_s, sec, np.where(first, ctx[req], 0.0) + np.where(running, 1 / m.decode_s, 0))
    mem = np.minimum(m.base_mib + kv_tokens[:span] * m.kv_mib_per_token, ENGINE_CAP * H100_MEM)
    milli = np.minimum(MILLI, tokens_s[:span] * 2 * m.params_b * 1e9 / FLOPS * MILLI)
    return mem, milli


@dataclass(slots=True)
class Placed:
    gpus_needed: int = 0
    gpu_of: dict[str, tuple[int, int]] = field(default_factory=dict)
    unplaced: int = 0


def place(
    requests: dict[str, DeviceRequest],
    seed: int,
    policy: str,
    *,
    config: SchedulerConfiguration | None = None,
) -> Placed:
    """Place the fleet with the core on a cluster of H100 MPS GPUs (one GPU per service fits),
    with ``policy`` (the shipped file of that name, or ``config``)."""
    n_nodes = -(-len(requests) // GPUS_PER_NODE) + 1
    b = SnapshotBuilder()
    for i in range(n_nodes):
        b.add(
            NodeSpec(
                name=f"h100-{i}",
                cpu_milli=192_000,
                mem_mib=2 << 20,
                gpus=[
                    GpuSpec(model=H100, mem_mib=H100_MEM, uuid=f"GPU-{i}-{j}", mode=SharingMode.MPS)
                    for j in range(GPUS_PER_NODE)
                ],
            )
        )
    snap = b.build()
    tasks = [
        Task(id=sid, cpu_milli=2000, mem_mib=8 * GIB, gpu=req, created=float(k))
        for k, (sid, req) in enumerate(requests.items())
    ]
    fw = presets.framework(presets.document(policy, config), name=policy)
    d = Scheduler(fw, explain=False).run_session(
        snap, tasks, now=0.0, rng=np.random.default_rng(seed)
    )
    out = Placed(unplaced=len(d.unschedulable))
    for p in d.placements:
        for dev in p.devices:
            out.gpu_of[p.task_id] = (p.node_row, dev.slot)
    out.gpus_needed = len(set(out.gpu_of.values()))
    return out


@dataclass(slots=True)
class Replay:
    """The held-out part replayed second by second on one placement."""

    memory_overruns: int  # pods whose memory use exceeded their share at least once
    overrun_pod_minutes: float  # minutes of pods above their share, summed
    contention_gpu_minutes: float  # minutes of GPUs whose pods want > 1000 milli together, summed
    peak_ratio: dict[str, float]  # per pod: held-out peak memory / share

    def summary(self) -> dict[str, float]:
        return {
            "memory_overruns": self.memory_overruns,
            "overrun_pod_minutes": round(self.overrun_pod_minutes, 3),
            "contention_gpu_minutes": round(self.contention_gpu_minutes, 3),
        }


def replay(
    services: list[Service],
    series: dict[str, tuple[F64, F64]],
    start: int,
    share_mib: dict[str, int],
    placed: Placed,
) -> Replay:
    """Check every second from ``start`` on: memory above each pod's share, compute above each
    GPU's 1000 milli."""
    overruns = overrun_s = 0
    peak_ratio: dict[str, float] = {}
    per_gpu: dict[tuple[int, int], F64] = {}
    for s in services:
        mem, milli = series[s.id]
        held = mem[start:]
        over = int(np.count_nonzero(held > share_mib[s.id]))
        overruns += int(over > 0)
        overrun_s += over
        peak_ratio[s.id] = float(held.max()) / share_mib[s.id]
        gpu = placed.gpu_of.get(s.id)
        if gpu is not None:
            per_gpu[gpu] = per_gpu.get(gpu, np.zeros(held.size)) + milli[start:]
    contention_s = sum(int(np.count_nonzero(v > MILLI)) for v in per_gpu.values())
    return Replay(overruns, overrun_s / 60, contention_s / 60, peak_ratio)


@dataclass(slots=True)
class Result:
    seed: int
    services: list[Service]
    recommendations: dict[str, rightsize.Recommendation]
    as_requested: Placed
    rightsized: Placed
    as_requested_replay: Replay
    rightsized_replay: Replay
    train_s: int
    replay_s: int
    # per-GPU series of the held-out part for the plot: memory use / share, compute use
    fleet_mem_used: F64 = field(default_factory=lambda: np.zeros(0))
    fleet_mem_alloc_req: float = 0.0
    fleet_mem_alloc_rs: float = 0.0

    @property
    def memory_overruns(self) -> int:
        return self.rightsized_replay.memory_overruns

    @property
    def overrun_pod_minutes(self) -> float:
        return self.rightsized_replay.overrun_pod_minutes

    @property
    def peak_ratio(self) -> dict[str, float]:
        return self.rightsized_replay.peak_ratio

    def summary(self) -> dict[str, object]:
        forms: dict[str, int] = {}
        for r in self.recommendations.values():
            forms[r.form] = forms.get(r.form, 0) + 1
        return {
            "seed": self.seed,
            "services": len(self.services),
            "gpus_needed": {
                "as_requested": self.as_requested.gpus_needed,
                "rightsized": self.rightsized.gpus_needed,
            },
            "ratio": round(self.rightsized.gpus_needed / max(1, self.as_requested.gpus_needed), 4),
            "memory_overruns": self.memory_overruns,
            "overrun_pod_minutes": round(self.overrun_pod_minutes, 3),
            "contention_gpu_minutes": round(self.rightsized_replay.contention_gpu_minutes, 3),
            "as_requested": self.as_requested_replay.summary(),
            "unplaced": {
                "as_requested": self.as_requested.unplaced,
                "rightsized": self.rightsized.unplaced,
            },
            "train_s": self.train_s,
            "replay_s": self.replay_s,
            "recommendations": forms,
            "max_heldout_peak_over_share": round(max(self.peak_ratio.values(), default=0.0), 4),
        }


def run(
    n_services: int,
    seed: int,
    *,
    policy: str = "kallot",
    arrivals: Arrivals | None = None,
    progress: Callable[[str], None] | None = None,
    config: SchedulerConfiguration | None = None,
) -> Result:
    """The whole what-if; ``progress`` is called after each stage (STAGES)."""
    arr = arrivals if arrivals is not None else load_arrivals()
    services = generate(n_services, seed, arr)
    rng = np.random.default_rng(seed + 1)
    series = {s.id: usage(s, arr, rng) for s in services}
    span = len(next(iter(series.values()))[0])
    train_s = int(span * TRAIN_FRACTION)
    _tick(progress, "usage")
    # as requested: a whole H100 each; the pods accept an MPS share (memory-limited) instead
    whole = DeviceRequest(
        count=1, models=frozenset({H100}), modes=frozenset({SharingMode.MPS, SharingMode.EXCLUSIVE})
    )
    recs: dict[str, rightsize.Recommendation] = {}
    for s in services:
        mem, milli = series[s.id]
        # what Prometheus would have scraped during the training part
        u = rightsize.Usage.of(mem[:train_s:SCRAPE_S], milli[:train_s:SCRAPE_S], window_s=train_s)
        recs[s.id] = rightsize.recommend(u, whole, H100, H100_MEM)
    _tick(progress, "recommend")
    as_req = place({s.id: whole for s in services}, seed, policy, config=config)
    _tick(progress, "place as requested")
    rs = place({s.id: recs[s.id].request for s in services}, seed, policy, config=config)
    _tick(progress, "place right-sized")
    whole_mem = {s.id: H100_MEM for s in services}
    req_replay = replay(services, series, train_s, whole_mem, as_req)
    rs_replay = replay(services, series, train_s, {k: r.mem_mib for k, r in recs.items()}, rs)
    fleet_mem = sum((series[s.id][0][train_s:] for s in services), np.zeros(span - train_s))
    _tick(progress, "replay")
    return Result(
        seed=seed,
        services=services,
        recommendations=recs,
        as_requested=as_req,
        rightsized=rs,
        as_requested_replay=req_replay,
        rightsized_replay=rs_replay,
        train_s=train_s,
        replay_s=span - train_s,
        fleet_mem_used=fleet_mem,
        fleet_mem_alloc_req=float(as_req.gpus_needed * H100_MEM),
        fleet_mem_alloc_rs=float(sum(recs[s.id].mem_mib for s in services)),
    )


STAGES = ("usage", "recommend", "place as requested", "place right-sized", "replay")


def _tick(progress: Callable[[str], None] | None, stage: str) -> None:
    if progress is not None:
        progress(stage)


def gpu_equivalents_of(req: DeviceRequest) -> float:
    """GPU-equivalents of a request on an H100 (for the table)."""
    return rightsize.gpu_equivalents(req, H100, H100_MEM)
