"""Live MIG re-layout, property-tested against brute force (issue 21 point 7).

The planner (``core.mig.relayout``: the scheduler's choice of a new layout for one GPU) is checked
against an oracle that enumerates every valid layout of the GPU model (a depth-first search over
all (profile, start) placements, independent of ``core.mig.placements``): whenever some valid
layout keeps every allocated instance and holds a new instance of the pending profile, the
planner finds one, and what it finds is valid and keeps every allocated instance unchanged.

The fake backend (``node.fake.FakeBackend``) stands for NVML: its create refuses exactly what the
MIG rules refuse, and carrying out the planner's steps on it (destroy, then create, one call at a
time, as ``node.migapply`` does) is never refused and ends at the planned layout, also when the
run is cut short and started again from the layout read back (an agent killed mid-apply).
"""

from __future__ import annotations

import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kallot.core import mig
from kallot.core.errors import KallotError
from kallot.node.fake import FakeBackend, InventoryFile

PRODUCTS = {
    "A100-40GB": ("NVIDIA A100-SXM4-40GB", 40960),
    "A100-80GB": ("NVIDIA A100-SXM4-80GB", 81920),
    "H100-80GB": ("NVIDIA H100 80GB HBM3", 81559),
    "H200-141GB": ("NVIDIA H200", 143771),
}


@functools.cache
def all_layouts(model: str) -> tuple[frozenset[mig.Instance], ...]:
    """Every valid layout of one ``model`` GPU (A100/H100/H200: 2,319 each)."""
    cands = [(p.name, s) for p in mig.PROFILES[model] for s in p.starts]
    out: list[frozenset[mig.Instance]] = []

    def dfs(i: int, cur: list[mig.Instance]) -> None:
        if i == len(cands):
            out.append(frozenset(cur))
            return
        dfs(i + 1, cur)
        nxt = [*cur, cands[i]]
        if not mig.valid_layout(model, nxt):
            dfs(i + 1, nxt)

    dfs(0, [])
    return tuple(out)


def oracle(model: str, used: set[mig.Instance], name: str) -> bool:
    """Some valid layout keeps ``used`` and has a new ``name`` instance."""
    return any(
        used <= layout and any(n == name and (n, s) not in used for n, s in layout)
        for layout in all_layouts(model)
    )


@st.composite
def gpus(draw: st.DrawFn) -> tuple[str, list[tuple[str, int, bool]], str]:
    """A model, a random valid layout with random instances in use, a profile to admit."""
    model = draw(st.sampled_from(sorted(mig.PROFILES)))
    table = mig.PROFILES[model]
    layout: list[mig.Instance] = []
    for _ in range(draw(st.integers(0, 10))):
        p = draw(st.sampled_from(table))
        s = draw(st.sampled_from(p.starts))
        if not mig.valid_layout(model, [*layout, (p.name, s)]):
            layout.append((p.name, s))
    used = draw(st.lists(st.booleans(), min_size=len(layout), max_size=len(layout)))
    name = draw(st.sampled_from([p.name for p in table]))
    return model, [(n, s, u) for (n, s), u in zip(layout, used, strict=True)], name


def fake_gpu(model: str, layout: list[mig.Instance]) -> FakeBackend:
    product, mib = PRODUCTS[model]
    spec = InventoryFile.model_validate(
        {
            "gpus": [
                {
                    "uuid": "GPU-prop-0",
                    "name": product,
                    "memoryMiB": mib,
                    "migEnabled": True,
                    "mig": [{"name": n, "start": s, "uuid": f"MIG-prop-{s}"} for n, s in layout],
                }
            ]
        }
    )
    return FakeBackend(spec)


def carry_out(fake: FakeBackend, target: tuple[mig.Instance, ...], limit: int = 99) -> int:
    """Steps from the fake's layout (read back) to ``target``, at most ``limit``; how many."""
    destroy, create = mig.layout_steps(fake.mig_layout(0), target)
    done = 0
    for _, start in destroy:
        if done == limit:
            return done
        fake.destroy_mig(0, start)
        done += 1
    for name, start in create:
        if done == limit:
            return done
        fake.create_mig(0, name, start)
        done += 1
    return done


@settings(max_examples=300, deadline=None)
@given(gpus(), st.integers(0, 6))
def test_relayout_is_valid_keeps_used_and_fits_whenever_the_oracle_says_so(
    gpu: tuple[str, list[tuple[str, int, bool]], str], cut: int
) -> None:
    model, instances, name = gpu
    used = {(n, s) for n, s, u in instances if u}
    target = mig.relayout(model, instances, name)
    assert (target is not None) == oracle(model, used, name), (instances, name, target)
    if target is None:
        return
    assert mig.valid_layout(model, target) == ""
    assert used <= set(target)  # every allocated instance kept, at the same start
    assert any(n == name and (n, s) not in used for n, s in target)
    assert len(set(target)) == len(target)
    # The fake (NVML's rules) accepts every step; cut short and resumed, it ends at the target.
    fake = fake_gpu(model, [(n, s) for n, s, _ in instances])
    carry_out(fake, target, limit=cut)
    carry_out(fake, target)
    assert sorted(fake.mig_layout(0)) == sorted(target)
    creates = [c for c in fake.mig_calls if c[0] == "create"]
    assert len(creates) == len(set(target) - {(n, s) for n, s, _ in instances})  # none twice


@settings(max_examples=200, deadline=None)
@given(gpus())
def test_the_schedulers_plan_as_written_on_the_node_agrees_with_the_oracle(
    gpu: tuple[str, list[tuple[str, int, bool]], str],
) -> None:
    # The live path: MigFit on a snapshot whose GPU is reconfigurable (as the inventory's
    # migReconfigurable makes it), then kube.schedule.migplan's target (core.mig.changed_layout).
    from kallot.core.plugins.mig_fit import best_on_gpu
    from kallot.core.resources import GPU_MODELS, SharingMode
    from kallot.core.snapshot import GpuSpec, NodeSpec, Scratch, SnapshotBuilder

    model, instances, name = gpu
    used = {(n, s) for n, s, u in instances if u}
    builder = SnapshotBuilder()
    spec = GpuSpec(
        model=model,
        mem_mib=GPU_MODELS[model].memory_mib,
        uuid="GPU-0",
        mode=SharingMode.MIG,
        mig=instances,
        mig_dynamic=True,
    )
    builder.extend([NodeSpec(name="n", cpu_milli=8000, mem_mib=1 << 16, gpus=[spec])])
    snapshot = builder.build()
    choice = best_on_gpu(snapshot, Scratch.of(snapshot), 0, 0, model=model, profile=name)
    assert (choice is not None) == oracle(model, used, name), (instances, name, choice)
    if choice is None:
        return
    current = [(n, s) for n, s, _ in instances]
    rec = choice.reconfiguration
    if rec is None:  # an idle instance of the profile: no re-layout
        assert (name, choice.instance.start) in set(current) - used
        return
    target = mig.changed_layout(
        current,
        [(d.profile, d.start) for d in rec.destroy],
        [(c.profile, c.start) for c in rec.create],
    )
    assert target is not None
    assert mig.valid_layout(model, target) == ""
    assert used <= set(target)
    assert (choice.instance.profile, choice.instance.start) in set(target) - set(current)
    assert not used & {(d.profile, d.start) for d in rec.destroy}


@settings(max_examples=300, deadline=None)
@given(gpus(), st.data())
def test_fake_create_refuses_exactly_what_the_mig_rules_refuse(
    gpu: tuple[str, list[tuple[str, int, bool]], str], data: st.DataObject
) -> None:
    model, instances, _ = gpu
    layout = [(n, s) for n, s, _ in instances]
    fake = fake_gpu(model, layout)
    p = data.draw(st.sampled_from(mig.PROFILES[model]))
    start = data.draw(st.sampled_from(p.starts))
    broken = mig.valid_layout(model, [*layout, (p.name, start)])
    if broken:
        with pytest.raises(KallotError, match="NVML_ERROR_INSUFFICIENT_RESOURCES"):
            fake.create_mig(0, p.name, start)
        assert sorted(fake.mig_layout(0)) == sorted(layout)
    else:
        fake.create_mig(0, p.name, start)
        assert sorted(fake.mig_layout(0)) == sorted([*layout, (p.name, start)])


def test_fake_destroys_any_idle_instance_but_not_one_a_process_runs_on() -> None:
    fake = fake_gpu("A100-80GB", [("3g.40gb", 0), ("1g.10gb", 4), ("1g.10gb", 5)])
    fake.destroy_mig(0, 4)  # an instance from the file, not one create_mig made
    assert sorted(fake.mig_layout(0)) == [("1g.10gb", 5), ("3g.40gb", 0)]
    fake.destroy_mig(0, 4)  # idempotent, as nvml_mig.NvmlMig
    from kallot.node.discovery import GpuProcess

    fake.set_processes([GpuProcess(uuid="MIG-prop-0", pid=7, used_memory_bytes=1 << 30)])
    with pytest.raises(KallotError, match="NVML_ERROR_IN_USE"):
        fake.destroy_mig(0, 0)
    assert ("3g.40gb", 0) in fake.mig_layout(0)
    # The layout read back through raw(), as discovery reads it.
    (g,) = fake.raw().gpus
    assert sorted((m.name, m.start) for m in g.mig) == [("1g.10gb", 5), ("3g.40gb", 0)]


def test_gpu_check_dry_run_prints_the_steps_and_keeps_busy_instances() -> None:
    # scripts/gpu-check.sh runs this on NVML's view; here the fake backend's, same RawNode.
    from kallot.node.nvml_mig import relayout_dry_run

    fake = fake_gpu("H100-80GB", [("1g.10gb", s) for s in range(7)])
    lines = relayout_dry_run(fake.raw(), busy={"MIG-prop-0"})
    assert lines[0].startswith("GPU 0 H100-80GB: 1g.10gb@0 (busy), 1g.10gb@1, ")
    by_profile = {ln.split(":")[0].strip(): ln.split(":", 1)[1].strip() for ln in lines[1:]}
    assert by_profile["+3g.40gb"] == (
        "destroy 1g.10gb@4; destroy 1g.10gb@5; destroy 1g.10gb@6; create 3g.40gb@4"
    )
    assert by_profile["+7g.80gb"] == "no layout keeps the busy instances and admits it"
    assert fake.mig_calls == []  # read-only
