"""The LLM-serving fleet simulator (sim.fleet): service sizes, strategy conversion, and the
comparison's invariants on a small fleet."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kallot.core.resources import Isolation, SharingMode
from kallot.sim import fleet


def test_service_memory_is_weights_plus_kv_plus_overhead() -> None:
    by = {c.name: c for c in fleet.CLASSES}
    # 7B fp16: 7e9 * 2 B = 13351.0 MiB weights + (8 + 2) GiB = 13351 + 10240 -> 23592 MiB
    assert by["llm-7b-fp16"].mem_mib == 23592
    # 70B fp8: 70e9 B = 66757.2 MiB + (24 + 3) GiB = 27648 -> ceil 94406 MiB: over an 80 GB H100
    assert by["llm-70b-fp8"].mem_mib == 94406


def test_mig_profile_is_the_smallest_that_holds_memory_and_compute() -> None:
    # 23592 MiB on an H100: 1g.20gb/2g.20gb hold 20096 MiB, too small -> 3g.40gb (40448)
    p = fleet.mig_profile_for("H100-80GB", 23592, 100)
    assert p is not None and p.name == "3g.40gb"
    # 3 GiB and 300 milli: 1g (142 milli) too little compute, 2g (285) too -> 3g (428)
    p = fleet.mig_profile_for("H100-80GB", 3072, 300)
    assert p is not None and p.name == "3g.40gb"
    # 3 GiB and 100 milli: 1g.10gb
    p = fleet.mig_profile_for("H100-80GB", 3072, 100)
    assert p is not None and p.name == "1g.10gb"
    assert fleet.mig_profile_for("H100-80GB", 90_000, 10) is None


def test_kallot_hands_the_core_a_share_with_isolation_and_modes() -> None:
    # no sim-side choice: every service is a share (its compute and memory) that accepts MPS and
    # MIG, narrowed by its isolation; the cluster has an MPS pool and a dynamic MIG pool
    for iso in Isolation:
        a = fleet.ask("kallot", fleet.Service("s", "llm-7b-fp16", 23592, 200, iso, "H100-80GB"))
        assert a.mode is SharingMode.MPS and a.also_mig and not a.req.mig_profile
        assert a.req.mem_mib == 23592 and a.req.milli == 200 and a.req.isolation is iso
        assert a.req.modes == {SharingMode.MPS, SharingMode.MIG}
        assert a.req.accepts(SharingMode.MIG)
        assert a.req.accepts(SharingMode.MPS) == (iso is not Isolation.UNTRUSTED)


def test_untrusted_services_run_on_mig_instances_that_hold_them() -> None:
    services = fleet.generate(40, 5)
    r = fleet.run_strategy("kallot", services, 5)
    untrusted = sum(1 for s in services if s.isolation is Isolation.UNTRUSTED)
    assert untrusted > 0 and r.modes.get("mig", 0) >= untrusted
    assert r.isolation_violations == 0 and r.memory_overcommit_events == 0


@pytest.fixture(scope="module")
def small() -> fleet.Comparison:
    return fleet.compare(60, seed=3)


def test_every_strategy_places_the_whole_fleet(small: fleet.Comparison) -> None:
    for name, r in small.results.items():
        assert r.unplaced == 0, name
        assert r.placed == 60, name


def test_integer_needs_one_gpu_per_service_and_kallot_shares(small: fleet.Comparison) -> None:
    r = small.results
    assert r["integer"].gpus_needed == 60  # every service fits one GPU
    assert r["kallot"].gpus_needed < r["mig-dynamic"].gpus_needed <= r["mig-static"].gpus_needed
    assert r["kallot"].gpus_needed * 3 <= r["integer"].gpus_needed


def test_only_mechanisms_without_isolation_break_it(small: fleet.Comparison) -> None:
    r = small.results
    for name in ("integer", "mig-static", "mig-dynamic", "kallot"):
        assert r[name].isolation_violations == 0, name
        assert r[name].memory_overcommit_events == 0, name
    assert r["mps"].memory_overcommit_events == 0  # memory-limited clients
    untrusted = sum(1 for s in small.services if s.isolation is Isolation.UNTRUSTED)
    assert r["mps"].isolation_violations == untrusted
    # time-slicing breaks every service that needs memory isolation or better
    needing = sum(1 for s in small.services if s.isolation is not Isolation.NONE)
    assert r["time-slicing"].isolation_violations == needing


def test_dynamic_mig_reconfigures_and_summary_has_the_keys(small: fleet.Comparison) -> None:
    assert small.results["mig-dynamic"].reconfigurations == 60  # empty GPUs: one create each
    s = small.summary()
    gpus = s["gpus_needed"]
    assert isinstance(gpus, dict) and set(gpus) == set(fleet.STRATEGIES)
    assert s["seed"] == 3 and s["memory_overcommit_events"] == 0 and s["isolation_violations"] == 0


def test_same_seed_same_fleet() -> None:
    assert fleet.generate(40, 7) == fleet.generate(40, 7)
    assert fleet.generate(40, 7) != fleet.generate(40, 8)


@settings(max_examples=8, deadline=None)
@given(n=st.integers(1, 40), seed=st.integers(0, 10_000))
def test_any_fleet_is_placed_whole_and_kallot_never_breaks_memory_or_isolation(
    n: int, seed: int
) -> None:
    cmp = fleet.compare(n, seed)
    for name, r in cmp.results.items():
        assert r.unplaced == 0, name
        assert r.gpus_needed <= n, name  # never more GPUs than services
    k = cmp.results["kallot"]
    assert k.memory_overcommit_events == 0 and k.isolation_violations == 0
    assert k.gpus_needed <= cmp.results["integer"].gpus_needed
