"""The binding cycle's one undo path (kube.bind.binder with kube.bind.steps): a failure injected
at every step position undoes each step before it (newest first, and the failing step's own
partial writes), never reaches the Bind, and leaves the pod pending with the reason; a cycle
that binds undoes nothing. The cache and the Binder are the real ones; the steps record what
they did in one shared world, and the API takes only the Bind."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import pytest

from kallot.cli.scheduler import build_scheduler
from kallot.kube.bind.binder import Binder
from kallot.kube.bind.steps import BindCycle, PreBindStep
from kallot.kube.state.cache import Cache, PodState
from kallot.testing.live import inventory_node_body, pod_body

_, CORE = build_scheduler("kallot")
STEPS = 4


class Api:
    def __init__(self) -> None:
        self.bound: list[str] = []

    async def bind(
        self, namespace: str, name: str, *, uid: str, node: str, annotations: Mapping[str, str]
    ) -> None:
        del namespace, name, node, annotations
        self.bound.append(uid)


class Recording:
    """Writes ``written[name]`` (half of it before failing, when it is the one that fails)
    and takes back exactly what it wrote."""

    name: ClassVar[str] = "Recording"

    def __init__(self, index: int, world: dict[str, Any], fail: bool) -> None:
        self.index = index
        self.world = world
        self.fail = fail

    async def pre_bind(self, cycle: BindCycle) -> str:
        self.world["written"].add(self.index)
        cycle.wrote[f"step{self.index}"] = True
        return f"step {self.index} injected failure" if self.fail else ""

    async def undo(self, cycle: BindCycle) -> None:
        if cycle.wrote.pop(f"step{self.index}", False):
            self.world["written"].discard(self.index)
            self.world["undone"].append(self.index)

    def bound(self, cycle: BindCycle) -> None:
        self.world["kept"].append(self.index)


def _assumed(cache: Cache) -> Any:
    cache.apply_node("ADDED", inventory_node_body("n0", 4))
    body = pod_body("p1", resources={"nvidia.com/gpu": "1"})
    body["metadata"].update(uid="u1", namespace="ns", resourceVersion="1")
    body["spec"]["containers"][0]["resources"]["requests"] = dict(
        body["spec"]["containers"][0]["resources"]["limits"]
    )
    cache.apply_pod("ADDED", copy.deepcopy(body))
    inp = cache.session_input()
    decision = CORE.run_session(
        inp.snapshot, list(inp.tasks), now=0.0, rng=np.random.default_rng(0), jobs=inp.jobs
    )
    [placement] = decision.placements
    assert cache.assume(placement) is not None
    return placement


async def _cycle(fail_at: int) -> tuple[dict[str, Any], Api, Cache, list[str]]:
    cache = Cache()
    api = Api()
    world: dict[str, Any] = {"written": set(), "undone": [], "kept": []}
    steps: list[PreBindStep] = [Recording(i, world, i == fail_at) for i in range(STEPS)]
    failed: list[str] = []
    binder = Binder(
        api,  # type: ignore[arg-type]
        cache,
        steps=steps,
        on_failed=lambda uid, why: failed.append(why),
    )
    binder.start()
    binder.submit(_assumed(cache), "ns", "p1")
    assert await binder.drain(10.0)
    await binder.stop()
    return world, api, cache, failed


@pytest.mark.parametrize("fail_at", range(STEPS))
def test_a_failing_step_undoes_every_earlier_step_newest_first(fail_at: int) -> None:
    world, api, cache, failed = asyncio.run(_cycle(fail_at))
    assert not world["written"]  # nothing left behind
    assert world["undone"] == list(range(fail_at, -1, -1))  # itself, then the earlier ones
    assert not world["kept"]
    assert not api.bound  # the Bind never ran
    entry = cache.pod("u1")
    assert entry is not None and entry.state is PodState.PENDING
    assert failed == [f"binding to n0 failed: step {fail_at} injected failure"]


def test_a_bound_cycle_keeps_what_every_step_wrote() -> None:
    world, api, cache, failed = asyncio.run(_cycle(-1))
    assert world["written"] == set(range(STEPS)) and not world["undone"]
    assert world["kept"] == list(range(STEPS))
    assert api.bound == ["u1"] and not failed
    entry = cache.pod("u1")
    assert entry is not None and entry.state is PodState.ASSUMED  # until the watch confirms
