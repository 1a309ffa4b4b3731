"""kube.autoscale.consolidate without a cluster: the eviction budget over a sliding minute, and which pods
a PodDisruptionBudget with no disruption left shields."""

from __future__ import annotations

from typing import Any

from kallot.config import presets
from kallot.core import policies
from kallot.core.framework.runner import Framework
from kallot.core.provision.consolidate import ConsolidationConfig
from kallot.kube.autoscale.consolidate import Consolidator, pdb_blocked
from kallot.kube.state.cache import Cache


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _pod(name: str, labels: dict[str, str], ns: str = "ns") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns, "uid": f"u-{name}", "labels": labels}}


def _pdb(allowed: int, labels: dict[str, str], ns: str = "ns") -> dict[str, Any]:
    return {
        "metadata": {"name": "b", "namespace": ns},
        "spec": {"selector": {"matchLabels": labels}},
        "status": {"disruptionsAllowed": allowed},
    }


def test_budget_is_evictions_per_minute_over_a_sliding_window() -> None:
    clock = Clock()
    fw = Framework(presets.PROFILES["kallot"], policies.builtin_registry())
    c = Consolidator(
        None,  # type: ignore[arg-type] # budget() reads no API
        Cache(),
        fw,
        ConsolidationConfig(enabled=True, evictions_per_minute=2),
        None,  # type: ignore[arg-type]
        clock=clock,
    )
    assert c.budget() == 2
    c.recent.append(clock.t)
    clock.t += 30
    c.recent.append(clock.t)
    assert c.budget() == 0
    clock.t += 30  # the first eviction is a minute old now
    assert c.budget() == 1
    clock.t += 30
    assert c.budget() == 2


def test_a_closed_budget_shields_the_pods_it_selects_in_its_namespace() -> None:
    pods = [
        _pod("a", {"app": "x"}),
        _pod("b", {"app": "y"}),
        _pod("c", {"app": "x"}, ns="other"),
    ]
    assert pdb_blocked([_pdb(0, {"app": "x"})], pods) == {"u-a"}
    assert pdb_blocked([_pdb(1, {"app": "x"})], pods) == set()  # a disruption left
    assert pdb_blocked([], pods) == set()
