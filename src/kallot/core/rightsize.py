"""Right-sizing: the request a workload should make, from what it was seen to use.

Where it sits: the core, pure. The shells read observed series (``kallot rightsize`` from
Prometheus, ``kallot sim rightsize`` from a trace-driven replay) and hand them here as ``Usage``;
``recommend`` returns a ``Recommendation``: a share (memory + compute, served by MPS or
time-slicing), the smallest MIG profile holding both, or "keep the whole GPU"; with the
confidence (samples, window), the expected saving in GPU-equivalents and the risk of running out
of memory stated in words. docs/rightsizing.md explains the rule to users.

Memory rule (``Headroom``), memory safety first: the recommended memory is the largest of

- the observed peak x (1 + ``peak_margin``),
- the ``quantile`` of the samples x (1 + ``quantile_margin``),
- the observed peak + ``min_margin_mib``,
- the observed peak + ``swing_margin`` x (peak - lowest sample): the part of the memory that
  varies (a serving engine's KV cache on top of its fixed weights) may grow by that factor,

rounded up to ``round_mib``: never below the peak seen, and at least ``min_margin_mib`` above
it. A workload runs out of memory only if its future peak exceeds the observed peak by more than
that margin. Compute: the ``compute_quantile`` of compute samples x (1 + ``compute_margin``),
rounded up to 10 milli and at least ``min_milli``; compute above the share is not fatal (MPS
and time-slicing contend, a MIG instance runs slower).

Where the share would take more than ``whole_above`` of the GPU (in GPU-equivalents), the
recommendation is to keep the whole GPU. A recommendation is checked against the cluster when
a ``fits`` predicate is given: a smaller request that fits nowhere where the original fits is not
recommended silently; the next form is tried and, failing all, the original is kept with a note.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from kallot.core import mig
from kallot.core.resources import MILLI, SharingMode
from kallot.core.workload import DeviceRequest

F64 = NDArray[np.float64]

# Forms of a recommendation.
SHARE, MIG, WHOLE, KEEP = "share", "mig", "whole", "keep"

MIN_SAMPLES = 30  # below this, no recommendation: the series says too little
DAY_S = 86_400.0


@dataclass(frozen=True, slots=True)
class Headroom:
    """The documented headroom rule (module docstring); the defaults are kallot's."""

    quantile: float = 0.99
    peak_margin: float = 0.10
    quantile_margin: float = 0.25
    min_margin_mib: int = 512
    swing_margin: float = 1.0
    round_mib: int = 256
    compute_quantile: float = 0.95
    compute_margin: float = 0.20
    min_milli: int = 10
    whole_above: float = 0.75

    def __post_init__(self) -> None:
        if not 0.5 <= self.quantile <= 1.0:
            raise ValueError(f"Headroom.quantile: got {self.quantile}, expected 0.5..1")
        if not 0.5 <= self.compute_quantile <= 1.0:
            raise ValueError(
                f"Headroom.compute_quantile: got {self.compute_quantile}, expected 0.5..1"
            )
        if min(self.peak_margin, self.quantile_margin, self.compute_margin, self.swing_margin) < 0:
            raise ValueError("Headroom margins: expected >= 0")
        if self.min_margin_mib < 0 or self.round_mib < 1 or self.min_milli < 1:
            raise ValueError(
                "Headroom: expected min_margin_mib >= 0, round_mib >= 1, min_milli >= 1"
            )


HEADROOM = Headroom()


@dataclass(frozen=True, slots=True)
class Usage:
    """Observed use of one workload on one GPU (per pod and device): memory in MiB and compute
    in milli-GPU (1000 = one whole GPU busy), one value per sample, over ``window_s`` seconds."""

    mem_mib: F64
    milli: F64
    window_s: float

    @staticmethod
    def of(mem_mib: object, milli: object, window_s: float) -> Usage:
        m = np.asarray(mem_mib, dtype=np.float64).ravel()
        c = np.asarray(milli, dtype=np.float64).ravel()
        if m.size and (not np.all(np.isfinite(m)) or m.min() < 0):
            raise ValueError("Usage.mem_mib: expected finite values >= 0")
        if c.size and (not np.all(np.isfinite(c)) or c.min() < 0):
            raise ValueError("Usage.milli: expected finite values >= 0")
        if window_s < 0:
            raise ValueError(f"Usage.window_s: got {window_s}, expected >= 0")
        return Usage(mem_mib=m, milli=c, window_s=float(window_s))

    @property
    def samples(self) -> int:
        return int(self.mem_mib.size)


@dataclass(frozen=True, slots=True)
class Recommendation:
    """What to ask for instead of ``current`` (``request``), and why."""

    form: str  # SHARE | MIG | WHOLE | KEEP
    request: DeviceRequest
    current: DeviceRequest
    model: str
    gpu_mem_mib: int
    peak_mem_mib: float
    quantile_mem_mib: float
    quantile_milli: float
    samples: int
    window_s: float
    confidence: str  # 'high' | 'medium' | 'low' | 'none'
    gpu_eq_now: float  # GPU-equivalents the current request takes (per pod)
    gpu_eq_after: float  # ... and the recommended one
    oom_risk: str  # the risk of running out of memory, in words
    notes: tuple[str, ...] = field(default=())

    @property
    def saving_gpu_eq(self) -> float:
        """GPU-equivalents saved per pod (never negative: a larger recommendation saves 0)."""
        return max(0.0, self.gpu_eq_now - self.gpu_eq_after)

    @property
    def mem_mib(self) -> int:
        """Memory the recommended request holds on the workload's GPU model."""
        if self.request.mig_profile:
            p = mig.profile(self.model, self.request.mig_profile)
            return 0 if p is None else p.mem_mib
        return self.request.memory_for(self.gpu_mem_mib)

    @property
    def milli(self) -> int:
        if self.request.mig_profile:
            p = mig.profile(self.model, self.request.mig_profile)
            return 0 if p is None else p.milli
        return self.request.milli


def gpu_equivalents(req: DeviceRequest, model: str, gpu_mem_mib: int) -> float:
    """GPU-equivalents ``req`` takes per pod on a GPU of ``model`` (core.fit.gpu_equivalents's
    rule before placement: the larger of compute and memory share; a MIG instance by its
    slices, max(compute/7, memory slices/8))."""
    if req.mig_profile:
        p = mig.profile(model, req.mig_profile)
        if p is None:
            return 1.0
        return max(p.milli / MILLI, p.mem_slices / mig.MEMORY_SLICES)
    if req.whole:
        return float(req.count)
    mem = req.memory_for(gpu_mem_mib) / gpu_mem_mib if gpu_mem_mib > 0 else 0.0
    return req.count * max(req.milli / MILLI, mem)


def memory_target(mem_mib: F64, rule: Headroom = HEADROOM) -> int:
    """Recommended memory (MiB) for a memory series by the headroom rule; >= the peak."""
    if mem_mib.size == 0:
        return 0
    peak = float(mem_mib.max())
    q = float(np.quantile(mem_mib, rule.quantile))
    swing = peak - float(mem_mib.min())
    want = max(
        peak * (1 + rule.peak_margin),
        q * (1 + rule.quantile_margin),
        peak + rule.min_margin_mib,
        peak + rule.swing_margin * swing,
    )
    return int(math.ceil(want / rule.round_mib) * rule.round_mib)


def compute_target(milli: F64, rule: Headroom = HEADROOM) -> int:
    """Recommended compute (milli-GPU) for a compute series; at most one GPU."""
    if milli.size == 0:
        return rule.min_milli
    q = float(np.quantile(milli, rule.compute_quantile)) * (1 + rule.compute_margin)
    return int(min(MILLI, max(rule.min_milli, math.ceil(q / 10) * 10)))


def confidence(samples: int, window_s: float) -> str:
    """'high': >= 7 days and >= 2000 samples; 'medium': >= 1 day and >= 200; 'low': any series
    of at least MIN_SAMPLES; 'none' below (no recommendation is made)."""
    if samples < MIN_SAMPLES:
        return "none"
    if window_s >= 7 * DAY_S and samples >= 2000:
        return "high"
    if window_s >= DAY_S and samples >= 200:
        return "medium"
    return "low"


def recommend(
    usage: Usage,
    current: DeviceRequest,
    model: str,
    gpu_mem_mib: int,
    *,
    rule: Headroom = HEADROOM,
    fits: Callable[[DeviceRequest], bool] | None = None,
) -> Recommendation:
    """The recommendation for one workload whose pods ask ``current`` on GPUs of ``model``
    (``gpu_mem_mib`` MiB each). ``fits`` (optional): does a request fit the cluster? The
    recommendation then never silently makes the workload unschedulable (module docstring)."""
    conf = confidence(usage.samples, usage.window_s)
    peak = float(usage.mem_mib.max()) if usage.samples else 0.0
    q_mem = float(np.quantile(usage.mem_mib, rule.quantile)) if usage.samples else 0.0
    q_milli = float(np.quantile(usage.milli, rule.compute_quantile)) if usage.milli.size else 0.0
    now = gpu_equivalents(current, model, gpu_mem_mib)

    def result(form: str, req: DeviceRequest, risk: str, *notes: str) -> Recommendation:
        return Recommendation(
            form=form,
            request=req,
            current=current,
            model=model,
            gpu_mem_mib=gpu_mem_mib,
            peak_mem_mib=peak,
            quantile_mem_mib=q_mem,
            quantile_milli=q_milli,
            samples=usage.samples,
            window_s=usage.window_s,
            confidence=conf,
            gpu_eq_now=now,
            gpu_eq_after=gpu_equivalents(req, model, gpu_mem_mib),
            oom_risk=risk,
            notes=notes,
        )

    if conf == "none":
        return result(
            KEEP,
            current,
            "unchanged: the current request is kept",
            f"{usage.samples} samples: at least {MIN_SAMPLES} are needed for a recommendation",
        )
    if current.count != 1:
        return result(
            KEEP,
            current,
            "unchanged: the current request is kept",
            f"{current.count} GPUs per pod: only single-GPU pods are right-sized",
        )

    mem = memory_target(usage.mem_mib, rule)
    notes: list[str] = []
    if usage.milli.size:
        milli = compute_target(usage.milli, rule)
    else:
        # NVML keeps no per-process compute samples inside MIG instances: keep what it has
        p_now = mig.profile(model, current.mig_profile) if current.mig_profile else None
        milli = p_now.milli if p_now is not None else current.milli
        notes.append(f"no compute samples: compute kept at the current {milli} milli")
    margin = mem - peak
    candidates: list[tuple[str, DeviceRequest, str]] = []
    share_eq = max(milli / MILLI, mem / gpu_mem_mib) if gpu_mem_mib > 0 else 1.0
    if mem > gpu_mem_mib or share_eq > rule.whole_above:
        whole = DeviceRequest(
            count=1,
            models=current.models,
            modes=current.modes,
            isolation=current.isolation,
            topology=current.topology,
        )
        candidates.append(
            (
                WHOLE,
                whole,
                f"keep the whole GPU ({gpu_mem_mib} MiB): the observed peak of {peak:.0f} MiB "
                f"plus headroom ({mem} MiB) or the compute ({milli} milli) needs more than "
                f"{rule.whole_above:.0%} of it. A future peak above {gpu_mem_mib} MiB, "
                f"{gpu_mem_mib - peak:.0f} MiB above the observed one, runs out of memory.",
            )
        )
    else:
        limited = current.accepts(SharingMode.MPS)
        if current.accepts(SharingMode.MPS) or current.accepts(SharingMode.TIMESLICE):
            share = DeviceRequest(
                count=1,
                milli=milli,
                mem_mib=mem,
                models=current.models,
                modes=current.modes,
                isolation=current.isolation,
                topology=current.topology,
            )
            enforced = (
                "an MPS client is stopped by CUDA out-of-memory errors above it"
                if limited
                else "time-slicing does not enforce it: a neighbour on the GPU can run out instead"
            )
            candidates.append(
                (
                    SHARE,
                    share,
                    f"{mem} MiB is {margin:.0f} MiB ({margin / max(peak, 1):.0%}) above the "
                    f"observed peak of {peak:.0f} MiB; {enforced}. A future peak more than "
                    f"{margin:.0f} MiB above the observed one runs out of memory.",
                )
            )
        p = mig.profile_for_share(model, mem, milli)
        if p is not None and current.accepts(SharingMode.MIG) and p.mem_slices < mig.MEMORY_SLICES:
            slack = p.mem_mib - peak
            candidates.append(
                (
                    MIG,
                    DeviceRequest(
                        count=1,
                        mig_profile=p.name,
                        models=frozenset({model}),
                        isolation=current.isolation,
                        topology=current.topology,
                    ),
                    f"{p.name} holds {p.mem_mib} MiB, {slack:.0f} MiB above the observed peak of "
                    f"{peak:.0f} MiB (headroom rule: {mem} MiB); the instance's memory is a hard "
                    "limit: a larger future peak runs out of memory.",
                )
            )
        if not candidates:
            candidates.append(
                (
                    KEEP,
                    current,
                    "unchanged: the request accepts neither a share nor a MIG instance",
                )
            )
    if fits is not None and fits(current):
        for form, req, risk in candidates:
            if fits(req):
                return result(form, req, risk, *notes)
            notes.append(f"{form} ({_describe(req)}) fits nowhere in the cluster")
        return result(
            KEEP,
            current,
            "unchanged: the current request is kept",
            *notes,
            "kept: no smaller request fits where the current one fits",
        )
    form, req, risk = candidates[0]
    if fits is not None and not fits(req):
        notes.append(f"{_describe(req)} fits nowhere in the cluster (nor does the current request)")
    return result(form, req, risk, *notes)


def _describe(req: DeviceRequest) -> str:
    if req.mig_profile:
        return f"MIG {req.mig_profile}"
    if req.whole:
        return f"{req.count} whole GPU"
    return f"{req.milli} milli, {req.mem_mib} MiB"
