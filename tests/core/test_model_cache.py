"""ModelCache score plugin and the load-time model (core.models, core.plugins.model_cache)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kallot.config import presets
from kallot.core import frag, policies
from kallot.core.errors import ConfigError
from kallot.core.framework.runner import Framework
from kallot.core.models import GB, LoadModel, ModelCache, ModelRef, Tier, parse_model
from kallot.core.plugins.model_cache import ModelCacheScore
from kallot.core.scheduler import Scheduler
from kallot.core.snapshot import Allocation, GpuSpec, NodeSpec, Snapshot, SnapshotBuilder
from kallot.core.workload import DeviceRequest, Task

LLAMA = ModelRef("meta-llama/Llama-2-13b-hf", "abc123", 26 * GB)


def node(name: str, gpus: int = 8, used: int = 0, cache: ModelCache | None = None) -> NodeSpec:
    return NodeSpec(
        name=name,
        cpu_milli=64000,
        mem_mib=512 * 1024,
        gpus=[
            GpuSpec(model="H100-80GB", mem_mib=81920, used_milli=1000 if g < used else 0)
            for g in range(gpus)
        ],
        model_cache=cache,
    )


def place(
    snapshot: Snapshot, tasks: list[Task], profile: str = "kallot", seed: int = 0
) -> list[tuple[str, str]]:
    framework = Framework(presets.profile(profile), policies.builtin_registry())
    rng = np.random.default_rng(seed)
    decision = Scheduler(framework, explain=False).run_session(snapshot, tasks, now=0.0, rng=rng)
    return [(p.task_id, snapshot.node_names[p.node_row]) for p in decision.placements]


def server(i: int = 0, gpus: int = 1, model: ModelRef | None = LLAMA) -> Task:
    return Task(
        id=f"t{i}", cpu_milli=1000, mem_mib=1024, gpu=DeviceRequest(count=gpus), model=model
    )


def test_load_model_states_its_arithmetic() -> None:
    load = LoadModel(startup_s=10, remote_bytes_per_s=1 * GB, disk_bytes_per_s=2 * GB)
    assert load.load_s(26 * GB, Tier.REMOTE) == pytest.approx(36.0)
    assert load.load_s(26 * GB, Tier.DISK) == pytest.approx(23.0)
    assert load.load_s(26 * GB, Tier.DISK, 13 * GB) == pytest.approx(12.0)  # measured wins
    cache = ModelCache.of(disk=["meta-llama/Llama-2-13b-hf@abc123"], read_bytes_per_s=13 * GB)
    assert load.saved_s(LLAMA, cache) == pytest.approx(24.0)
    other_rev = dataclasses.replace(LLAMA, revision="def456")
    assert load.saved_s(other_rev, cache) == 0.0
    any_rev = dataclasses.replace(LLAMA, revision="")
    assert cache.tier(any_rev) is Tier.DISK


def test_parse_model() -> None:
    assert parse_model("Qwen/Qwen2-7B@main") == ("Qwen/Qwen2-7B", "main")
    assert parse_model("gpt2") == ("gpt2", "")
    assert parse_model("a/b/c@x") is None
    assert parse_model("org/na me") is None
    with pytest.raises(ValueError, match="ORG/NAME@REV"):
        ModelRef("bad name")


def test_cached_node_wins_and_plain_tasks_are_untouched() -> None:
    cache = ModelCache.of(disk=[LLAMA.key])
    snap = SnapshotBuilder().extend([node("a"), node("b", cache=cache), node("c")]).build()
    for seed in range(5):
        assert place(snap, [server()], seed=seed) == [("t0", "b")]
    # without the model the plugin scores 0 everywhere: same decision as the profile without it
    plain = [server(i, model=None) for i in range(6)]
    blind = dataclasses.replace(
        presets.PROFILES["kallot"],
        score=tuple(s for s in presets.PROFILES["kallot"].score if s[0] != "ModelCache"),
    )
    framework = Framework(blind, policies.builtin_registry())
    got = Scheduler(framework, explain=False).run_session(
        snap, plain, now=0.0, rng=np.random.default_rng(3)
    )
    assert place(snap, plain, seed=3) == [
        (p.task_id, snap.node_names[p.node_row]) for p in got.placements
    ]


def test_running_replica_counts_as_host_memory() -> None:
    cold = ModelCache.of(read_bytes_per_s=2 * GB)
    warm_disk = ModelCache.of(disk=[LLAMA.key], read_bytes_per_s=2 * GB)
    replica = server(9, model=LLAMA)
    snap = (
        SnapshotBuilder()
        .extend([node("a", cache=warm_disk), node("b", used=1, cache=cold)])
        .running([Allocation(task=replica, node_row=1)])
        .build()
    )
    plugin = ModelCacheScore()
    saved = plugin.saved(_cycle(snap), LLAMA)
    load = LoadModel()
    assert saved[1] == pytest.approx(
        load.load_s(LLAMA.size_bytes, Tier.REMOTE) - load.load_s(LLAMA.size_bytes, Tier.MEMORY)
    )
    assert saved[1] > saved[0] > 0


def test_score_differences_are_seconds_weighed_per_gpu() -> None:
    # memory, disk and remote copies of a 4 GB model: each second more to load costs 1 point
    # per GPU; a tensor-parallel server on 8 GPUs pays 8 per second.
    model = ModelRef("org/small", "r", 4 * GB)
    key = model.key
    caches = [ModelCache.of(memory=[key]), ModelCache.of(disk=[key], read_bytes_per_s=2 * GB), None]
    snap = SnapshotBuilder().extend([node(f"n{i}", cache=c) for i, c in enumerate(caches)]).build()
    plugin = ModelCacheScore()
    one = plugin.score(_cycle(snap), server(model=model), np.array([0, 1, 2]))
    assert one is not None
    load = LoadModel()
    disk_extra = load.load_s(4 * GB, Tier.DISK, 2 * GB) - load.load_s(4 * GB, Tier.MEMORY)
    remote_extra = load.load_s(4 * GB, Tier.REMOTE) - load.load_s(4 * GB, Tier.MEMORY)
    assert one.tolist() == pytest.approx([100.0, 100.0 - disk_extra, 100.0 - remote_extra])
    eight = plugin.score(_cycle(snap), server(gpus=8, model=model), np.array([0, 1, 2]))
    assert eight is not None
    assert eight.tolist() == pytest.approx([100.0, 100.0 - 8 * disk_extra, 0.0])
    # relative to the best candidate: without the memory node, the disk node is the best
    two = plugin.score(_cycle(snap), server(model=model), np.array([1, 2]))
    assert two is not None
    assert two.tolist() == pytest.approx([100.0, 100.0 - (remote_extra - disk_extra)])
    # nobody holds it: no preference
    alone = plugin.score(_cycle(snap), server(model=model), np.array([2]))
    assert alone is not None
    assert alone.tolist() == [100.0]


def test_a_big_model_still_tells_memory_from_disk() -> None:
    big = ModelRef("org/big", "r", 140 * GB)
    caches = [ModelCache.of(disk=[big.key]), ModelCache.of(memory=[big.key])]
    snap = (
        SnapshotBuilder().extend([node("a", cache=caches[0]), node("b", cache=caches[1])]).build()
    )
    scores = ModelCacheScore().score(_cycle(snap), server(gpus=2, model=big), np.array([0, 1]))
    assert scores is not None
    assert scores[1] == 100.0 and 0 <= scores[0] < 100.0
    for seed in range(4):
        assert place(snap, [server(gpus=2, model=big)], seed=seed) == [("t0", "b")]


def test_fragmentation_can_outweigh_a_small_saving() -> None:
    # The target workload is 8-GPU servers: 4 GPUs on the idle node "b" strand the other 4, on
    # the half-used node "a" they strand nothing. A tiny model saves ~1 GPU-second there, so
    # kallot's fragmentation term decides; a 140 GB model saves ~100 s and wins the idle node.
    target = frag.TargetWorkload.of([(frag.Shape(1000, 1000, 8), 1.0)])
    prof = presets.profile("kallot", target=target)

    def placed(model: ModelRef) -> list[tuple[str, str]]:
        cache = ModelCache.of(disk=[model.key])
        snap = SnapshotBuilder().extend([node("a", used=4), node("b", cache=cache)]).build()
        framework = Framework(prof, policies.builtin_registry())
        decision = Scheduler(framework, explain=False).run_session(
            snap, [server(gpus=4, model=model)], now=0.0, rng=np.random.default_rng(0)
        )
        return [(p.task_id, snap.node_names[p.node_row]) for p in decision.placements]

    assert placed(ModelRef("org/tiny", "r", 100 * 10**6)) == [("t0", "a")]
    assert placed(ModelRef("org/big", "r", 140 * GB)) == [("t0", "b")]


def test_args_are_checked() -> None:
    assert isinstance(ModelCacheScore.from_args({"seconds_per_point": 2}), ModelCacheScore)
    with pytest.raises(ConfigError, match=r"ModelCache args\.seconds_per_point"):
        ModelCacheScore.from_args({"seconds_per_point": 0})
    with pytest.raises(ConfigError, match="ModelCache args"):
        ModelCacheScore.from_args({"weight": 1})


def _cycle(snap: Snapshot):  # type: ignore[no-untyped-def]
    from kallot.core.framework.cycle import Cycle
    from kallot.core.snapshot import Scratch

    return Cycle(snap, Scratch.of(snap), np.random.default_rng(0), np.arange(snap.n_nodes))


@st.composite
def cluster_st(draw):  # type: ignore[no-untyped-def]
    n = draw(st.integers(2, 6))
    nodes = []
    for i in range(n):
        cached = draw(st.sampled_from(["none", "disk", "memory"]))
        cache = ModelCache.of(
            disk=[LLAMA.key] if cached == "disk" else [],
            memory=[LLAMA.key] if cached == "memory" else [],
            read_bytes_per_s=draw(st.sampled_from([0.0, 0.5 * GB, 3 * GB])),
        )
        nodes.append(
            node(f"n{i}", gpus=draw(st.integers(1, 8)), used=draw(st.integers(0, 8)), cache=cache)
        )
    return nodes


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    nodes=cluster_st(),
    gpus=st.integers(1, 8),
    seed=st.integers(0, 3),
)
def test_property_never_changes_feasibility(nodes: list[NodeSpec], gpus: int, seed: int) -> None:
    snap = SnapshotBuilder().extend(nodes).build()
    task = server(gpus=gpus)
    with_plugin = Framework(presets.profile("kallot"), policies.builtin_registry())
    cycle = _cycle(snap)
    feasible = with_plugin.feasible(cycle, task)
    plain = with_plugin.feasible(_cycle(snap), dataclasses.replace(task, model=None))
    assert feasible.tolist() == plain.tolist()
    scores = ModelCacheScore().score(cycle, task, feasible)
    assert scores is not None
    assert np.all((scores >= 0) & (scores <= 100))
    placed = place(snap, [task], seed=seed)
    assert bool(placed) == bool(feasible.size)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(2, 6), cached=st.data(), gpus=st.integers(1, 8), seed=st.integers(0, 50))
def test_property_equal_nodes_cached_one_wins(
    n: int, cached: st.DataObject, gpus: int, seed: int
) -> None:
    which = cached.draw(st.integers(0, n - 1))
    nodes = [
        node(f"n{i}", cache=ModelCache.of(disk=[LLAMA.key] if i == which else [])) for i in range(n)
    ]
    snap = SnapshotBuilder().extend(nodes).build()
    assert place(snap, [server(gpus=gpus)], seed=seed) == [("t0", f"n{which}")]


def test_unknown_size_takes_the_size_nodes_measured() -> None:
    sized = ModelCache.of(disk=[LLAMA.key], sizes={LLAMA.key: LLAMA.size_bytes})
    snap = SnapshotBuilder().extend([node("a"), node("b", cache=sized)]).build()
    plugin = ModelCacheScore()
    unsized = dataclasses.replace(LLAMA, size_bytes=0)
    got = plugin.saved(_cycle(snap), unsized)
    want = plugin.saved(_cycle(snap), LLAMA)
    assert got.tolist() == want.tolist() and got[1] > 0
    # nobody measured it: start-up only, no seconds saved anywhere, no preference
    bare = (
        SnapshotBuilder()
        .extend([node("a"), node("b", cache=ModelCache.of(disk=[LLAMA.key]))])
        .build()
    )
    assert plugin.saved(_cycle(bare), unsized).tolist() == [0.0, 0.0]
