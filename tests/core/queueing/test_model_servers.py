"""Preemption never takes a loading model server, nor the last replica of a model
(core.queueing.model_servers through victims.units)."""

from __future__ import annotations

from kallot.core.models import GB, LoadModel, ModelRef, Tier
from kallot.core.queueing import model_servers, victims
from kallot.core.snapshot import Allocation
from kallot.core.workload import DeviceRequest, Task

LLAMA = ModelRef("org/llama", "r1", 140 * GB)
LOAD_S = LoadModel().load_s(LLAMA.size_bytes, Tier.REMOTE)  # 575 s


def alloc(name: str, started: float, model: ModelRef | None = LLAMA) -> Allocation:
    task = Task(id=name, gpu=DeviceRequest(count=1), model=model)
    return Allocation(task=task, node_row=0, started=started)


def candidates(running: list[Allocation], now: float) -> list[str]:
    return sorted(u.name for u in victims.units(running, {}, now, lambda m: True))


def test_loading_replicas_and_the_oldest_are_protected() -> None:
    now = 10_000.0
    running = [
        alloc("old", now - 5000),  # ready long ago: the model's last replica if the others go
        alloc("mid", now - 2000),
        alloc("young", now - 60),  # still loading
        alloc("plain", now - 60, model=None),
    ]
    assert model_servers.protected(running, now) == {"old", "young"}
    assert candidates(running, now) == ["mid", "plain"]
    # once loaded, the young one may go; the oldest never
    later = now + LOAD_S
    assert candidates(running, later) == ["mid", "plain", "young"]


def test_one_replica_always_stays() -> None:
    now = 10_000.0
    running = [alloc("a", now - 5000), alloc("b", now - 4000)]
    assert candidates(running, now) == ["b"]
    # evicted in this session: the caller drops it from running, and "a" stays protected
    assert candidates([running[0]], now) == []
    other = alloc("m2", now - 5000, model=ModelRef("org/other", "", 1 * GB))
    assert candidates([*running, other], now) == ["b"]  # per model


def test_unknown_size_protects_for_the_start_up_only() -> None:
    now = 10_000.0
    unsized = ModelRef("org/x")
    running = [alloc("a", now - 5000, unsized), alloc("b", now - 10, unsized)]
    assert model_servers.protected(running, now) == {"a", "b"}
    assert model_servers.protected(running, now + LoadModel().startup_s) == {"a"}
