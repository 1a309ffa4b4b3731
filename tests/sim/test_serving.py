"""sim.serving: the bundled trace, the services built from it, and the simulation's books."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kallot.core.errors import ConfigError
from kallot.core.models import GB, LoadModel
from kallot.sim import serving


@pytest.fixture(scope="module")
def traces() -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    return {k: serving.arrivals(serving.bundled(v)) for k, v in serving.TRACES.items()}


def test_bundled_trace_is_the_published_hour(traces: dict) -> None:  # type: ignore[type-arg]
    sizes = {k: v[0].size for k, v in traces.items()}
    assert sizes == {"code": 8819, "conv": 19366}
    for t, ctx, gen in traces.values():
        assert t[0] == 0.0 and np.all(np.diff(t) >= 0)
        assert 3400 < t[-1] < 3600  # about one hour
        assert ctx.min() > 0 and gen.min() >= 0


def test_bad_trace_row_names_the_line(tmp_path: Path) -> None:
    bad = tmp_path / "t.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.98,12,x\n")
    with pytest.raises(ConfigError, match=r"t\.csv line 2"):
        serving.arrivals(bad)


def test_workload_is_seeded_thinning(traces: dict) -> None:  # type: ignore[type-arg]
    a, b, c = serving.workload(1, traces), serving.workload(1, traces), serving.workload(2, traces)
    assert [s.t.tolist() for s in a] == [s.t.tolist() for s in b]
    assert [s.t.size for s in a] != [s.t.size for s in c]
    for svc, (name, trace, _, share) in zip(a, serving.SERVICES, strict=True):
        assert svc.name == name
        n = traces[trace][0].size
        assert abs(svc.t.size - share * n) < 5 * np.sqrt(share * n) + 5


def test_lru_keeps_pinned_and_budget() -> None:
    lru = serving._Lru(100)
    assert lru.touch("a", 60) and lru.touch("b", 30)
    lru.pinned = {"a"}
    assert lru.touch("c", 40)  # evicts b, not the pinned a
    assert "a" in lru and "c" in lru and "b" not in lru
    assert sum(lru.items.values()) <= 100
    assert not lru.touch("d", 101)


def _short(traces: dict, minutes: float = 12) -> list[serving.Service]:  # type: ignore[type-arg]
    out = []
    for s in serving.workload(3, traces):
        keep = s.t < minutes * 60
        out.append(dataclasses.replace(s, t=s.t[keep], ctx=s.ctx[keep], gen=s.gen[keep]))
    return out


@pytest.mark.parametrize("policy", serving.POLICIES)
def test_every_request_is_served_and_books_balance(traces: dict, policy: str) -> None:  # type: ignore[type-arg]
    services = _short(traces)
    sim = serving.ServingSim(services, policy, seed=3)
    result = sim.run()
    n = sum(s.t.size for s in services)
    assert result.ttft.size == n  # nobody is left waiting
    prefill = np.concatenate([s.ctx / 1000 * s.cls.prefill_s_per_k for s in services])
    assert np.all(result.ttft >= prefill[~np.isnan(sim.ttft)] - 1e-9)
    assert not sim.replicas and all(not st.replicas for st in sim.state)
    # every replica gave its GPUs (and CPU) back: only the background is left
    fresh = serving.ServingSim(services, policy, seed=3).cluster.usage
    assert sim.cluster.usage.gpu_clients.tolist() == fresh.gpu_clients.tolist()
    assert sim.cluster.usage.cpu.tolist() == fresh.cpu.tolist()
    assert sum(result.starts.values()) == len(result.start_log)
    assert result.timeline_gpus.max() <= serving.NODES * serving.GPUS_PER_NODE
    assert result.gpu_hours > 0


def test_cold_starts_cost_load_time(traces: dict) -> None:  # type: ignore[type-arg]
    # With instant loads the worst wait is queueing only; with the stated model cold starts
    # add minutes for the requests that wait on a remote load.
    services = _short(traces)
    instant = LoadModel(startup_s=0.0, remote_bytes_per_s=1e6 * GB)
    fast = serving.ServingSim(services, "blind", seed=3, load=instant).run()
    slow = serving.ServingSim(services, "blind", seed=3).run()
    assert slow.ttft.max() > fast.ttft.max() + 10


def test_unknown_policy_is_rejected(traces: dict) -> None:  # type: ignore[type-arg]
    with pytest.raises(ConfigError, match="policy"):
        serving.ServingSim(_short(traces, 1), "nope", seed=0)


def _drop_after(services: list[serving.Service], at: float) -> list[serving.Service]:
    """The same services with the arrivals after ``at`` removed but the last one of each
    service (so the run lasts as long)."""
    out = []
    for s in services:
        idx = np.arange(s.t.size)
        keep = (s.t <= at) | (idx == s.t.size - 1)
        out.append(dataclasses.replace(s, t=s.t[keep], ctx=s.ctx[keep], gen=s.gen[keep]))
    return out


@pytest.mark.parametrize("at", [760.0, 1000.0])
def test_prewarm_uses_no_look_ahead(traces: dict, at: float) -> None:  # type: ignore[type-arg]
    # Decisions up to time t (which service is kept warm, which replicas start from which
    # tier) are the same when the arrivals after t are removed.
    services = _short(traces, 20)
    full = serving.ServingSim(services, "prewarm", seed=3)
    cut = serving.ServingSim(_drop_after(services, at), "prewarm", seed=3)
    a, b = full.run(), cut.run()
    assert any(t <= at for t, _ in a.keep_log)  # the policy did keep a replica warm by then
    assert [k for k in a.keep_log if k[0] <= at] == [k for k in b.keep_log if k[0] <= at]
    assert [s for s in a.start_log if s[0] <= at] == [s for s in b.start_log if s[0] <= at]
    assert (a.keep_log, a.start_log) != (b.keep_log, b.start_log)  # the future did matter


def test_prewarm_keeps_warm_within_budget(traces: dict) -> None:  # type: ignore[type-arg]
    services = _short(traces, 20)
    for budget in (0.002, serving.KEEP_WARM_BUDGET):
        sim = serving.ServingSim(services, "prewarm", seed=3, keep_budget=budget)
        result = sim.run()
        assert result.kept_gpu_seconds > 0
        assert result.kept_gpu_seconds <= budget * (result.gpu_seconds - result.kept_gpu_seconds)
        assert result.kept_gpu_seconds == sum(
            services[i].cls.gpus * serving.TICK_S for _, i in result.keep_log
        )
    tight = serving.ServingSim(services, "prewarm", seed=3, keep_budget=0.002).run()
    loose = serving.ServingSim(services, "prewarm", seed=3).run()
    assert tight.kept_gpu_seconds < loose.kept_gpu_seconds  # the budget binds


@pytest.mark.parametrize("policy", ["blind", "cache_aware"])
def test_baselines_never_keep_warm(traces: dict, policy: str) -> None:  # type: ignore[type-arg]
    result = serving.ServingSim(_short(traces, 20), policy, seed=3).run()
    assert result.kept_gpu_seconds == 0 and not result.keep_log


def test_keep_warm_pays_where_predicted(traces: dict) -> None:  # type: ignore[type-arg]
    # Kept replicas belong to services whose predicted rate x cold-start seconds >= threshold
    # x GPUs; with no budget, prewarm never keeps one.
    services = _short(traces, 20)
    off = serving.ServingSim(services, "prewarm", seed=3, keep_budget=0.0).run()
    assert off.kept_gpu_seconds == 0
    sim = serving.ServingSim(services, "prewarm", seed=3, keep_threshold=5.0)
    result = sim.run()
    for t, i in result.keep_log:
        recent = services[i].t[
            (services[i].t <= t) & (services[i].t >= t - serving.PREWARM_WINDOW_S)
        ]
        rate = recent.size / min(serving.PREWARM_WINDOW_S, t)
        assert rate * sim.cold_cost_s(i) >= 5.0 * services[i].cls.gpus


@pytest.mark.parametrize("field", ["keep_threshold", "keep_budget"])
def test_negative_keep_settings_are_rejected(traces: dict, field: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ConfigError, match=field):
        settings: dict[str, Any] = {field: -1.0}
        serving.ServingSim(_short(traces, 1), "prewarm", seed=0, **settings)
