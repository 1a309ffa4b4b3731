"""Golden run: a small slice of the bundled trace, the expected decisions stored as JSON.

Any change in what the core decides shows up as a diff of ``openb_small.json``. When a change
is intended, regenerate with ``KALLOT_UPDATE_GOLDEN=1 pytest tests/golden`` and review the diff.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from kallot.config import presets
from kallot.core import policies
from kallot.core.framework.runner import Framework
from kallot.core.scheduler import Scheduler
from kallot.sim import openb, trace

GOLDEN = Path(__file__).with_name("openb_small.json")
POLICIES = ("kallot", "fgd", "bestfit", "packing", "clustering", "dotprod", "random")


def decisions() -> dict[str, list[list[object]]]:
    nodes = [n for n in trace.read_nodes(trace.bundled(trace.BUNDLED_NODES)) if n.gpus > 0][::97]
    pods = trace.read_pods(trace.bundled(trace.BUNDLED_DEFAULT))[::120]
    snapshot = openb.snapshot_of(nodes)
    target = openb.target_workload(pods)
    out: dict[str, list[list[object]]] = {}
    for policy in POLICIES:
        rng = np.random.default_rng(42)
        order = openb.arrival_order(pods, 1000 * sum(n.gpus for n in nodes), rng)
        tasks = [openb.task_of(p, i) for i, p in enumerate(order)]
        framework = Framework(presets.profile(policy, target=target), policies.builtin_registry())
        decision = Scheduler(framework, explain=False).run_session(
            snapshot, tasks, now=0.0, rng=rng
        )
        out[policy] = [
            [p.task_id, p.node, [[d.slot, d.milli] for d in p.devices]] for p in decision.placements
        ]
    return out


def test_decisions_match_golden() -> None:
    got = decisions()
    if os.environ.get("KALLOT_UPDATE_GOLDEN"):
        GOLDEN.write_text(json.dumps(got, indent=1) + "\n")
    want = json.loads(GOLDEN.read_text())
    for policy in POLICIES:
        assert got[policy] == want[policy], f"{policy}: decisions changed (see module docstring)"
