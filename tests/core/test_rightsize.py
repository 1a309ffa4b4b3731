"""core.rightsize: the headroom rule with worked numbers, and two properties against the core
itself as the oracle: a recommendation never holds less memory than the observed peak, and it
never makes a pod unschedulable where its current request fits without saying so."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kallot.config import presets
from kallot.core import mig, policies, rightsize
from kallot.core.framework.runner import Framework
from kallot.core.resources import GPU_MODELS, Isolation, SharingMode
from kallot.core.rightsize import Usage
from kallot.core.scheduler import Scheduler
from kallot.core.snapshot import GpuSpec, NodeSpec, Snapshot, SnapshotBuilder
from kallot.core.workload import DeviceRequest, Task

H100 = "H100-80GB"
H100_MEM = GPU_MODELS[H100].memory_mib  # 81559
WHOLE = DeviceRequest(count=1)


def fits_on(snap: Snapshot) -> Callable[[DeviceRequest], bool]:
    fw = Framework(presets.PROFILES["first-fit"], policies.builtin_registry())

    def fits(req: DeviceRequest) -> bool:
        task = Task(id="t", cpu_milli=100, mem_mib=100, gpu=req)
        d = Scheduler(fw, explain=False).run_session(
            snap, [task], now=0.0, rng=np.random.default_rng(0)
        )
        return len(d.placements) == 1

    return fits


def test_memory_rule_worked_numbers() -> None:
    # 100 samples 10000..10990 MiB: peak 10990, q99 = 10980.1
    # max(10990 x 1.10 = 12089, 10980.1 x 1.25 = 13725.1, 10990 + 512 = 11502) = 13725.1
    # -> rounded up to 256: 13824
    mem = np.arange(10000, 11000, 10, dtype=float)
    assert rightsize.memory_target(mem) == 13824
    # a flat series: margins on the peak decide, 20000 x 1.25 = 25000 -> 25088
    assert rightsize.memory_target(np.full(50, 20000.0)) == 25088
    # compute: q95 of 0..990 step 10 = 940.5 x 1.2 = 1128.6 -> capped at 1000
    assert rightsize.compute_target(np.arange(0, 1000, 10, dtype=float)) == 1000
    # q95 of a flat 100 = 100 x 1.2 = 120
    assert rightsize.compute_target(np.full(40, 100.0)) == 120


def test_recommend_forms() -> None:
    # 13824 MiB, 120 milli on an H100: share max(0.12, 13824/81559 = 0.1695) = 0.1695 GPU-eq
    u = Usage.of(np.arange(10000, 11000, 10), np.full(100, 100.0), window_s=3600)
    r = rightsize.recommend(u, WHOLE, H100, H100_MEM)
    assert r.form == rightsize.SHARE
    assert (r.request.mem_mib, r.request.milli) == (13824, 120)
    assert r.gpu_eq_now == 1.0
    assert r.saving_gpu_eq == pytest.approx(1 - 13824 / H100_MEM)
    assert r.confidence == "low" and r.samples == 100
    assert "10990" in r.oom_risk and "out of memory" in r.oom_risk
    # untrusted: no share, the smallest MIG profile holding 13824 MiB and 120 milli: 1g.20gb
    untrusted = DeviceRequest(count=1, isolation=Isolation.UNTRUSTED)
    r = rightsize.recommend(u, untrusted, H100, H100_MEM)
    assert r.form == rightsize.MIG and r.request.mig_profile == "1g.20gb"
    assert r.gpu_eq_after == 0.25  # max(142/1000, 2/8)
    # heavy use: keep the whole GPU
    heavy = Usage.of(np.full(100, 70000.0), np.full(100, 900.0), window_s=3600)
    assert rightsize.recommend(heavy, WHOLE, H100, H100_MEM).form == rightsize.WHOLE
    # too few samples: keep
    few = Usage.of(np.full(5, 1000.0), np.full(5, 10.0), window_s=60)
    r = rightsize.recommend(few, WHOLE, H100, H100_MEM)
    assert r.form == rightsize.KEEP and r.confidence == "none" and r.request == WHOLE


def test_recommend_falls_back_where_the_share_fits_nowhere() -> None:
    # a cluster of exclusive GPUs only: the share fits nowhere, MIG neither, keep the whole GPU
    snap = SnapshotBuilder().add(_node("n0", [SharingMode.EXCLUSIVE] * 2)).build()
    u = Usage.of(np.full(100, 5000.0), np.full(100, 50.0), window_s=3600)
    r = rightsize.recommend(u, WHOLE, H100, H100_MEM, fits=fits_on(snap))
    assert r.form == rightsize.KEEP and r.request == WHOLE
    assert any("fits nowhere" in n for n in r.notes)


def _node(name: str, modes: list[SharingMode]) -> NodeSpec:
    return NodeSpec(
        name=name,
        cpu_milli=64_000,
        mem_mib=512_000,
        gpus=[
            GpuSpec(
                model=H100,
                mem_mib=H100_MEM,
                uuid=f"GPU-{name}-{i}",
                mode=m,
                replicas=4,
                mig_dynamic=m is SharingMode.MIG,
            )
            for i, m in enumerate(modes)
        ],
    )


MODES = [SharingMode.EXCLUSIVE, SharingMode.TIMESLICE, SharingMode.MPS, SharingMode.MIG]
series = st.lists(st.floats(0, H100_MEM), min_size=1, max_size=80)
computes = st.lists(st.floats(0, 1000), min_size=1, max_size=80)


@st.composite
def requests(draw: st.DrawFn) -> DeviceRequest:
    modes = frozenset(draw(st.sets(st.sampled_from(MODES), min_size=1)))
    iso = draw(st.sampled_from(list(Isolation)))
    if draw(st.booleans()):
        return DeviceRequest(count=1, modes=modes, isolation=iso)
    milli = draw(st.integers(10, 1000))
    mem = draw(st.integers(0, H100_MEM))
    return DeviceRequest(milli=milli, mem_mib=mem, modes=modes, isolation=iso)


@settings(max_examples=150, deadline=None)
@given(
    mem=series,
    milli=computes,
    current=requests(),
    modes=st.lists(st.lists(st.sampled_from(MODES), min_size=1, max_size=3), max_size=3),
)
def test_recommendation_properties(
    mem: list[float], milli: list[float], current: DeviceRequest, modes: list[list[SharingMode]]
) -> None:
    n = max(len(mem), len(milli))
    u = Usage.of(np.resize(mem, max(n, 30)), np.resize(milli, max(n, 30)), window_s=3600)
    snap = SnapshotBuilder().extend(_node(f"n{i}", m) for i, m in enumerate(modes)).build()
    fits = fits_on(snap)
    r = rightsize.recommend(u, current, H100, H100_MEM, fits=fits)
    peak = max(mem)
    # 1. never below the observed peak memory (a kept request is the user's, not ours)
    if r.form != rightsize.KEEP:
        assert r.mem_mib >= peak
        if r.form == rightsize.MIG:
            p = mig.profile(H100, r.request.mig_profile)
            assert p is not None and p.mem_mib >= peak
    # 2. never unschedulable where the current request fits, unless a note says so
    if fits(current) and not fits(r.request):
        assert any("fits nowhere" in note for note in r.notes)
    # the saving is what the two requests take
    assert r.saving_gpu_eq == pytest.approx(max(0.0, r.gpu_eq_now - r.gpu_eq_after))
